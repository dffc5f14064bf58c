"""Dynamic stopping rules: when should an LM drafter stop drafting? (TapOut Table 1, App. A.1)

A rule looks at the drafter's distribution for the *next* draft position (softmax of its raw
logits, temperature 1, as the rules are defined) and says whether to stop before drafting it.
The first draft token is always drafted; ``max_len`` (the arm's draft budget) bounds the rest —
TapOut used 128 as "unbounded". Rules with state (AdaEDL's threshold, SVIP-Difference's previous
entropy) keep it here; ``after_round`` tells them what verification accepted.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from draftwise.errors import DraftwiseError
from draftwise.options import keyword_defaults, split_spec, typed_options
from draftwise.policies import make_policy
from draftwise.registry import Registry


def entropy(probs: torch.Tensor) -> float:
    """Shannon entropy in nats of a distribution (V,)."""
    return float(-(probs * torch.log(probs.clamp_min(1e-30))).sum())


def top2(probs: torch.Tensor) -> tuple[float, float]:
    values = torch.topk(probs, 2).values.tolist()
    return values[0], values[1]


class StopRule(ABC):
    name: str = "rule"
    lasting: bool = False  # kept across a generator's queries (else a fresh rule per query)

    def start_draft(self) -> None:
        """A new draft begins."""

    @abstractmethod
    def should_stop(self, probs: torch.Tensor, step: int) -> bool:
        """Stop before drafting position ``step``, given the drafter's distribution there.

        Called at every position, step 0 included (so rules can track history); the drafter
        ignores a stop at step 0 — the first token is always drafted.
        """

    def after_round(self, drafted: int, accepted: int, next_token: int | None = None) -> None:
        """Verification accepted ``accepted`` of ``drafted`` draft tokens, then the target chose
        ``next_token`` (its token at the position where drafting stopped, if all were accepted)."""

    def after_costs(self, drafted: int, draft_s: float, verify_s: float) -> None:
        """The round drafted ``drafted`` tokens in ``draft_s`` and verified them in ``verify_s`` (its
        share of a batched forward): for rules that weigh what drafting costs."""

    def state_dict(self) -> dict[str, Any]:
        return {"rule": self.name}


StopFactory = Callable[..., StopRule]
STOP_RULES: Registry[StopFactory] = Registry("stopping rule")


@STOP_RULES.register("static")
class Static(StopRule):
    """Never stop early: draft the whole budget (static-k with draft length k)."""

    name = "static"

    def should_stop(self, probs: torch.Tensor, step: int) -> bool:
        return False


@STOP_RULES.register("max-confidence")
class MaxConfidence(StopRule):
    """Stop if the drafter's top probability < h (h = 0.8)."""

    def __init__(self, *, h: float = 0.8) -> None:
        self.name, self.h = "max-confidence", h

    def should_stop(self, probs: torch.Tensor, step: int) -> bool:
        return float(probs.max()) < self.h


@STOP_RULES.register("svip")
class Svip(StopRule):
    """SVIP: stop if sqrt(entropy) > h (h = 0.6)."""

    def __init__(self, *, h: float = 0.6) -> None:
        self.name, self.h = "svip", h

    def should_stop(self, probs: torch.Tensor, step: int) -> bool:
        return math.sqrt(entropy(probs)) > self.h


@STOP_RULES.register("svip-difference")
class SvipDifference(StopRule):
    """Stop if sqrt(H_t) − sqrt(H_{t−1}) > h (h = 0.2): a spike in uncertainty."""

    def __init__(self, *, h: float = 0.2) -> None:
        self.name, self.h = "svip-difference", h
        self.previous: float | None = None

    def start_draft(self) -> None:
        self.previous = None

    def should_stop(self, probs: torch.Tensor, step: int) -> bool:
        current = math.sqrt(entropy(probs))
        spike = self.previous is not None and current - self.previous > self.h
        self.previous = current
        return spike


@STOP_RULES.register("logit-margin")
class LogitMargin(StopRule):
    """Stop if p(top-1) − p(top-2) < h (h = 0.2)."""

    def __init__(self, *, h: float = 0.2) -> None:
        self.name, self.h = "logit-margin", h

    def should_stop(self, probs: torch.Tensor, step: int) -> bool:
        first, second = top2(probs)
        return first - second < self.h


@STOP_RULES.register("heuristic")
class Heuristic(StopRule):
    """transformers' "heuristic" assisted-generation schedule as a rule: draft ``k`` tokens (first
    ``start``), then ``k + up`` after a round whose whole draft was accepted, else ``max(1, k − down)``.
    It reads no distribution: the length follows how this query's drafts fared (the arm's draft
    length caps it)."""

    def __init__(self, *, start: int = 4, up: int = 2, down: int = 1) -> None:
        if start < 1 or up < 0 or down < 0:
            raise DraftwiseError(f"heuristic: need start ≥ 1, up ≥ 0, down ≥ 0 (got {start}, {up}, {down})")
        self.name, self.k, self.up, self.down = "heuristic", start, up, down

    def should_stop(self, probs: torch.Tensor, step: int) -> bool:
        return step >= self.k

    def after_round(self, drafted: int, accepted: int, next_token: int | None = None) -> None:
        if drafted:
            self.k = self.k + self.up if accepted >= drafted else max(1, self.k - self.down)

    def state_dict(self) -> dict[str, Any]:
        return {"rule": self.name, "k": self.k}


def draft_pays(expected: float, survival: float, accept: float, drafted: int,
               round_s: Callable[[int], float]) -> bool:
    """Whether drafting one more token raises the round's expected tokens per second.

    ``expected`` tokens (1 + Σ survival so far: the target's own token always counts) over
    ``drafted`` tokens; the next one survives with ``survival × accept``. A round of n drafted
    tokens takes ``round_s(n)`` (drafting and verifying together).

    >>> line = lambda base, per: (lambda n: base + per * n)
    >>> draft_pays(1.0, 1.0, 0.9, 1, line(0.005, 0.0005))   # a likely token, cheap to draft and verify
    True
    >>> draft_pays(2.0, 0.3, 0.2, 2, line(0.005, 0.002))    # an unlikely one after two, dear per token
    False
    """
    return (expected + survival * accept) / round_s(drafted + 1) > expected / round_s(drafted)


class LineFit:
    """y ≈ a + b·n by weighted least squares with exponential forgetting (b, a kept non-negative)."""

    def __init__(self, a: float, b: float, prior: float, forget: float) -> None:
        self.a, self.b, self.forget = a, b, forget
        self.sums = np.zeros(5)  # Σw, Σw·n, Σw·n², Σw·y, Σw·n·y
        for n in (1, 4):  # the prior as observations at two lengths (a line needs two)
            self.add(n, a + b * n, prior / 2)

    def add(self, n: int, y: float, weight: float = 1.0) -> None:
        self.sums = self.sums * self.forget + weight * np.array([1.0, n, n * n, y, n * y])
        w, sn, snn, sy, sny = self.sums
        spread = w * snn - sn * sn
        if spread > 1e-12:
            self.b = max((w * sny - sn * sy) / spread, 0.0)
            self.a = max((sy - self.b * sn) / w, 0.0)


@dataclass
class RoundCostFit:
    """A round of n drafted tokens: drafting ``a + b·n`` seconds, verifying ``a + b·n``, each fitted
    online from the arm's measured rounds (n ≥ 1) and starting from a prior worth ``prior`` rounds:
    the zoo on a 2-core CPU as measured on 2026-11-21 (a drafter's
    first token 0.64 ms and 0.22 ms each further; verifying 2 tokens 4.97 ms, 9 tokens 6.44 ms). Any
    other device or load replaces the prior within tens of rounds."""

    prior: float = 4.0
    forget: float = 0.98

    def __post_init__(self) -> None:
        self.draft = LineFit(4.2e-4, 2.2e-4, self.prior, self.forget)
        self.verify = LineFit(4.76e-3, 2.1e-4, self.prior, self.forget)

    def add(self, n: int, draft_s: float, verify_s: float) -> None:
        self.draft.add(n, draft_s)
        self.verify.add(n, verify_s)

    @property
    def base_s(self) -> float:
        return self.draft.a + self.verify.a

    @property
    def per_token_s(self) -> float:
        return self.draft.b + self.verify.b


@STOP_RULES.register("gain")
class ExpectedGain(StopRule):
    """Draft the next token only while it raises the round's expected tokens per second (ours).

    Before each position the rule knows the drafter's confidence there (its top probability); a
    calibration learned online turns that into the chance the target accepts the token (per
    confidence bin, smoothed toward the confidence itself), the chances into the expected accepted
    length, and a cost model fitted to the arm's measured rounds (:class:`RoundCostFit`) into the
    round's time. It stops as soon as one more token would lower expected tokens / time — so drafts
    run long while the drafter is sure and verifying is cheap, and stop at the first doubtful
    token where verification is costly (a CPU, a large batch). What it learns is kept across the
    queries of a generator (``lasting``).
    """

    lasting = True

    def __init__(self, *, bins: int = 10, prior: float = 2.0) -> None:
        if bins < 1 or prior <= 0:
            raise DraftwiseError(f"gain: need bins ≥ 1 and prior > 0 (got bins={bins}, prior={prior})")
        self.name, self.bins = "gain", bins
        centers = (np.arange(bins) + 0.5) / bins
        self.hits, self.tries = prior * centers, np.full(bins, prior)
        self.costs = RoundCostFit()
        # Seconds of a round verifying n drafted tokens, where the engine prices rounds on the
        # machine's measured curve (draftwise.decision.pricing.RoundPrices): it then replaces the
        # fitted line's verification part, which misses the curve's jumps.
        self.verify_s: Callable[[int], float] | None = None
        self.start_draft()

    def round_s(self, drafted: int) -> float:
        """A round of ``drafted`` tokens: drafting them and verifying them."""
        c = self.costs
        if self.verify_s is None:
            return c.base_s + c.per_token_s * drafted
        return c.draft.a + c.draft.b * drafted + self.verify_s(drafted)

    def start_draft(self) -> None:
        self.expected, self.survival = 1.0, 1.0
        self.drafted_bins: list[int] = []  # the confidence bin of each token drafted this round

    def _bin(self, confidence: float) -> int:
        return min(int(confidence * self.bins), self.bins - 1)

    def should_stop(self, probs: torch.Tensor, step: int) -> bool:
        b = self._bin(float(probs.max()))
        accept = float(self.hits[b] / self.tries[b])
        if step > 0 and not draft_pays(self.expected, self.survival, accept, step, self.round_s):
            return True
        self.drafted_bins.append(b)
        self.survival *= accept
        self.expected += self.survival
        return False

    def after_round(self, drafted: int, accepted: int, next_token: int | None = None) -> None:
        # positions after the first rejection were never judged: only those up to it teach
        for i, b in enumerate(self.drafted_bins[: min(drafted, accepted + 1)]):
            self.tries[b] += 1.0
            self.hits[b] += float(i < accepted)

    def after_costs(self, drafted: int, draft_s: float, verify_s: float) -> None:
        if drafted > 0:
            self.costs.add(drafted, draft_s, verify_s)

    def state_dict(self) -> dict[str, Any]:
        c = self.costs
        return {"rule": self.name, "acceptance_by_confidence": (self.hits / self.tries).round(3).tolist(),
                "round_base_s": c.base_s, "round_per_token_s": c.per_token_s}


def adaedl_threshold(lam: float, rate: float, target: float, beta2: float, eps: float) -> float:
    """λ_{t+1} = β2·λ_t + (1 − β2)·(λ_t + ε·sign(α − rate)): raise λ (stop earlier) when the
    acceptance rate falls below its target α, lower it when above."""
    sign = (target > rate) - (target < rate)
    return beta2 * lam + (1 - beta2) * (lam + eps * sign)


@STOP_RULES.register("adaedl")
class AdaEDL(StopRule):
    """AdaEDL: stop if 1 − sqrt(γ·H) < λ_t, λ adapted after each draft toward acceptance rate α.

    TapOut App. A.1 gives the update but no values: the defaults here (γ = 1, λ₀ = 0.4 — at the
    start equivalent to SVIP's sqrt(H) > 0.6 —, α = 0.8, β1 = β2 = 0.9, ε = 0.01) are ours. The
    paper writes sign(α − r_t) with the raw rate although it also smooths the rate with β1; we
    use the smoothed rate, which is what the smoothing is for.
    """

    def __init__(self, *, gamma: float = 1.0, lam: float = 0.4, target: float = 0.8, beta1: float = 0.9,
                 beta2: float = 0.9, eps: float = 0.01) -> None:
        self.name = "adaedl"
        self.gamma, self.lam0, self.target, self.beta1, self.beta2, self.eps = gamma, lam, target, beta1, beta2, eps
        self.lam, self.rate = lam, target

    def should_stop(self, probs: torch.Tensor, step: int) -> bool:
        return 1.0 - math.sqrt(self.gamma * entropy(probs)) < self.lam

    def after_round(self, drafted: int, accepted: int, next_token: int | None = None) -> None:
        if drafted == 0:
            return
        self.rate = self.beta1 * self.rate + (1 - self.beta1) * accepted / drafted
        self.lam = adaedl_threshold(self.lam, self.rate, self.target, self.beta2, self.eps)

    def state_dict(self) -> dict[str, Any]:
        return {"rule": self.name, "lambda": self.lam, "rate": self.rate}


@STOP_RULES.register("tapout-token")
class TokenLevelTapOut(StopRule):
    """TapOut's token-level controller: every draft position is its own bandit over the rules.

    At position j the learner of j picks a rule, which decides stop / continue there; after
    verification each drafted position's learner gets reward 1 if its token was accepted, else 0.
    Position 0 is always drafted, so learners start at position 1. A *stop* also gets feedback
    (else a learner that picked a stopping rule would never learn): when every drafted token was
    accepted, the target's next token says whether the drafter's top token at the stop position
    would have been accepted — reward 1 if not (stopping was right), 0 if so.
    """

    def __init__(self, *, learner: str = "ts-beta",
                 rules: str = "static/max-confidence/svip/adaedl/svip-difference/logit-margin",
                 positions: int = 128, rng: Any = None) -> None:
        self.name = "tapout-token"
        self.rule_specs = [r for r in rules.split("/") if r]
        if not self.rule_specs or "tapout-token" in self.rule_specs:
            raise DraftwiseError("tapout-token: rules must list base rules separated by '/'")
        self.rules = [make_stop_rule(r) for r in self.rule_specs]
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.learner_spec, self.positions = f"{learner}:reward=length", positions
        make_policy(self.learner_spec, self.rule_specs, self.rng)  # fail now on a bad learner name
        self.learners: list[Any] = []  # one per draft position from 1, created when first reached
        self.chosen: list[int] = []
        self.stop_guess: int | None = None  # the drafter's top token where drafting stopped

    def start_draft(self) -> None:
        self.chosen = []
        self.stop_guess = None
        for rule in self.rules:
            rule.start_draft()

    def should_stop(self, probs: torch.Tensor, step: int) -> bool:
        decisions = [rule.should_stop(probs, step) for rule in self.rules]  # every rule sees every step
        if step == 0 or step > self.positions:
            return False
        while len(self.learners) < step:
            learner = make_policy(self.learner_spec, self.rule_specs, self.rng)
            learner.begin_query()
            self.learners.append(learner)
        arm = self.learners[step - 1].select()
        self.chosen.append(arm)
        if decisions[arm]:
            self.stop_guess = int(probs.argmax())
        return decisions[arm]

    def after_round(self, drafted: int, accepted: int, next_token: int | None = None) -> None:
        for rule in self.rules:
            rule.after_round(drafted, accepted, next_token)
        for position, arm in enumerate(self.chosen, start=1):
            if position < drafted:  # a continue decision: was its token accepted?
                self.learners[position - 1].observe(arm, 1.0 if position < accepted else 0.0)
            elif self.stop_guess is not None and accepted == drafted and next_token is not None:
                self.learners[position - 1].observe(arm, 0.0 if self.stop_guess == next_token else 1.0)

    def state_dict(self) -> dict[str, Any]:
        return {"rule": self.name, "learners": [p.state_dict() for p in self.learners[:8]]}


def make_stop_rule(spec: str, rng: Any = None) -> StopRule:
    """``"svip"``, ``"max-confidence:h=0.7"``, ``"adaedl:target=0.9"`` → a fresh rule.

    ``rng`` (a numpy Generator) goes to rules that make random choices (the token-level controller).
    """
    name, raw = split_spec(spec)
    factory = STOP_RULES.get(name)
    defaults = keyword_defaults(factory)
    takes_rng = defaults.pop("rng", "absent") != "absent"
    options = typed_options(f"stopping rule {name!r}", raw, defaults)
    return factory(**options, rng=rng) if takes_rng else factory(**options)


def stop_rule_names() -> list[str]:
    return list(STOP_RULES)


def validate_stop_spec(spec: str) -> None:
    if not spec:
        raise DraftwiseError("empty stopping rule; valid: " + ", ".join(stop_rule_names()))
    make_stop_rule(spec)
