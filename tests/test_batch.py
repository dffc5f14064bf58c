"""Batched rounds: many queries per target forward, each exact as if it ran alone.

The batched cache's logits equal the single-query cache's; every sequence of a batch equals its
own plain greedy decoding over architectures, batch sizes, prompt lengths, drafter kinds and
policies (a mismatch is tolerated only at a near-tie of the target's two best logits, < 1e-4, and
the test checks that this is the reason); sampled sequences follow the target's distribution.
"""

from __future__ import annotations

import json
import random
import signal
from typing import Any

import numpy as np
import pytest
import torch
from conftest import batch_round
from test_lossless_sampling import DRAFTERS, DRAWS, NEW, PROMPT, _model, chi_square_p, exact_joint
from test_whitebox import TREES, heads_dir, llama  # noqa: F401 (fixtures)

from draftwise import Generator
from draftwise.drafters import build_drafters, load_head_drafter
from draftwise.errors import DraftwiseError
from draftwise.models.batched_lm import BatchedLM
from draftwise.models.cached_lm import CachedLM
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.verify.chain import Sampling

TIE = 1e-4  # batching changes float rounding: only a near-tie of the top two logits may flip


def _load(tiny_models, name: str):
    return load_causal_lm(str(tiny_models[name]), LoadOptions())


def _generator(tiny_models, target: str, specs: list[str], policy: str, **kwargs) -> Generator:
    model, tokenizer = _load(tiny_models, target)
    options = LoadOptions()
    pool = build_drafters([str(tiny_models[s]) if s in tiny_models else s for s in specs], model, tokenizer, options)
    return Generator(model, tokenizer, pool, policy=policy, **kwargs)


@torch.inference_mode()
def _plain_greedy(model, prompt: list[int], max_new: int, eos: frozenset[int]) -> tuple[list[int], list[float]]:
    """Greedy decoding one token at a time, with the gap between the two best logits at each step."""
    cache = CachedLM(model)
    tokens, gaps = list(prompt), []
    for _ in range(max_new):
        logits = cache.logits(tokens, 1)[0]
        top = logits.topk(2).values
        gaps.append(float(top[0] - top[1]))
        tokens.append(int(logits.argmax()))
        if tokens[-1] in eos:
            break
    return tokens[len(prompt):], gaps


def assert_exact(model, prompt: list[int], got: list[int], max_new: int, eos: frozenset[int], where: str) -> None:
    """``got`` equals plain greedy decoding, or first differs where the target's top two logits tie."""
    want, gaps = _plain_greedy(model, prompt, max_new, eos)
    if got == want:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert first < len(gaps) and gaps[first] < TIE, (
        f"{where}: differs from plain greedy at token {first} (top-2 gap {gaps[first] if first < len(gaps) else None})")


# -- the batched cache ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama-target", "gpt2-target"])
def test_batched_cache_gives_each_row_its_own_logits(tiny_models, arch) -> None:
    model, _ = _load(tiny_models, arch)
    vocab = model.config.vocab_size
    rng = random.Random(arch)
    batch = BatchedLM(model)
    rows = [batch.add_row() for _ in range(4)]
    refs = [CachedLM(model) for _ in rows]
    seqs = [[rng.randrange(vocab) for _ in range(rng.randrange(2, 20))] for _ in rows]
    for row, ref, seq in zip(rows, refs, seqs):
        assert torch.allclose(row.logits(seq, 2), ref.logits(seq, 2), atol=1e-4)
    for step in range(24):
        if step == 10:  # a query leaves from the middle: the last row moves into its place
            batch.drop_row(rows[1])
            del rows[1], refs[1], seqs[1]
        if step == 14:  # one joins
            rows.append(batch.add_row())
            refs.append(CachedLM(model))
            seqs.append([rng.randrange(vocab) for _ in range(5)])
            rows[-1].logits(seqs[-1][:-1])
            refs[-1].logits(seqs[-1][:-1])
        inputs, expected = batch_round(rng, vocab, rows, refs, seqs, tree=step % 5 == 4, max_draft=5)
        order = list(range(len(inputs)))
        rng.shuffle(order)  # results come back in the order asked, whatever the rows
        got = batch.run([inputs[i] for i in order])
        for slot, i in enumerate(order):
            assert torch.allclose(got[slot], expected[i], atol=1e-4), (arch, step, i)


# -- greedy: every sequence equals its own plain decoding ---------------------------------------------------
SETUPS = {
    # name: (target, drafters, policy, decide)
    "llama-lm-ucb": ("llama-target", ["llama-near", "llama-small"], "ucb", "query"),
    "llama-lookups-default": ("llama-target", ["pld", "suffix"], "ctx-ucb", "query"),
    "llama-mixed-hedgespec": ("llama-target", ["llama-near", "pld", "suffix"], "hedgespec", "query"),
    "llama-lengths-batch": ("llama-target", ["llama-twin"], "banditspec-length", "batch"),
    "llama-tree": ("llama-target", ["lm:model=llama-near,tree=dynamic,topk=2,budget=6", "pld"], "metasd-ucb",
                   "query"),
    "gpt2-mixed-default": ("gpt2-target", ["gpt2-near", "pld", "suffix"], "ctx-ucb", "query"),
    "gpt2-lengths-batch": ("gpt2-target", ["pld"], "banditspec-length", "batch"),
}


def _spec(tiny_models, spec: str) -> str:
    if spec in tiny_models:
        return str(tiny_models[spec])
    for name, path in tiny_models.items():
        spec = spec.replace(f"model={name},", f"model={path},")
    return spec


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_every_sequence_of_a_batch_is_its_own_greedy_decoding(tiny_models, setup: str) -> None:
    target, specs, policy, decide = SETUPS[setup]
    gen = _generator(tiny_models, target, [_spec(tiny_models, s) for s in specs], policy)
    rng = random.Random(setup)
    vocab = gen.target.vocab_size
    text_like = [rng.randrange(1, vocab) for _ in range(12)]
    accepted = 0
    for batch_size in (1, 3, 8):
        prompts = []
        for i in range(batch_size + 2):  # more prompts than rows: queries join as others leave
            length = rng.choice([1, 2, 5, 17, 40])
            if i % 2:  # repetitive prompts give the lookups something to draft
                prompts.append((text_like * 4)[:length])
            else:
                prompts.append([rng.randrange(1, vocab) for _ in range(length)])
        max_new = rng.randint(6, 30)
        ignore_eos = batch_size != 3
        results = gen.generate_batch(prompts, max_new_tokens=max_new, batch_size=batch_size, decide=decide,
                                     ignore_eos=ignore_eos)
        eos = frozenset() if ignore_eos else gen.eos_ids
        for prompt, result in zip(prompts, results):
            assert result.error is None
            assert_exact(gen.model, prompt, result.token_ids, max_new, eos, f"{setup} B={batch_size}")
            accepted += result.stats.accepted
    assert accepted > 0  # drafts were really accepted inside batches (the accept path is exercised)


def test_union_and_expected_gain_arms_alone_and_in_a_batch(tiny_models) -> None:
    """A union of lookups (one trie per round) and the expected-gain stopping rule stay exact."""
    gen = _generator(tiny_models, "llama-target", ["pld", "suffix", str(tiny_models["llama-near"])],
                     "ctx-ucb:on=pld+suffix", arms="pld|suffix@8,auto@8+gain,none")
    rng = random.Random(11)
    vocab = gen.target.vocab_size
    motif = [rng.randrange(1, vocab) for _ in range(7)]
    prompts = [(motif * 6)[: 12 + 5 * i] if i % 2 else [rng.randrange(1, vocab) for _ in range(9)] for i in range(6)]
    arms: set[str] = set()
    for prompt in prompts[:3]:
        result = gen.generate(prompt, max_new_tokens=40, ignore_eos=True)
        assert_exact(gen.model, prompt, result.token_ids, 40, frozenset(), "union alone")
        arms |= {r.arm_name.split("=")[0] for r in result.trace if r.drafted}
    for prompt, result in zip(prompts, gen.generate_batch(prompts, max_new_tokens=40, batch_size=3, ignore_eos=True)):
        assert_exact(gen.model, prompt, result.token_ids, 40, frozenset(), "union batched")
    assert "pld|suffix@8" in arms  # the union really drafted


def test_white_box_heads_in_a_batch(heads_dir, llama) -> None:  # noqa: F811
    target, _ = llama
    text = json.loads((heads_dir / "text.json").read_text())
    for head, tree in [("eagle-trained", "chain"), ("medusa", "static")]:
        drafter = load_head_drafter(str(heads_dir / head), target, tree=TREES[tree])
        gen = Generator(target, None, [drafter], policy="fixed:0", draft_len=4)
        prompts = [text[i][: 3 + i] for i in range(5)]
        results = gen.generate_batch(prompts, max_new_tokens=24, batch_size=3, ignore_eos=True)
        accepted = 0
        for prompt, result in zip(prompts, results):
            assert_exact(target, prompt, result.token_ids, 24, frozenset(), head)
            accepted += result.stats.accepted
        if head == "eagle-trained":
            assert accepted > 10  # the head's drafts are really accepted in the batch


# -- sampling ---------------------------------------------------------------------------------------------
def test_sampled_sequences_of_a_batch_follow_the_target() -> None:
    target = _model(3, 2)
    sampling = Sampling(temperature=1.0)
    pool = [DRAFTERS["lm"](), DRAFTERS["pld"](), DRAFTERS["noise"]()]
    gen = Generator(target, None, pool, policy="random", draft_len=2)
    results = gen.generate_batch([PROMPT] * DRAWS, max_new_tokens=NEW, temperature=1.0, seed=list(range(DRAWS)),
                                 ignore_eos=True, batch_size=16)
    counts = np.zeros([5] * NEW)
    for result in results:
        counts[tuple(result.token_ids)] += 1
    assert chi_square_p(counts, exact_joint(target, sampling)) > 1e-3


@pytest.mark.parametrize("arm", ["fixed:0", "fixed:1"])  # an LM drafter's chains; PLD's (drawn for the batch at once)
def test_mixed_sampling_settings_in_one_batch(tiny_models, arm: str) -> None:
    """Greedy and sampled queries share rounds; each gets what it would get alone (fixed arm)."""
    gen = _generator(tiny_models, "llama-target", [str(tiny_models["llama-near"]), "pld"], arm)
    rng = random.Random(7)
    prompts = [[rng.randrange(1, 50) for _ in range(6 + i)] for i in range(6)]
    settings = [dict(temperature=0.0), dict(temperature=0.8, seed=3), dict(temperature=1.2, top_k=5, seed=4),
                dict(temperature=0.0), dict(temperature=0.7, top_p=0.9, seed=5), dict(temperature=1.0, seed=6)]
    session = gen.batch_session(max_batch=6)
    handles = [session.add(p, max_new_tokens=20, ignore_eos=True, **s) for p, s in zip(prompts, settings)]
    session.run()
    for prompt, kw, handle in zip(prompts, settings, handles):
        alone = gen.generate(prompt, max_new_tokens=20, ignore_eos=True, **kw)
        assert handle.result is not None and handle.result.token_ids == alone.token_ids, kw
    sampled = [h.result.stats for h, kw in zip(handles, settings) if kw["temperature"] and h.result is not None]
    assert sum(stats.drafted for stats in sampled) > 0  # the sampled rows judged real drafts
    assert all(name.startswith("pld" if arm == "fixed:1" else "llama") for st in sampled for name in st.pulls)


# -- errors, cancellation, interrupts -----------------------------------------------------------------------
def test_an_over_long_prompt_fails_alone(tiny_models) -> None:
    gen = _generator(tiny_models, "llama-target", ["pld"], "ucb")
    limit = gen.max_context
    assert limit is not None
    prompts = [[5, 6, 7], [3] * (limit + 10), [8, 9]]
    results = gen.generate_batch(prompts, max_new_tokens=8, ignore_eos=True)
    assert results[1].error is not None and "exceeds the target's context" in results[1].error
    assert results[1].token_ids == []
    for i in (0, 2):
        assert results[i].error is None
        assert_exact(gen.model, prompts[i], results[i].token_ids, 8, frozenset(), "over-long neighbour")
    with pytest.raises(DraftwiseError, match="batch size"):
        gen.batch_session(max_batch=0)
    with pytest.raises(DraftwiseError, match="decide"):
        gen.batch_session(decide="sometimes")


def test_queries_that_join_together_share_their_prompts_forwards(tiny_models) -> None:
    """Prompts admitted in the same step run through the target together — one forward per group
    of similar lengths, not one each — and every row's cache is its own prompt's."""
    from draftwise.engine.batch import prefill_groups

    gen = _generator(tiny_models, "llama-target", ["pld"], "ucb")
    rng = random.Random(7)
    vocab = gen.target.vocab_size
    lengths = [21, 30, 20, 22, 31, 2, 1]  # two groups of similar lengths, a 1-token prompt and a 1-token prefill
    prompts = [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths]
    session = gen.batch_session(max_batch=8)
    handles = [session.add(p, max_new_tokens=40, ignore_eos=True) for p in prompts]
    session._admit()
    prefill_lengths = sorted(n - 1 for n in lengths if n > 1)
    assert session.engine.target.calls == len(prefill_groups(prefill_lengths)) == 3  # [1], [19-21], [29-30]
    for handle, prompt in zip(handles, prompts):
        row = handle.lane.row
        assert row.tokens == prompt[:-1] and row.length == len(prompt) - 1
    target = session.engine.target
    assert target.capacity >= max(lengths) + 40  # room for the longest prompt and its answer, made at the join
    grown, buffers = target.reserve_s, target.cache.layers[0].keys
    session.run()
    assert target.reserve_s == grown and target.cache.layers[0].keys is buffers  # no round had to grow them
    for handle, prompt in zip(handles, prompts):
        assert handle.result.error is None
        assert_exact(gen.model, prompt, handle.result.token_ids, 40, frozenset(), "joined together")
        assert handle.result.stats.rounds > 0


def test_cancel_and_interrupt_leave_the_batch_exact(tiny_models) -> None:
    gen = _generator(tiny_models, "llama-target", [str(tiny_models["llama-near"]), "pld", "suffix"], "ucb")
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 50) for _ in range(4 + i)] for i in range(5)]
    session = gen.batch_session(max_batch=4)
    handles = [session.add(p, max_new_tokens=30, ignore_eos=True) for p in prompts]
    session.step()
    session.step()
    session.cancel(handles[1])  # between rounds: the others go on
    assert handles[1].result is not None and handles[1].result.stats.stopped_by == "cancelled"
    assert 0 < len(handles[1].result.token_ids) < 30
    session.cancel(handles[4])  # still waiting: nothing generated
    assert handles[4].result is not None and handles[4].result.token_ids == []
    # an interrupt at a random point inside a round (timer signal), then the same session goes on
    fired = []

    def interrupt(*_):
        fired.append(1)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.004)
        try:
            while session.pending:
                session.step()
        except KeyboardInterrupt:
            pass
        signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old)
    session.run()
    for i in (0, 2, 3):
        result = handles[i].result
        assert result is not None and len(result.token_ids) == 30
        assert_exact(gen.model, prompts[i], result.token_ids, 30, frozenset(), f"query {i} after interrupt")
    # and the Generator itself is still exact for a single query
    alone = gen.generate(prompts[0], max_new_tokens=30, ignore_eos=True)
    assert alone.token_ids == handles[0].result.token_ids


def test_learning_carries_across_queries_of_a_batch(tiny_models) -> None:
    """With ``keep`` the shared learner absorbs every finished query's rounds."""
    gen = _generator(tiny_models, "llama-target", [str(tiny_models["llama-twin"]), "pld"], "ucb:keep=true")
    before = np.array(gen.policy.pulls, copy=True)
    results = gen.generate_batch([[1, 2, 3, 4]] * 4, max_new_tokens=12, batch_size=2, ignore_eos=True)
    rounds = sum(r.stats.rounds for r in results)
    assert gen.policy.pulls.sum() - before.sum() == pytest.approx(rounds)


def test_lane_learners_hear_what_no_speculation_would_have_earned(tiny_models) -> None:
    """Every drafted round after the first also credits ``none`` with one token for a plain row's
    share of the forward; with ``keep`` those counterfactual rounds reach the shared learner too."""
    gen = _generator(tiny_models, "llama-target", ["pld"], "ucb:keep=true,reward=throughput", arms="pld@4,none")
    results = gen.generate_batch([[1, 2, 3, 4, 1, 2, 3]] * 4, max_new_tokens=16, batch_size=3, ignore_eos=True)
    played = [r for result in results for r in result.trace]
    credited = [r for r in played if r.arm_name != "none" and r.index > 0]
    assert credited  # pld matched the repeated prompt
    none = [a.name for a in gen.arms].index("none")
    assert gen.policy.pulls[none] == pytest.approx(sum(r.arm_name == "none" for r in played) + len(credited))
    assert gen.policy.pulls.sum() == pytest.approx(len(played) + len(credited))
    assert gen.policy.sums[none] > 0  # a plain row's tokens per second, from the step-cost model


def test_the_shared_learner_hears_the_rounds_its_lanes_heard(tiny_models) -> None:
    """A query's first record is charged afterwards with its prompt's prefill (a per-query cost the
    lane's learner never heard); the replay into the shared learner must not hear it either."""
    gen = _generator(tiny_models, "llama-target", ["pld"], "ucb:keep=true,reward=throughput", arms="pld@4,none")
    session = gen.batch_session(2)
    handle = session.add([1, 2, 3, 4, 1, 2, 3] * 6, max_new_tokens=8, ignore_eos=True)
    session.step()  # the query joins the batch and plays its first round
    lane = session.engine.lanes[0]
    session.run()
    first = handle.result.trace[0]
    heard = next(r for _, _, r in lane.query.decider.history if r.index == 0 and r.arm == first.arm)
    assert heard is not first and heard.verify_s < first.verify_s  # the prefill stayed out


def _measure_draft_cost(costs: Any) -> None:
    """Steps that pin down what a draft token costs (the cap trusts nothing less)."""
    from draftwise.decision.step_costs import StepShape

    for drafted in (0, 64, 0, 128, 32, 0, 96, 16) * 4:
        costs.observe(StepShape(3, drafted, 0.002 + 1e-4 * drafted))
    assert costs.draft_cost_known


def test_the_load_cap_cuts_drafts_and_stops_them_where_nothing_pays(tiny_models) -> None:
    """Each lane's draft is cut to the length the step-cost model says pays at this load; where no
    length pays (here: a drafter assumed to accept 1 % of its tokens), no lane drafts. Exact either way."""
    gen = _generator(tiny_models, "llama-target", ["pld"], "fixed", arms="pld@8,none")
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]] * 3
    reference = gen.generate_batch(prompts, max_new_tokens=24, batch_size=3, ignore_eos=True)
    for cap, most in ((0.01, 0), (0.9, 8)):
        session = gen.batch_session(3)
        session.engine.cap_acceptance = cap
        _measure_draft_cost(session.engine.costs)
        handles = [session.add(p, max_new_tokens=24, ignore_eos=True) for p in prompts]
        session.run()
        rounds = [r for h in handles for r in h.result.trace]
        assert [h.result.token_ids for h in handles] == [r.token_ids for r in reference]
        assert max(r.drafted for r in rounds) <= most
        if most == 0:
            assert {r.arm_name for r in rounds} == {"none"}


def test_a_query_alone_in_a_batch_is_not_capped_by_the_load(tiny_models) -> None:
    """The load cap is for rows other queries wait on: a lane alone drafts as it would alone, where
    a drafter assumed to accept 1 % of its tokens stops every lane of a batch of three."""
    gen = _generator(tiny_models, "llama-target", ["pld"], "fixed", arms="pld@8,none")
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    session = gen.batch_session(3)
    session.engine.cap_acceptance = 0.01
    _measure_draft_cost(session.engine.costs)
    handle = session.add(prompt, max_new_tokens=24, ignore_eos=True)
    session.run()
    assert max(r.drafted for r in handle.result.trace) > 0
    assert handle.result.token_ids == gen.generate(prompt, max_new_tokens=24, ignore_eos=True).token_ids


def test_the_load_cap_waits_until_a_draft_token_cost_is_measured(tiny_models) -> None:
    """A fresh step-cost model knows a draft token's cost only from its prior (a CPU's guess): the cap
    lets drafts through until steps with drafts have measured it — or on a GPU, where drafts are
    nearly free, the prior's cost would stop all drafting and no step would ever correct it."""
    gen = _generator(tiny_models, "llama-target", ["pld"], "fixed", arms="pld@8,none")
    session = gen.batch_session(3)
    session.engine.cap_acceptance = 0.01  # no length pays for this drafter, by any measured cost
    handles = [session.add([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], max_new_tokens=16, ignore_eos=True) for _ in range(3)]
    session.run()
    drafted = [r.index for h in handles for r in h.result.trace if r.drafted > 0]
    assert drafted and min(drafted) == 0  # the first round drafted, where the prior's cost said no length pays
    assert gen.batch_session(2).engine.costs is session.engine.costs  # measured once per generator


def _unaffordable(engine: Any, requests: int, cap: int) -> frozenset[int]:
    """The arms no lane may play at this load with every draft capped at ``cap`` (draftwise.decision.core)."""
    from draftwise.decision.core import limits_at, model_cap

    models = model_cap(engine.costs, engine.book, requests, engine.cap_acceptance, engine.model_summary)
    return limits_at(engine.book, cap, models).blocked


def test_model_drafter_arms_are_blocked_where_their_tokens_cannot_pay(tiny_models) -> None:
    """Once a model drafter's tokens are known to cost more than any draft of theirs can earn at
    this load (here: a second each), no lane plays its arm; UCB skips it, lookups stay open. The
    cost is the generator's: its later sessions know it."""
    drafter = str(tiny_models["llama-twin"])
    gen = _generator(tiny_models, "llama-target", [drafter, "pld"], "ucb:keep=true,reward=throughput",
                     arms="llama-twin@4,pld@4,none")
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]] * 3
    session = gen.batch_session(3)
    assert session.engine.book.models == frozenset({0})
    session.engine.model_token_s.extend([1.0] * 4)
    handles = [session.add(p, max_new_tokens=16, ignore_eos=True) for p in prompts]
    session.run()
    assert all(r.arm_name != "llama-twin@4" for h in handles for r in h.result.trace)
    assert _unaffordable(session.engine, 3, cap=8) == frozenset({0})  # the lookup's arm stays open
    for prompt, handle in zip(prompts, handles):
        assert_exact(gen.model, prompt, handle.result.token_ids, 16, frozenset(), "blocked model arm")
    assert _unaffordable(gen.batch_session(3).engine, 3, cap=8) == frozenset({0})  # the cost stays with the generator
    fresh = _generator(tiny_models, "llama-target", [drafter, "pld"], "ucb:keep=true,reward=throughput",
                       arms="llama-twin@4,pld@4,none")
    free = fresh.batch_session(3)  # nothing measured yet: model arms are tried
    free_handles = [free.add(p, max_new_tokens=16, ignore_eos=True) for p in prompts]
    free.run()
    assert any(r.arm_name == "llama-twin@4" for h in free_handles for r in h.result.trace)
    rolling = _generator(tiny_models, "llama-target", [drafter, "pld"], "round-robin", arms="llama-twin@4,pld@4,none")
    blocked = rolling.batch_session(3)  # a learner that cannot skip an arm: the lane plays none instead
    blocked.engine.model_token_s.extend([1.0] * 4)
    rolled = [blocked.add(p, max_new_tokens=16, ignore_eos=True) for p in prompts]
    blocked.run()
    arms = [r.arm_name for h in rolled for r in h.result.trace]
    assert "llama-twin@4" not in arms and "pld@4" in arms and "none" in arms
    # each lane's first play routes and prefills its drafter: that spike counts (the mean), since
    # every new lane pays it again while the rows wait; the median of the plays left it out
    spiky = _generator(tiny_models, "llama-target", [drafter, "pld"], "ucb:keep=true,reward=throughput",
                       arms="llama-twin@4,pld@4,none").batch_session(1).engine
    spiky.costs.coef = (0.010, 0.001, 0.001, 0.0)  # a draft token a tenth of a step, not the machine's price
    spiky.model_token_s.extend([0.5, 1e-6, 1e-6, 1e-6])
    assert _unaffordable(spiky, 1, cap=8) == frozenset({0})
    spiky.mean_model_cost = False
    assert _unaffordable(spiky, 1, cap=8) == frozenset()


def test_one_length_for_the_batch_learns_every_shorter_length_from_each_round(tiny_models) -> None:
    """``decide="batch"`` over draft lengths: a round drafted at length k is also a side observation
    of every shorter length (the same chain cut: min(accepted, j) of j) and of ``none``; the
    learner's round count only counts rounds played, and a plain round earns 1 (plain-step units)."""
    gen = _generator(tiny_models, "llama-target", ["pld"], "banditspec-length")
    session = gen.batch_session(3, decide="batch")
    for max_new in (16, 20, 40):  # the last query ends alone
        session.add([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], max_new_tokens=max_new, ignore_eos=True)
    session.run()
    engine = session.engine
    played = engine.batch_records
    learners = engine.load_learners.learners.values()
    assert sorted(engine.load_learners.learners) == [0, 1]  # rounds of 3 rows, and the tail's of 1
    lengths = [arm.draft_len for arm in engine.arms]
    assert sum(p.t for p in learners) == len(played)
    for arm, length in enumerate(lengths):
        own = sum(r.arm == arm for r in played)
        longer = sum(lengths[r.arm] > length for r in played)
        assert sum(p.pulls[arm] for p in learners) == own + longer
    none = lengths.index(0)
    for policy in learners:
        assert 0.0 < policy.sums[none] / policy.pulls[none] <= 1.0  # 1 but for the round's drafting and bookkeeping
    assert any(r.accepted > 0 for r in played)


def test_side_observations_reach_only_learners_that_use_them() -> None:
    from draftwise.policies import make_policy
    from draftwise.trace import RoundRecord

    record = RoundRecord(index=0, arm=1, arm_name="b", max_draft=2, drafted=2, accepted=1, emitted=2, position=0,
                         verify_s=1.0)
    ucbspec = make_policy("ucbspec:reward=throughput", ["a", "b"], np.random.default_rng(0))
    assert ucbspec.side_update(0, record) == pytest.approx(2.0)
    assert ucbspec.pulls.tolist() == [1.0, 0.0] and ucbspec.t == 0
    exp3 = make_policy("exp3:reward=throughput", ["a", "b"], np.random.default_rng(0))
    state = exp3.state_dict()
    assert exp3.side_update(0, record) is None and exp3.state_dict() == state


def test_drafts_are_cut_to_the_width_that_pays_for_the_padded_batch(tiny_models) -> None:
    """Every row of a forward is padded to the longest draft: where the measured survival says no
    width pays (here: a prior of 1 % per token that no verdict can move), drafts are cut to nothing
    but in the rounds kept for measuring — and the text stays exact."""
    from draftwise.decision.step_costs import DraftSurvival

    gen = _generator(tiny_models, "llama-target", ["pld"], "fixed", arms="pld@8")
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]] * 3
    reference = gen.generate_batch(prompts, max_new_tokens=48, batch_size=3, ignore_eos=True)
    session = gen.batch_session(3)
    session.engine.survival = DraftSurvival(8, prior=0.01, weight=1e12)
    _measure_draft_cost(session.engine.costs)
    handles = [session.add(p, max_new_tokens=48, ignore_eos=True) for p in prompts]
    session.run()
    assert [h.result.token_ids for h in handles] == [r.token_ids for r in reference]
    assert session.engine.timing.width_cuts > 0
    engine = session.engine
    assert engine.timing.width_cuts == engine.cuts_due - engine.cuts_due // 8  # every 8th: measured, not cut
    drafted = [r.drafted > 0 for h in handles for r in h.result.trace]
    assert 0 < sum(drafted) <= len(drafted) / 4
    assert any(r.drafted > 0 for r in reference for r in r.trace)  # without the cut, pld drafted


def test_growing_the_kv_buffers_is_not_charged_to_a_forward(tiny_models, monkeypatch) -> None:
    """The step-cost fit sees a round's forward without the buffers' growth (a copy of every row):
    charged to that round's shape, one growth tripled the draft-token cost at B = 32 and the load cap
    then stopped all drafting."""
    import time as clock

    from draftwise.models.batched_lm import RowLayer

    grow = RowLayer.resize

    def slow_resize(self, rows, capacity):
        if self.keys is not None and capacity > self.keys.shape[2]:
            clock.sleep(0.3)  # a growth that costs far more than any tiny forward
        grow(self, rows, capacity)

    monkeypatch.setattr(RowLayer, "resize", slow_resize)
    gen = _generator(tiny_models, "llama-target", ["pld"], "ucb")
    session = gen.batch_session(max_batch=2)
    session.engine.reserve_at_join = False  # the buffers grow inside rounds, as a long tree draft may make them
    prompts = [[5, 6, 7, 5, 6, 7], [9, 8, 9, 8]]
    handles = [session.add(p, max_new_tokens=90, ignore_eos=True) for p in prompts]
    seen = []
    observe = session.engine.costs.observe
    session.engine.costs.observe = lambda shape: seen.append(shape.seconds) or observe(shape)
    session.run()
    assert session.engine.target.capacity >= 96 and session.engine.target.reserve_s > 0.3  # it grew in a round
    assert seen and max(seen) < 0.3
    for handle, prompt in zip(handles, prompts):
        assert_exact(gen.model, prompt, handle.result.token_ids, 90, frozenset(), "grown")


def test_docstring_examples_of_the_batched_engine() -> None:
    import doctest
    import importlib

    for name in ("draftwise.engine.batch", "draftwise.decision.step_costs"):
        result = doctest.testmod(importlib.import_module(name))
        assert result.failed == 0 and result.attempted > 0, name


def test_the_lanes_teach_their_generators_route_memory(tiny_models) -> None:
    """Routing learns across sampled queries (each routed query's answer scored by every candidate):
    a batch's lanes teach the memory single queries read."""
    specs = [str(tiny_models["llama-small"]), str(tiny_models["llama-twin"])]
    gen = _generator(tiny_models, "llama-target", specs, "fixed", arms="auto@3")
    gen.generate_batch([[5, 9, 13, 7, 11, 3] * 3] * 3, max_new_tokens=12, batch_size=2, ignore_eos=True,
                       temperature=0.7)
    assert gen.engine.routes.queries == {0: 3.0, 1: 3.0}
