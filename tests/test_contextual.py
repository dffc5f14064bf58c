"""The default learner: UCB per context (does PLD match?), over the cascade arms with a routed arm."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise import Generator
from draftwise.decision.arms import GENERALIST_STOP, ArmSettings, build_arms
from draftwise.drafters import build_drafters
from draftwise.errors import DraftwiseError
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.policies import make_policy
from draftwise.trace import RoundRecord


def _record(arm: int, emitted: int, seconds: float) -> RoundRecord:
    return RoundRecord(index=0, arm=arm, arm_name="", max_draft=4, drafted=4, accepted=emitted - 1, emitted=emitted,
                       position=0, verify_s=seconds)


def test_each_context_learns_its_own_best_arm() -> None:
    policy = make_policy("ctx-ucb:beta=0.1", ["pld@8", "auto@4", "none"], np.random.default_rng(0))
    policy.begin_query()
    # where PLD matches it yields 5 tokens a round; where it does not, it is a plain step
    for step in range(60):
        match = step % 2 == 0
        policy.set_context((match,))
        arm = policy.select()
        tokens = {0: 5 if match else 1, 1: 3, 2: 1}[arm]
        policy.update(arm, _record(arm, tokens, 0.01))
    policy.set_context((True,))
    assert policy.select() == 0
    policy.set_context((False,))
    assert policy.select() == 1
    state = policy.state_dict()["contexts"]
    assert set(state) >= {"(True,)", "(False,)"}


def test_follow_plays_a_proposing_lookup_and_learns_only_where_none_proposes() -> None:
    """``follow=1`` (the default's): where the lookup proposes its arm is played whatever it earned
    (the engine prices its draft, no draft included); elsewhere the learner learns as always."""
    policy = make_policy("ctx-ucb:beta=0.1,follow=1,lead=0", ["pld@8", "auto@4", "none"], np.random.default_rng(0))
    policy.begin_query()
    played = {True: set(), False: set()}
    for step in range(80):
        match = step % 2 == 0
        policy.set_context((match,))
        arm = policy.select()
        played[match].add(arm)
        tokens = {0: 1, 1: 3, 2: 1}[arm]  # the lookup earns nothing: under follow it is played anyway
        policy.update(arm, _record(arm, tokens, 0.01 if arm != 0 else 0.02))
    assert played[True] == {0}
    assert len(played[False]) > 1  # explored …
    policy.set_context((False,))
    assert policy.select() == 1  # … and learned
    policy.set_context((True,))
    assert policy.select_unblocked(frozenset({0})) != 0  # a blocked lookup arm is not followed


def test_the_answers_opening_is_a_context_of_its_own() -> None:
    """``opening=N``: rounds before the answer's N-th token learn apart from the later ones — a
    lookup that fails in the openings is still the leader later (the default, N = 16)."""
    policy = make_policy("ctx-ucb:beta=0.1,opening=16", ["pld@8", "none"], np.random.default_rng(0))
    assert policy.context_key((4,), 3) == (True, True) and policy.context_key((4,), 16) == (True, False)
    assert make_policy("ctx-ucb", ["pld@8", "none"], np.random.default_rng(0)).context_key((4,), 3) == (True,)
    policy.begin_query()
    for _ in range(30):  # openings: the lookup's drafts are rejected, a plain round does better
        policy.set_context(policy.context_key((4,), 5))
        arm = policy.select()
        policy.update(arm, _record(arm, 1, 0.02 if arm == 0 else 0.01))
        if arm == 0:  # as the engine does: what ``none`` would have earned
            policy.update(1, _record(1, 1, 0.01))
    assert policy.select() == 1
    policy.set_context(policy.context_key((4,), 40))
    assert policy.select() == 0  # later in the answer the rule prior still leads with the lookup
    with pytest.raises(DraftwiseError, match="opening"):
        make_policy("ctx-ucb:opening=-1", ["pld@8", "none"], np.random.default_rng(0))


def test_a_lookup_proposes_with_at_least_min_match_tokens() -> None:
    """``min_match=2``: a one-token lookup proposal counts as none, so the prior leads there with the
    fallback (``fallback=model``: the model arm)."""
    arms = ["pld@8", "auto@4", "none"]
    policy = make_policy("ctx-ucb:min_match=2,fallback=model,on=pld", arms, np.random.default_rng(0))
    assert policy.context_key((1,), 0) == (False,) and policy.context_key((2,), 0) == (True,)
    assert [policy.leader(policy.context_key((n,), 0)) for n in (0, 1, 2, 8)] == [1, 1, 0, 0]
    assert make_policy("ctx-ucb", arms, np.random.default_rng(0)).context_key((1,), 0) == (True,)
    with pytest.raises(DraftwiseError, match="min_match"):
        make_policy("ctx-ucb:min_match=0", arms, np.random.default_rng(0))


def test_evidence_is_kept_across_queries_at_the_decay() -> None:
    policy = make_policy("ctx-ucb", ["pld@8", "none"], np.random.default_rng(0))
    policy.begin_query()
    for context in ((True,), (False,)):
        policy.set_context(context)
        policy.update(0, _record(0, 2, 0.01))
    policy.begin_query()  # keep=True, decay=0.9 by default
    policy.set_context((False,))
    assert policy.pulls.tolist() == [0.9, 0.0]
    policy.set_context((True,))
    assert policy.pulls.tolist() == [0.9, 0.0]
    fresh = make_policy("ctx-ucb:keep=false", ["a", "b"], np.random.default_rng(0))
    fresh.begin_query()
    fresh.set_context((True,))
    fresh.update(1, _record(1, 2, 0.01))
    fresh.begin_query()
    fresh.set_context((True,))
    assert fresh.pulls.tolist() == [0.0, 0.0]


def test_bonus_is_in_units_of_the_mean_reward() -> None:
    """Throughput is in tokens/s: the same choices whatever the time unit."""
    picks = []
    for seconds in (0.01, 10.0):
        policy = make_policy("ctx-ucb", ["a", "b", "c"], np.random.default_rng(0))
        policy.begin_query()
        chosen = []
        for step in range(40):
            arm = policy.select()
            chosen.append(arm)
            policy.update(arm, _record(arm, [2, 3, 1][arm] + step % 2, seconds))
        picks.append(chosen)
    assert picks[0] == picks[1]


def test_rule_prior_leads_each_context_until_the_data_disagree() -> None:
    """Before any evidence: the lookup's arm where it has a proposal, ``none`` where it has not (the
    default), or the model arm (``fallback=model``); no arm is tried blindly; evidence against the
    leader moves the choice."""
    assert make_policy("ctx-ucb", ["pld@8", "auto@4", "none"], np.random.default_rng(0)).leader((False,)) == 2
    policy = make_policy("ctx-ucb:fallback=model", ["pld@8", "auto@4", "none"], np.random.default_rng(0))
    policy.begin_query()
    assert (policy.leader((True,)), policy.leader((False,))) == (0, 1)
    policy.set_context((True,))
    assert policy.select() == 0
    policy.set_context((False,))
    assert policy.select() == 1
    picks = []
    for _ in range(150):  # here the routed drafter is a loss and a plain step is not
        arm = policy.select()
        picks.append(arm)
        policy.update(arm, _record(arm, 1, {0: 0.004, 1: 0.009, 2: 0.003}[arm]))
    assert picks[:20] == [1] * 20  # the prior holds while the evidence is thin
    assert picks[-50:].count(2) > 40  # then the data win
    assert make_policy("ctx-ucb", ["pld@8", "none"], np.random.default_rng(0)).leader((False,)) == 1
    assert make_policy("ctx-ucb:fallback=model", ["pld@8", "none"], np.random.default_rng(0)).leader((False,)) is None
    assert make_policy("ctx-ucb:on=pld+suffix", ["suffix@8", "pld@8", "code@4"],
                       np.random.default_rng(0)).leader((False, True)) == 0
    off = make_policy("ctx-ucb:lead=0", ["pld@8", "auto@4", "none"], np.random.default_rng(0))
    off.begin_query()
    off.set_context((False,))
    assert off.evidence()[1] == [0.0, 0.0, 0.0]  # no prior: plain UCB, every arm tried once first
    with pytest.raises(DraftwiseError, match="lag"):
        make_policy("ctx-ucb:lag=2", ["a", "b"], np.random.default_rng(0))
    with pytest.raises(DraftwiseError, match="fallback must be one of none, model"):
        make_policy("ctx-ucb:fallback=pld", ["a", "b"], np.random.default_rng(0))
    with pytest.raises(DraftwiseError, match="model_decay must be in"):
        make_policy("ctx-ucb:model_decay=2", ["a", "b"], np.random.default_rng(0))


def test_a_model_arm_that_pays_takes_over_where_no_lookup_proposes() -> None:
    """The prior leads with ``none`` there, but a model drafter that pays (as on a GPU) is found by
    the bonus and then kept, query after query: its evidence is not decayed."""
    policy = make_policy("ctx-ucb", ["suffix@8", "auto@4", "none"], np.random.default_rng(0))
    worth = {0: (1, 0.004), 1: (4, 0.006), 2: (1, 0.004)}  # (tokens, seconds): the model arm earns 2.7×
    picks = []
    for _ in range(6):  # queries
        policy.begin_query()
        policy.set_context((False,))
        for _ in range(40):
            arm = policy.select()
            picks.append(arm)
            policy.update(arm, _record(arm, *worth[arm]))
    assert picks[0] == 2  # the prior's leader first
    assert picks[-40:].count(1) >= 36  # then the model arm, and it stays chosen in later queries


def test_a_model_arms_evidence_outlives_queries_and_the_others_decay() -> None:
    """What a model drafter is worth here (drafter, target, hardware) does not change from one
    query to the next; how often the lookup matches does."""
    policy = make_policy("ctx-ucb:lead=0", ["pld@8", "auto@4", "none"], np.random.default_rng(0))
    policy.begin_query()
    for context in ((True,), (False,)):  # the current context and a stored one decay alike
        policy.set_context(context)
        for arm in range(3):
            policy.update(arm, _record(arm, 2, 0.01))
    policy.begin_query()
    for context in ((True,), (False,)):
        policy.set_context(context)
        assert policy.pulls.tolist() == [0.9, 1.0, 0.9]
    policy = make_policy("ctx-ucb:lead=0,model_decay=0.5", ["pld@8", "auto@4", "none"], np.random.default_rng(0))
    policy.begin_query()
    for arm in range(3):
        policy.update(arm, _record(arm, 2, 0.01))
    policy.begin_query()
    assert policy.pulls.tolist() == [0.9, 0.5, 0.9]


@pytest.fixture(scope="module")
def pool(tiny_models):
    options = LoadOptions()
    model, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    specs = ["pld", "suffix", str(tiny_models["llama-small"]), str(tiny_models["llama-twin"])]
    return model, tokenizer, lambda: build_drafters(specs, model, tokenizer, options)


def test_cascade_layout_and_the_routed_arm_parse(pool) -> None:
    _, _, make = pool
    drafters = make()
    arms = build_arms("cascade", drafters, ArmSettings(draft_len=3))
    # both lookups: a pick, suffix first, at twice the draft length and just under it; the routed
    # model arm drafts while each next token pays (the gain rule)
    assert [a.name for a in arms] == ["suffix/pld@6", "suffix/pld@2", "auto@3+gain", "none"]
    assert arms[0].pick and arms[0].lookups == (1, 0) and arms[1].pick and arms[2].route == (2, 3)
    assert arms[2].stop == "gain"
    assert [a.name for a in build_arms("cascade", drafters, ArmSettings(draft_len=1))][:2] == ["suffix/pld@2",
                                                                                               "suffix/pld@1"]
    assert build_arms("cascade", drafters, ArmSettings(drafter="suffix"))[0].name == "suffix@8"
    assert build_arms("cascade", drafters, ArmSettings(drafter="pld"))[0].name == "pld@8"
    assert build_arms("cascade", [d for d in drafters if d.name != "suffix"], ArmSettings())[0].name == "pld@8"
    explicit = build_arms("auto@5,pld@2,none", drafters, ArmSettings())
    assert explicit[0].route == (2, 3) and explicit[0].draft_len == 5
    with pytest.raises(DraftwiseError, match="cascade"):
        build_arms("cascade", drafters, ArmSettings(drafter="nope"))
    with pytest.raises(DraftwiseError, match="routed arm"):
        build_arms("auto@4", drafters[:2], ArmSettings())
    ruled = build_arms("auto@6+heuristic:up=1,none", drafters, ArmSettings())[0]
    assert (ruled.name, ruled.stop, ruled.route, ruled.draft_len) == (
        "auto@6+heuristic:up=1", "heuristic:up=1", (2, 3), 6)
    union = build_arms("pld|suffix@8,auto@8+gain,none", drafters, ArmSettings())
    assert (union[0].drafter, union[0].also, union[0].draft_len) == (0, (1,), 8) and union[1].stop == "gain"
    with pytest.raises(DraftwiseError, match="a union joins lookup drafters"):
        build_arms(f"pld|{drafters[2].name}@4", drafters, ArmSettings())
    with pytest.raises(DraftwiseError, match="not to a union"):
        build_arms("pld|suffix@4+svip", drafters, ArmSettings())
    with pytest.raises(DraftwiseError, match="distinct lookups"):
        build_arms("pld|pld@4", drafters, ArmSettings())
    # the rule prior reads a union as a lookup arm: it leads where one of its lookups proposes
    policy = make_policy("ctx-ucb:on=pld+suffix", ["pld|suffix@8", "auto@4", "none"], np.random.default_rng(0))
    assert policy.leader((False, True)) == 0 and policy.leader((False, False)) == 2
    pick = build_arms("suffix/pld@8,none", drafters, ArmSettings())[0]
    assert (pick.drafter, pick.also, pick.pick, pick.lookups) == (1, (0,), True, (1, 0))
    assert not union[0].pick
    with pytest.raises(DraftwiseError, match="a pick joins lookup drafters"):
        build_arms(f"suffix/{drafters[2].name}@4", drafters, ArmSettings())
    with pytest.raises(DraftwiseError, match="not to a pick"):
        build_arms("suffix/pld@4+svip", drafters, ArmSettings())
    picked = make_policy("ctx-ucb:on=suffix+pld", ["suffix/pld@8", "auto@4", "none"], np.random.default_rng(0))
    assert picked.leader((False, True)) == 0 and picked.leader((False, False)) == 2


def test_the_cascade_drafts_with_a_generalist_alone(pool) -> None:
    _, _, make = pool
    drafters = make()
    small, twin = drafters[2], drafters[3]
    small.domains, twin.domains = ("code",), ("code", "math")  # as the zoo's manifest says of its drafters
    model_arm = build_arms("cascade", drafters, ArmSettings())[2]
    # trained on every domain the other was: drafted with alone, up to the short lookup length
    assert (model_arm.drafter, model_arm.route, model_arm.stop, model_arm.draft_len) == (3, (), GENERALIST_STOP, 3)
    small.domains = ("code", "math", "qa")  # now the small one covers the twin's domains
    assert build_arms("cascade", drafters, ArmSettings())[2].drafter == 2
    small.domains = ()  # a drafter of unknown domains may fit any query: route among them
    routed = build_arms("cascade", drafters, ArmSettings())[2]
    assert routed.route == (2, 3) and routed.name.startswith("auto@")
    assert build_arms("auto@4", drafters, ArmSettings())[0].route == (2, 3)  # asked for by name: routed


def test_a_pick_arm_verifies_the_longest_of_its_lookups_drafts(pool) -> None:
    model, tokenizer, make = pool
    drafters = [d for d in make() if d.name in ("suffix", "pld")]
    lengths: list[tuple[str, int]] = []
    for drafter in drafters:
        original = drafter.propose

        def spy(context, max_len, ctx, stop=None, _original=original, _name=drafter.name):
            draft = _original(context, max_len, ctx, stop)
            lengths.append((_name, len(draft.tokens)))
            return draft

        drafter.propose = spy
    gen = Generator(model, tokenizer, drafters, policy="fixed", arms="suffix/pld@8")
    motif = [5, 9, 13, 7, 11, 3]
    result = gen.generate(motif * 4 + [5, 9], max_new_tokens=30, ignore_eos=True)
    rounds = [dict(lengths[i : i + 2]) for i in range(0, len(lengths), 2)]  # the last round has no budget
    assert len(rounds) == result.stats.rounds - 1 and all(set(r) == {"suffix", "pld"} for r in rounds)
    assert [r.drafted for r in result.trace[:-1]] == [max(r.values()) for r in rounds]
    assert any(r["pld"] > r["suffix"] for r in rounds) or any(r["suffix"] > r["pld"] for r in rounds)


def test_routed_arm_drafts_with_the_drafter_that_predicts_the_prompt(pool) -> None:
    model, tokenizer, make = pool
    seed_prompt = [5, 9, 13]
    written = Generator(model, tokenizer, [], policy="fixed:0").generate(
        seed_prompt, max_new_tokens=40, ignore_eos=True)
    # the default arms (cascade); the prior leads with the routed arm where the lookup has no match
    gen = Generator(model, tokenizer, make(), policy="ctx-ucb:fallback=model")
    assert [a.name for a in gen.arms] == ["suffix/pld@8", "suffix/pld@3", "auto@4+gain", "none"]
    result = gen.generate(seed_prompt + written.token_ids, max_new_tokens=30, ignore_eos=True)
    routed = {r.arm_name for r in result.trace if r.arm_name.startswith("auto")}
    assert routed == {"auto@4+gain=llama-twin"}  # the target's twin predicts a prompt the target wrote


def test_engine_tells_the_policy_whether_its_lookup_matches(pool, monkeypatch) -> None:
    from draftwise.policies.contextual import ContextualUCBPolicy

    seen = []
    original = ContextualUCBPolicy.set_context

    def spy(self, key):
        seen.append(key)
        return original(self, key)

    monkeypatch.setattr(ContextualUCBPolicy, "set_context", spy)
    model, tokenizer, make = pool
    gen = Generator(model, tokenizer, make(), policy="ctx-ucb")
    assert gen.policy.context_on == ("suffix", "pld")  # the cascade's lookups (a pick) are what the context watches
    novel = list(range(2, 20))  # no repeated n-gram at first: no lookup has anything to propose
    result = gen.generate(novel, max_new_tokens=40, ignore_eos=True)
    assert len(seen) == result.stats.rounds
    assert seen[0] == (False, False)
    no_suffix = Generator(model, tokenizer, [d for d in make() if d.name != "suffix"], policy="ctx-ucb")
    assert no_suffix.policy.context_on == ("pld",) and no_suffix.arms[0].name == "pld@8"
    listed = Generator(model, tokenizer, make(), policy="ctx-ucb", arms="pld@8,suffix@8,auto@4,none")
    assert listed.policy.context_on == ("pld", "suffix")  # every lookup among the arms
    models_only = Generator(model, tokenizer, [d for d in make() if d.name not in ("pld", "suffix")],
                            policy="ctx-ucb")
    seen.clear()
    models_only.generate(novel, max_new_tokens=10, ignore_eos=True)
    assert seen == []  # no lookup in the pool: one context
    both = Generator(model, tokenizer, [d for d in make() if d.name != "suffix"], policy="ctx-ucb:on=pld+suffix")
    assert both.policy.context_on == ("pld", "suffix")  # an explicit ``on`` is kept
    seen.clear()
    both.generate(novel, max_new_tokens=10, ignore_eos=True)
    assert seen and all(len(key) == 2 and key[1] is False for key in seen)  # one entry per named drafter


def test_routed_arm_under_full_information_is_routed_before_round_one(pool, tiny_models) -> None:
    """Full-information learners score every arm from round 1, so the routed arm is picked up front;
    its counterfactual is its drafter's, and the output stays the target's own."""
    from test_lossless_greedy import _reference
    from transformers import AutoModelForCausalLM

    model, tokenizer, make = pool
    seed_prompt = [5, 9, 13]
    written = Generator(model, tokenizer, [], policy="fixed:0").generate(
        seed_prompt, max_new_tokens=30, ignore_eos=True)
    prompt = seed_prompt + written.token_ids
    gen = Generator(model, tokenizer, make(), policy="normalhedge", arms="auto@4,pld@4")
    result = gen.generate(prompt, max_new_tokens=24, ignore_eos=True)
    reference = AutoModelForCausalLM.from_pretrained(tiny_models["llama-target"]).eval()
    assert result.token_ids == _reference(reference, prompt, 24, None)
    assert gen.engine.last_query.arm_drafter[0] == 3  # llama-twin, picked before the first round
    assert all(r.arm_name in ("auto@4=llama-twin", "pld@4") for r in result.trace)
    assert any(r.counterfactual is not None for r in result.trace)


def test_prompt_fit_leaves_lookups_on_the_whole_prompt(pool) -> None:
    """Model drafters are scored on the prompt's tail only; a lookup's state must follow the whole
    prompt, or its later drafts would come from a misaligned stream."""
    from draftwise.decision.routing import PromptFit
    from draftwise.drafters import DraftContext
    from draftwise.drafters.suffix import SuffixDrafter
    from draftwise.verify.chain import Sampling

    model, tokenizer, make = pool
    gen = Generator(model, tokenizer, make(), policy="ucb:prompt_prior=2")
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(2, 30, 150)]  # longer than the scored tail
    suffix = next(i for i, d in enumerate(gen.drafters) if d.name == "suffix")
    for drafter in gen.drafters:
        drafter.begin_query(prompt)
    rates = PromptFit().rates(gen.drafters, prompt, list(range(len(gen.drafters))), DraftContext(Sampling()))
    assert set(rates) == set(range(len(gen.drafters)))
    fresh = SuffixDrafter()
    fresh.begin_query(prompt)
    ctx = DraftContext(Sampling())
    more = [int(t) for t in rng.integers(2, 30, 30)]
    for k in range(0, 30, 3):  # drafting on from the prompt, as the rounds would
        tokens = prompt + more[:k]
        assert gen.drafters[suffix].propose(tokens, 6, ctx).tokens == fresh.propose(tokens, 6, ctx).tokens


def test_the_default_hears_what_no_speculation_would_have_earned(pool, monkeypatch) -> None:
    """Every drafted round, the single-query engine credits ``none`` with one token for the measured
    cost of a plain round; to know that cost it plays a few plain rounds itself (never round 1,
    which reads the prompt). The output is the target's own either way."""
    model, tokenizer, make = pool
    seed_prompt = [5, 9, 13]
    plain = Generator(model, tokenizer, [], policy="fixed:0").generate(seed_prompt, max_new_tokens=60, ignore_eos=True)
    prompt = seed_prompt + plain.token_ids[:30]
    reference = Generator(model, tokenizer, [], policy="fixed:0").generate(prompt, max_new_tokens=40, ignore_eos=True)
    from draftwise.engine import Engine

    calibrations = []
    original = Engine.plan

    def spy(self, query, arm_index=None, in_context=False):
        calibrations.append(in_context)
        return original(self, query, arm_index, in_context)

    monkeypatch.setattr(Engine, "plan", spy)
    gen = Generator(model, tokenizer, make(), policy="ctx-ucb:fallback=model")  # round 1 drafts
    result = gen.generate(prompt, max_new_tokens=40, ignore_eos=True)
    assert result.token_ids == reference.token_ids
    assert calibrations[:4] == [False, True, True, True] and not any(calibrations[4:])
    clock = gen.engine.plain_rounds
    assert clock is not None and clock.seconds() is not None and not clock.due()
    arms = [r.arm_name for r in result.trace]
    assert arms[0] != "none" or len(arms) == 1  # round 1 is the learner's own choice
    assert arms[1:4] == ["none"] * 3  # the clock's first measures: plain rounds, played once per engine
    drafted = sum(1 for r in result.trace if r.drafted > 0)
    none = gen.policy.arms.index("none")
    contexts = [gen.policy.pulls, *(p for p, _, _ in gen.policy.stored.values())]
    heard = sum(float(p[none]) for p in contexts)
    # every drafted round after the clock was set was credited (no decay within a query)
    assert heard >= drafted + arms.count("none") - 1
    calibrations.clear()
    again = gen.generate(prompt, max_new_tokens=40, ignore_eos=True)
    assert again.token_ids == reference.token_ids
    assert calibrations and not any(calibrations)  # the clock is set: the learner chooses every round
    silent = Generator(model, tokenizer, make(), policy="ctx-ucb:plain=false")
    assert silent.engine.plain_rounds is None
    assert silent.generate(prompt, max_new_tokens=40, ignore_eos=True).token_ids == reference.token_ids
    assert Generator(model, tokenizer, make(), policy="ucb", arms="suffix@8,none").engine.plain_rounds is None


def test_routing_learns_which_drafters_answers_fit_worse_than_their_prompts() -> None:
    from draftwise.decision.routing import PromptFit, RouteMemory, learn_route
    from draftwise.drafters import DraftContext

    memory = RouteMemory(weight=0.5, prior_queries=4.0)
    assert memory.offset(0) == 0.0
    for _ in range(4):  # drafter 0 fits the prompts well and the answers badly; drafter 1 the same on both
        memory.observe({0: 0.6, 1: 0.5}, {0: 0.2, 1: 0.5})
    assert memory.offset(0) == pytest.approx(0.5 * 4 * -0.4 / 8) and memory.offset(1) == 0.0
    memory.observe({0: 0.6}, {0: 0.2, 2: 0.9})  # a drafter routing did not score is not learned
    assert 2 not in memory.queries and memory.queries[0] == 5
    off = RouteMemory(weight=0.0)  # off: nothing scored, nothing learned
    learn_route(PromptFit(), [], off, list(range(40)), 10, {0: 0.5}, DraftContext())
    assert off.queries == {} and off.ended == 0 and off.offset(0) == 0.0


def test_an_ended_sampled_routed_query_teaches_the_route_memory(pool) -> None:
    model, tokenizer, make = pool
    gen = Generator(model, tokenizer, make(), policy="fixed", arms="auto@3")
    prompt = [5, 9, 13, 7, 11, 3] * 3
    sampled = {"temperature": 0.7, "seed": 3, "ignore_eos": True}
    gen.generate(prompt, max_new_tokens=20, ignore_eos=True)  # greedy: routed on the prompt alone, nothing learned
    memory = gen.engine.routes
    assert memory.queries == {} and gen.engine.last_query.route_fits.keys() == {2, 3}
    gen.generate(prompt, max_new_tokens=20, **sampled)
    assert set(memory.queries) == {2, 3} and all(n == 1.0 for n in memory.queries.values())
    gen.generate(prompt, max_new_tokens=4, **sampled)  # too short an answer to judge: not learned
    assert all(n == 1.0 for n in memory.queries.values())
    # routing adds each drafter's offset to its prompt fit: a large enough one overturns the pick
    first = gen.engine.last_query.arm_drafter[0]
    other = 5 - first
    memory.gap_sum[other] = 100.0
    gen.generate(prompt, max_new_tokens=10, **sampled)
    assert gen.engine.last_query.arm_drafter[0] == other
    gen.generate(prompt, max_new_tokens=10, ignore_eos=True)
    assert gen.engine.last_query.arm_drafter[0] == first  # greedy queries route on the prompt alone


def test_once_the_evidence_is_in_only_one_routed_answer_in_a_few_is_scored() -> None:
    from draftwise.decision.routing import ANSWER_ALL, ANSWER_EVERY, RouteMemory

    memory = RouteMemory()
    scored = []
    for _ in range(ANSWER_ALL + 4 * ANSWER_EVERY):
        due = memory.due()
        scored.append(due)
        if due:
            memory.observe({0: 0.5, 1: 0.5}, {0: 0.4, 1: 0.6})
    assert all(scored[:ANSWER_ALL]) and sum(scored[ANSWER_ALL:]) == 4
