"""draftwise's own learner (the default): UCB kept per *context*, where the context is whether the
lookup drafters have a proposal this round, on a throughput reward with a scale-free bonus.

Why this shape (the measurements: docs/design.md, "Policies"):

* a lookup drafter (PLD, suffix) costs nothing to ask, and whether it matches is known *before*
  the round: when it matches it is often the best arm; when it does not, playing it is a plain
  step. So whether to draft is decided with that knowledge, and how much by the lookup's own match;
* each query has one domain, and the model drafter that fits it is visible in the prompt (the
  engine's routed arm, ``auto``); whether any model drafter pays depends on the target and the
  hardware, so it is learned, not assumed.

One learner per context learns "the lookup when it matches, else nothing (or the routed model
drafter, where it pays)" and corrects it where the data disagree. Its arms are the ``cascade``
layout by default. Rewards are tokens per second of the round, so the exploration bonus is scaled
by the mean reward seen (β is in units of it). The evidence is kept across queries at ``decay`` of
its weight per query: the arms are abstract ("the lookup", "the routed model drafter"), so what one
query teaches carries over. A model arm's evidence decays by ``model_decay`` (1: not at all): its
worth is a property of the drafter, the target and the hardware, not of one query, while how often
a lookup matches is. Every drafted round it also hears what ``none`` would have earned (``plain``;
the engine measures plain rounds), so ``none`` needs no exploring.

Each context starts from a rule-shaped prior: the arm of a lookup that has a proposal leads, else
``none`` (``fallback=model``: the routed model drafter), worth ``lead`` pseudo-observations per arm,
the others at ``lag`` × its value, in units of the mean reward seen. Exploring every arm first
costs more than it teaches within short queries; the prior is never decayed but weighs only
``lead`` observations, so the data take over where they do better (``lead=0``: plain UCB per
context).

``follow`` (default off; the engine's default policy sets it): where a watched lookup proposes, its
arm is played without exploring — the engine cuts the draft to the length that pays at the
machine's prices (:mod:`draftwise.decision.pricing`), no draft included — and the learner chooses
only where none proposes.

``opening`` (default 0; the engine's default policy uses 16): the answer's first tokens are a
context of their own — lookups rarely match there, and what those rounds teach should not stand for
the rest of the answer. ``min_match`` (default 1): a lookup counts as proposing only with at least
this many tokens (with ``fallback=model``, shorter matches go to the model arm).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.policies.base import PolicySpec, register_policy
from draftwise.policies.ucb import UCBPolicy

Context = tuple[Hashable, ...] | None
NONE = "none"  # the no-speculation arm (draftwise.decision.arms.NONE, not imported: policies run without torch)
FALLBACKS = ("none", "model")  # what the rule prior leads with where no lookup proposes


def watch_lookups(spec: PolicySpec, lookups: Sequence[str]) -> PolicySpec:
    """``ctx-ucb`` without ``on=`` judges its context by the lookup drafters among its arms (the
    cascade's one lookup, each lookup of an explicit list): its rule prior leads with the arm whose
    lookup proposes, so the context must watch exactly those. Other policies are left as they are."""
    if spec.name != "ctx-ucb" or "on" in spec.options or not lookups:
        return spec
    return spec.with_defaults(on="+".join(dict.fromkeys(lookups)))


def contextual_spec(policy: str, lookups: Sequence[str]) -> str:
    """``ctx-ucb`` without ``on=`` judges its context by the lookup drafters among its arms (the
    cascade's one lookup, each lookup of an explicit list): its rule prior leads with the arm whose
    lookup proposes, so the context must watch exactly those. Other policies are left as they are.
    (:func:`watch_lookups` on a parsed spec; this is the same written as a spec string.)"""
    name, _, options = policy.partition(":")
    if name != "ctx-ucb" or "on=" in options or not lookups:
        return policy
    return f"{name}:{options + ',' if options else ''}on={'+'.join(dict.fromkeys(lookups))}"


@register_policy("ctx-ucb")
class ContextualUCBPolicy(UCBPolicy):
    """UCB1 per context (which ``on`` drafters have a proposal), bonus β × mean reward × sqrt(2 ln t / n)."""

    summary = ("draftwise's default: UCB per context (does the lookup match this round?) over lookup / routed model "
               "drafter / none, throughput reward, bonus scaled to the reward, a rule-shaped prior per "
               "context, kept across queries; hears every round what no speculation would have earned; "
               "follow=1 (the default's): a proposing lookup is played, its draft priced at this machine's costs")
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
        follow: bool = False,
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
        # Where a watched lookup proposes, play its arm without exploring: the engine cuts its draft
        # to the length that pays (draftwise.decision.pricing), none included, so there is nothing
        # left to learn there; the learner chooses only where no lookup proposes.
        self.follow = follow
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

    def select(self) -> int:
        leader = self.leader(self.key) if self.follow else None
        if leader is not None and leader not in self.plain_arms and leader not in self.model_arms \
                and leader not in self.blocked:
            return leader
        return super().select()

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
