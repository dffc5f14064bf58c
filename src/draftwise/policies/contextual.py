"""draftwise's own learner (the default): UCB kept per *context*, where the context is whether the
lookup drafters have a proposal this round, on a throughput reward with a scale-free bonus.

Why, from the zoo measurements (NOTES.md, "A default that beats the best single drafter"):

* a lookup drafter (PLD) costs nothing to ask, and whether it matches is known *before* the
  round: when it matches it is often the best arm; when it does not, playing it is a plain step;
* on a CPU target, verifying one extra token cost ≈ +40 % while 2 → 9 tokens added only ≈ +30 %
  (session 2), so whether to draft at all mattered more than how much; with torch 2.13 the cost
  grows ≈ linearly instead (≈ +11 % a token, BENCHMARKS.md header), and the lookup's own stopping
  (its match supports so many tokens) decides how much;
* each query has one domain, and the drafter that fits it is visible in the prompt (the engine's
  routed arm, ``auto``).

One learner per context learns "the lookup when it matches, else nothing (or the routed model
drafter, where it pays)" and corrects it where a domain disagrees (e.g. answers that copy little from the
prompt). Its arms are the ``cascade`` layout by default. Rewards are tokens per second of the
round, so the exploration bonus is scaled by the mean reward seen (β is in units of it), and the
evidence is kept across queries at 0.9 of its weight per query (``keep``/``decay``): the arms are
abstract ("the lookup", "the routed model drafter"), so what one query teaches carries over.
Every drafted round it also hears what ``none`` would have earned (``plain``; the engine measures
plain rounds), so ``none`` needs no exploring.

Each context starts from a rule-shaped prior: "the lookup when it has a proposal, else ``none``"
leads (``fallback=model``: else the routed model drafter, the rule until session 11), worth
``lead`` pseudo-observations per arm (the others at ``lag`` × its
value, in units of the mean reward seen). Exploring every arm first cost more than it taught
within short queries (≈ 6 % slower on the dev set, `benchmarks/policy_ab.py`). The prior is never
decayed but weighs only ``lead`` observations, and they take over where they do better.

Defaults (β 0.25, decay 0.9, lead 1, ``plain``; session 9, chosen on the dev split): under
sampling (T 0.7), where the arms' gaps are ≈ 15 % and the earlier β 0.5 / decay 0.5 / lead 4
re-explored every query, 0.94× plain decoding vs 0.83× on dev, 1.00× vs 0.93× on self_instruct;
greedy a tie on dev, 1.88× vs 1.79× on self_instruct (BENCHMARKS.md, "Hearing plain rounds").

Session 11 (``fallback=none``, ``model_decay=1``, chosen on the dev split): the routed model arm
earned less than a plain round in every run of it on this CPU, yet the old rule prior led with it
wherever the lookup had no match, and its evidence decayed with the rest, so the bonus re-tried it
about once in two queries (≈ 20 ms each, routing and prefill included). Now the prior leads with
``none`` there and a model arm's evidence is not decayed: its worth is a property of the drafter,
the target and the hardware, not of one query (a lookup's match rate is, hence its decay). Where
model drafting pays (a GPU, a good drafter) the data still win and keep it. Dev: greedy 1.91× vs
1.83× plain decoding, T 0.7 0.99× vs 0.97× (three runs each); self_instruct: greedy 2.17× vs
2.14×, T 0.7 1.08× vs 1.06× (BENCHMARKS.md, "Session 11").

``min_match`` (default 1): a lookup counts as proposing only with at least this many tokens. With 2
and ``fallback=model``, one-token matches go to the model arm: a fixed rule of that shape with the
generalist ran 1.03–1.10× suffix@8 on the dev split, but the learner over the routed arm did not
carry it out of domain (session 24: dev +2 %, self_instruct −0.4 %, zoo:test −2.5 % against the
default), so it is not the default's.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies.base import register_policy
from draftwise.policies.ucb import UCBPolicy

Context = tuple[Hashable, ...] | None
NONE = "none"  # the no-speculation arm (draftwise.arms.NONE, not imported: policies run without torch)
FALLBACKS = ("none", "model")  # what the rule prior leads with where no lookup proposes


def contextual_spec(policy: str, lookups: Sequence[str]) -> str:
    """``ctx-ucb`` without ``on=`` judges its context by the lookup drafters among its arms (the
    cascade's one lookup, each lookup of an explicit list): its rule prior leads with the arm whose
    lookup proposes, so the context must watch exactly those. Other policies are left as they are."""
    name, _, options = policy.partition(":")
    if name != "ctx-ucb" or "on=" in options or not lookups:
        return policy
    return f"{name}:{options + ',' if options else ''}on={'+'.join(dict.fromkeys(lookups))}"


@register_policy("ctx-ucb")
class ContextualUCBPolicy(UCBPolicy):
    """UCB1 per context (which ``on`` drafters have a proposal), bonus β × mean reward × sqrt(2 ln t / n)."""

    summary = ("draftwise's default: UCB per context (does the lookup match this round?) over lookup / routed model "
               "drafter / none, throughput reward, bonus scaled to the reward, a rule-shaped prior per "
               "context, kept across queries; hears every round what no speculation would have earned")
    default_arms = "cascade"
    side_observations = False  # its reward scale is fed by observe: not wired for side observations
    learned: ClassVar[tuple[str, ...]] = ("key", "stored", "reward_sum", "reward_count")

    def __init__(
        self,
        arms: Sequence[str],
        rng: np.random.Generator,
        *,
        on: str = "pld",
        beta: float = 0.25,
        reward: str = "throughput",
        keep: bool = True,
        decay: float = 0.9,
        lead: float = 1.0,
        lag: float = 0.5,
        plain: bool = True,
        fallback: str = "none",
        model_decay: float = 1.0,
        opening: int = 0,
        min_match: int = 1,
        **common: Any,
    ) -> None:
        if lead < 0 or not 0.0 <= lag <= 1.0:
            raise DraftwiseError(f"ctx-ucb: need lead >= 0 and 0 <= lag <= 1 (got lead={lead}, lag={lag})")
        if fallback not in FALLBACKS:
            raise DraftwiseError(f"ctx-ucb: fallback must be one of {', '.join(FALLBACKS)} (got {fallback!r})")
        if not 0.0 <= model_decay <= 1.0:
            raise DraftwiseError(f"ctx-ucb: model_decay must be in [0, 1] (got {model_decay})")
        if opening < 0:
            raise DraftwiseError(f"ctx-ucb: opening must be >= 0 tokens (got {opening})")
        if min_match < 1:
            raise DraftwiseError(f"ctx-ucb: min_match must be >= 1 token (got {min_match})")
        # A lookup counts as proposing with at least ``min_match`` tokens: a one-token match is
        # often a guess, and where the fallback drafts, it drafts better.
        self.min_match = min_match
        self.on = on
        # The answer's first ``opening`` tokens are a context of their own: lookups rarely match
        # there, and what they teach should not stand for the rest of the answer.
        self.opening = opening
        self.fallback = fallback  # the prior's leader where no lookup proposes: ``none`` or the model arm
        self.model_decay = model_decay  # per query, for model-drafter arms (``decay``: the others)
        self.context_on = tuple(name for name in on.split("+") if name)
        self.lead, self.lag = lead, lag
        # Hear what ``none`` would have earned every round: without it the prior's lag keeps
        # ``none`` untried where drafting loses (under sampling, short answers).
        self.hears_plain = plain
        self.leaders: dict[Context, int | None] = {}
        super().__init__(arms, rng, beta=beta, reward=reward, keep=keep, decay=decay, **common)

    def reset(self) -> None:
        super().reset()
        self.key: Context = None
        self.stored: dict[Context, tuple[np.ndarray, np.ndarray, float]] = {}  # the other contexts
        self.reward_sum = 0.0
        self.reward_count = 0.0

    def _fresh(self) -> tuple[np.ndarray, np.ndarray, float]:
        if self.prior is not None and self.prior_weight > 0:  # a new context starts from the prior
            pulls = np.full(self.n_arms, float(self.prior_weight))
            return pulls, self.prior_weight * np.asarray(self.prior, dtype=float), float(pulls.sum())
        return np.zeros(self.n_arms), np.zeros(self.n_arms), 0.0

    def context_key(self, proposed: tuple[int, ...], position: int) -> tuple[Hashable, ...]:
        proposing = tuple(n >= self.min_match for n in proposed)
        return (*proposing, position < self.opening) if self.opening else proposing

    def set_context(self, key: tuple[Hashable, ...]) -> None:
        if key == self.key:
            return
        self.stored[self.key] = (self.pulls, self.sums, self.t)
        self.pulls, self.sums, self.t = self.stored.pop(key) if key in self.stored else self._fresh()
        self.key = key

    def decay_state(self, factor: float) -> None:
        """Shrink the evidence by ``factor``, a model-drafter arm's by ``model_decay``."""
        per_arm = np.full(self.n_arms, factor)
        per_arm[self.model_arms] = self.model_decay
        self.pulls, self.sums, self.t = self.pulls * per_arm, self.sums * per_arm, self.t * factor
        self.stored = {k: (p * per_arm, s * per_arm, t * factor) for k, (p, s, t) in self.stored.items()}
        self.reward_sum *= factor
        self.reward_count *= factor

    def observe(self, arm: int, reward: float) -> None:
        super().observe(arm, reward)
        self.reward_sum += reward
        self.reward_count += 1

    def leader(self, key: Context) -> int | None:
        """The arm the rule prior favours in a context: the arm of a lookup that has a proposal,
        else ``none`` (``fallback=model``: the first model-drafter arm)."""
        if key not in self.leaders:
            proposing = {name for name, has in zip(self.context_on, key or ()) if has}
            lookup = next((i for i, d in enumerate(self.arm_drafters) if d & proposing), None)
            fallback = self.model_arms if self.fallback == "model" else self.plain_arms
            self.leaders[key] = lookup if lookup is not None else next(iter(fallback), None)
        return self.leaders[key]

    @functools.cached_property
    def arm_drafters(self) -> list[set[str]]:
        """Each arm's drafters: ``pld@8`` → {pld}; a union ``pld|suffix@8`` or a pick ``suffix/pld@8``
        → {pld, suffix}."""
        return [set(arm.split("@")[0].split("+")[0].replace("/", "|").split("|")) for arm in self.arms]

    @functools.cached_property
    def model_arms(self) -> list[int]:
        """The arms that draft with a model: neither a watched lookup nor ``none``, in order (a
        lookup left out of ``on`` counts too: whether it proposes is not known before the round)."""
        return [i for i, d in enumerate(self.arm_drafters) if not d & set(self.context_on) and NONE not in d]

    @functools.cached_property
    def plain_arms(self) -> list[int]:
        return [i for i, d in enumerate(self.arm_drafters) if NONE in d]

    def evidence(self) -> tuple[list[float], list[float], float]:
        """The learned evidence plus the rule prior: ``lead`` pseudo-observations per arm, worth the
        mean reward seen for the context's leading arm and ``lag`` × that for the others (the
        reward's own, unknown, scale). Never decayed: it settles what to try while the context's
        evidence is thin; the data outweigh it as they accumulate."""
        sums, pulls, t = super().evidence()
        leader = self.leader(self.key)
        if self.lead <= 0 or leader is None:
            return sums, pulls, t
        mean = self.reward_sum / self.reward_count if self.reward_count > 0 else 1.0
        sums = [s + self.lead * mean * (1.0 if i == leader else self.lag) for i, s in enumerate(sums)]
        return sums, [n + self.lead for n in pulls], t + self.lead * self.n_arms

    def state_examples(self) -> dict[str, list[Any]]:
        # A context is None (before the first round) or one bool per watched lookup, plus one for the
        # opening; the lookups are among the arms, so no context is longer than the arms and one.
        contexts: list[Context] = [None, *((True,) * n for n in range(1, self.n_arms + 2))]
        evidence = (np.zeros(self.n_arms), np.zeros(self.n_arms), 0.0)
        return {"key": contexts, "stored": [{context: evidence for context in contexts}]}

    def bonus_weight(self) -> float:
        """β in units of the mean reward seen (tokens/s have no natural scale)."""
        return self.beta * (self.reward_sum / self.reward_count if self.reward_count > 0 else 1.0)

    def state_dict(self) -> dict[str, Any]:
        contexts = {str(self.key): {"pulls": self.pulls.tolist(), "sums": self.sums.tolist()}}
        contexts.update({str(k): {"pulls": p.tolist(), "sums": s.tolist()} for k, (p, s, _) in self.stored.items()})
        return {**super().state_dict(), "on": self.on, "lead": self.lead, "lag": self.lag, "contexts": contexts}
