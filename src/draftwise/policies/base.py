"""The policy contract, its registry, and spec parsing (``"ucb:beta=0.1,reward=be"``).

A policy chooses one arm per round and learns from what the round revealed:

* bandit feedback — ``update(arm, record)`` turns the round record into the reward of the
  played arm with the policy's feedback signal and calls ``observe(arm, reward)``;
* full-information feedback — a policy with ``full_information = True`` gets records whose
  ``counterfactual`` holds every arm's acceptance probabilities (the engine's evaluation phase)
  and may call ``observe_losses(losses)`` with one loss per arm;
* delayed feedback — a policy is free to queue what ``update`` gives it and use it later
  (the engine never looks inside), so delayed-feedback wrappers need no engine change.

Across queries every learner takes the common options ``keep`` (default False: reset per query,
as the papers do), ``decay`` (with ``keep``: shrink the accumulated evidence by this factor at each
new query) and ``prior`` / ``prior_weight`` (warm start: one initial mean reward, or weight for
full-information learners, per arm, worth ``prior_weight`` pseudo-observations).

Every random choice goes through the injected ``numpy.random.Generator``.
"""

from __future__ import annotations

import copy
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.options import keyword_defaults, split_spec, typed_options
from draftwise.policies.feedback import signal
from draftwise.registry import Registry
from draftwise.trace import RoundRecord


@dataclass(frozen=True)
class PolicyNeeds:
    """What a learner asks of the rounds that drive it, declared in one place: the engine, the batched
    engine and the vLLM proposer read this record, never the learner's other members."""

    full_information: bool = False  # every arm scored each round (the evaluation phase), no bandit reward
    hears_plain: bool = False  # told, every drafted round, what ``none`` would have earned
    context_on: tuple[str, ...] = ()  # the drafters whose having a proposal is the round's context
    keep: bool = False  # learns across queries: a query on a copy has its rounds replayed into it
    prompt_prior: float = 0.0  # > 0: warm-started from how well each drafter predicts the prompt
    supports_prior: bool = False  # takes a warm-start prior
    reward: str = "bd"  # the feedback signal its reward comes from
    priced: bool = True  # its lookup drafts are cut to the length that pays (draftwise.decision.pricing)


class Policy(ABC):
    """An online learner over a fixed list of arms (indices ``0..n_arms-1``)."""

    summary: ClassVar[str] = ""  # one line for `draftwise policies`
    full_information: ClassVar[bool] = False  # ask the engine for every arm's feedback each round
    # Hear, every drafted round, what the ``none`` arm would have earned (measured plain rounds;
    # the single-query engine plays one now and then to keep that measure): not in the papers.
    hears_plain: bool = False
    # Arms the round cannot afford (a batch's load makes a model drafter's tokens cost more than
    # they can earn), given for one ``select`` by the decision core (draftwise.decision.core): learners
    # that know how skip them; for the others the round plays ``none`` instead, and they hear that.
    blocked: frozenset[int] = frozenset()
    # Contextual learners: names of drafters whose having a proposal this round is the context
    # (the engine asks them before each ``select`` and calls ``set_context``).
    context_on: tuple[str, ...] = ()
    # Its lookups' drafts are cut to the length that pays at the machine's prices
    # (draftwise.decision.pricing): every learner's, not a fixed configuration's, which must stay fixed.
    priced: ClassVar[bool] = True
    # What a saved learner state holds (``draftwise serve --state``): the evidence each class adds, joined
    # along its bases (:func:`learned_attributes`). Configuration comes from the spec, per-query state
    # starts afresh and caches are rebuilt, so none of them is saved.
    learned: ClassVar[tuple[str, ...]] = ("queries",)

    def __init__(
        self,
        arms: Sequence[str],
        rng: np.random.Generator,
        *,
        reward: str = "bd",
        keep: bool = False,
        decay: float = 1.0,
        prior: str = "",
        prior_weight: float = 1.0,
        prompt_prior: float = 0.0,
    ) -> None:
        if not arms:
            raise DraftwiseError("a policy needs at least one arm")
        self.arms = list(arms)
        self.n_arms = len(self.arms)
        self.rng = rng
        self.reward = reward
        self._signal = signal(reward)
        # Across queries: reset per query (the papers' default) or keep the
        # learned statistics, shrunk by ``decay`` at each new query so old evidence fades.
        if not 0.0 <= decay <= 1.0:
            raise DraftwiseError(f"decay must be in [0, 1], got {decay}")
        if prior_weight < 0:
            raise DraftwiseError(f"prior_weight must be >= 0, got {prior_weight}")
        if prompt_prior < 0:
            raise DraftwiseError(f"prompt_prior must be >= 0, got {prompt_prior}")
        self.keep = keep
        self.decay = decay
        # Worth of the prompt prior in pseudo-observations (0: off): the engine scores every
        # drafter on the prompt's own tokens before the first round and warm-starts with that.
        self.prompt_prior = prompt_prior
        self.prior_weight = prior_weight
        self.prior = parse_prior(prior, self.arms) if prior else None
        self.queries = 0
        self.reset()
        self._apply_prior()

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def needs(self) -> PolicyNeeds:
        """What this learner asks of the rounds (:class:`PolicyNeeds`)."""
        return PolicyNeeds(full_information=self.full_information, hears_plain=self.hears_plain,
                           context_on=tuple(self.context_on), keep=self.keep, prompt_prior=self.prompt_prior,
                           supports_prior=self.supports_prior, reward=self.reward, priced=self.priced)

    def begin_query(self, rng: np.random.Generator | None = None) -> None:
        """Called before each query: reset (default), or keep the state shrunk by ``decay``. ``rng``: the
        generator the query's random choices draw from (a query's own seed), else the one it has."""
        if rng is not None:
            self.rng = rng
        if self.keep and self.queries > 0:
            self.decay_state(self.decay)
        else:
            self.reset()
            self._apply_prior()
        self.start_query()
        self.queries += 1

    def clone(self, rng: np.random.Generator) -> Policy:
        """A copy of this learner — everything it learned — whose random choices draw from ``rng``."""
        twin = copy.deepcopy(self)
        twin.rng = rng
        return twin

    @abstractmethod
    def reset(self) -> None:
        """Forget everything learned."""

    def start_query(self) -> None:
        """Reset what never outlives a query (e.g. a queue of delayed feedback). Default: nothing."""

    # Names of the attributes holding accumulated evidence (counts, sums, cumulative losses).
    # ``decay_state`` multiplies them; a learner with other state overrides it.
    decayed: ClassVar[tuple[str, ...]] = ()

    def decay_state(self, factor: float) -> None:
        """Shrink the accumulated evidence by ``factor`` (1 keeps everything, 0 forgets it)."""
        for name in self.decayed:
            setattr(self, name, getattr(self, name) * factor)

    def set_prior(self, means: Sequence[float], weight: float | None = None) -> None:
        """Warm start: one initial mean reward (or weight, for full-information learners) per arm."""
        if len(means) != self.n_arms:
            raise DraftwiseError(f"prior: expected {self.n_arms} values (one per arm), got {len(means)}")
        self.prior = np.asarray(means, dtype=float)
        if weight is not None:
            self.prior_weight = weight
        self._apply_prior()

    def _apply_prior(self) -> None:
        if self.prior is not None:
            self.warm_start(self.prior, self.prior_weight)

    @property
    def supports_prior(self) -> bool:
        return type(self).warm_start is not Policy.warm_start

    def warm_start(self, means: np.ndarray, weight: float) -> None:
        """Start from ``means`` worth ``weight`` pseudo-observations per arm."""
        raise DraftwiseError(f"{type(self).__name__} has no warm-start prior")

    # -- decisions and feedback ------------------------------------------------------------
    def context_key(self, proposed: tuple[int, ...], position: int) -> tuple[Hashable, ...]:
        """The context of a round from how many tokens each ``context_on`` drafter proposes and how
        many the answer has so far: which of them have a proposal (a contextual learner may add to it)."""
        return tuple(n > 0 for n in proposed)

    def set_context(self, key: tuple[Hashable, ...]) -> None:
        """Before ``select``: the round's :meth:`context_key` (a caller may add more to the key,
        e.g. a load bucket)."""

    @abstractmethod
    def select(self) -> int:
        """The arm to play this round."""

    def select_unblocked(self, blocked: frozenset[int]) -> int:
        """The arm to play this round, told which arms this round cannot afford: a learner that knows
        how (:attr:`blocked`) skips them; the others choose as always."""
        if not blocked:
            return self.select()
        self.blocked = blocked
        try:
            return self.select()
        finally:
            del self.blocked

    def update(self, arm: int, record: RoundRecord) -> float | None:
        """Learn from a finished round; returns the reward used (for the trace)."""
        reward = self._signal(record)
        self.observe(arm, reward)
        return reward

    @abstractmethod
    def observe(self, arm: int, reward: float) -> None:
        """Bandit feedback: the reward of the arm that was played."""

    # Learners that count a side observation (see ``side_update``) as evidence about its arm.
    side_observations: ClassVar[bool] = False

    def side_update(self, arm: int, record: RoundRecord) -> float | None:
        """A side observation: what ``arm`` would have earned in a round where another arm was
        played, known without playing it (a shorter draft of the same drafter: its outcome is the
        played draft's, truncated). Learners with ``side_observations`` add it to ``arm``'s evidence
        without counting a round; the others ignore it (returns None)."""
        if not self.side_observations:
            return None
        reward = self._signal(record)
        self.observe_side(arm, reward)
        return reward

    def observe_side(self, arm: int, reward: float) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not take side observations")

    def wants_evaluation(self, rounds: int, pending_tokens: int) -> bool:
        """Full-information learners: run the evaluation phase after this round?

        ``rounds`` rounds of this query are done and ``pending_tokens`` verified tokens await
        evaluation. Declining defers them (HedgeSpec's skipping updates): the engine evaluates
        them later in one batch and then delivers each deferred round's record, in order.
        """
        return True

    def observe_losses(self, losses: Sequence[float]) -> None:
        """Full-information feedback: one loss per arm (only full-information learners use it)."""
        raise NotImplementedError(f"{type(self).__name__} learns from bandit feedback only")

    def state_dict(self) -> dict[str, Any]:
        """A JSON-friendly snapshot of the learner's state."""
        return {"policy": type(self).__name__, "arms": self.arms, "reward": self.reward}

    def take_learned(self, other: Policy) -> None:
        """Take everything ``other`` — a learner of this class over these arms (a saved state, restored)
        — learned: its :attr:`learned` attributes; the configuration stays this learner's own."""
        for name in learned_attributes(self):
            setattr(self, name, getattr(other, name))

    def state_examples(self) -> dict[str, list[Any]]:
        """For a :attr:`learned` attribute whose fresh value does not show what it may hold (None, or an
        empty container): the shapes it may take. A loaded value must fit one of them."""
        return {}

    def check_state(self) -> None:
        """After a saved state is loaded: raise ``ValueError`` naming what does not hold together (values
        whose types and shapes fit, but not each other or the arms)."""


def learned_attributes(obj: Any) -> tuple[str, ...]:
    """The :attr:`Policy.learned` attributes of ``obj``'s class and its bases, bases first (also for the
    learners' helper objects, which declare theirs the same way)."""
    names: dict[str, None] = {}
    for cls in reversed(type(obj).__mro__):
        names.update(dict.fromkeys(vars(cls).get("learned", ())))
    return tuple(names)


History = Sequence[tuple[Hashable | None, int, RoundRecord]]  # per round: context (None: none), arm, record


def replay(learner: Policy, history: History) -> None:
    """Cross-query warm start (``keep``) for queries that learned on copies of ``learner`` (a batch,
    vLLM's requests): feed it one finished query's rounds, as if the queries had run one after
    another; later queries start from a copy of it (``begin_query`` applies ``decay``)."""
    learner.begin_query()
    for key, arm, record in history:
        if key is not None:
            learner.set_context(key)  # type: ignore[arg-type]
        learner.update(arm, record)


PolicyFactory = Callable[..., Policy]
POLICIES: Registry[PolicyFactory] = Registry("policy")
# Paper configurations by name (policies/presets.py): a policy, its options and its arm layout.
PRESETS: Registry[Any] = Registry("preset")


def register_policy(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Register a policy class (or a preset factory) under ``name``."""
    return POLICIES.register(name)


def policy_options(name: str) -> dict[str, Any]:
    """The options (with defaults) that ``name:key=value`` may set.

    A policy class whose ``__init__`` forwards ``**options`` to its parent also accepts the
    parent's options, up to those every learner has (``reward``, ``keep``, ``decay``, ``prior``,
    ``prior_weight``; see :class:`Policy`).
    """
    if name in PRESETS and name not in POLICIES:
        preset = PRESETS.get(name)
        base = policy_options(preset.policy)
        return {**base, **typed_options(f"preset {name!r}", preset.options, base)}
    factory = POLICIES.get(name)
    if not isinstance(factory, type):
        return keyword_defaults(factory, skip=("arms", "rng"))
    # Walk up the class hierarchy while each ``__init__`` forwards ``**options`` to its parent;
    # a subclass's default (e.g. ``reward="length"``) wins over its parent's.
    options: dict[str, Any] = {}
    for cls in factory.__mro__:
        init = vars(cls).get("__init__")
        if init is None:
            continue
        for key, value in keyword_defaults(init, skip=("self", "arms", "rng")).items():
            options.setdefault(key, value)
        if cls is Policy or not _forwards_options(init):
            break
    return options


def _forwards_options(init: Callable[..., Any]) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values())


def parse_prior(text: str, arms: Sequence[str]) -> np.ndarray:
    """Parse a warm-start prior: ``"0.9/0.5/0.2"`` (arm order) or ``"pld=0.9/lm=0.5"`` (by name).

    Arms not named by a by-name prior get the mean of the named ones.

    >>> parse_prior("b=0.8", ["a", "b"]).tolist()
    [0.8, 0.8]
    >>> parse_prior("0.1/0.2", ["a", "b"]).tolist()
    [0.1, 0.2]
    """
    items = [item.strip() for item in text.split("/") if item.strip()]
    try:
        if all("=" in item for item in items):
            named = {k.strip(): float(v) for k, v in (item.split("=", 1) for item in items)}
            unknown = sorted(set(named) - set(arms))
            if unknown:
                raise DraftwiseError(f"prior names unknown arms {unknown}; arms are: {', '.join(arms)}")
            fill = sum(named.values()) / len(named)
            return np.array([named.get(arm, fill) for arm in arms])
        values = [float(item) for item in items]
    except ValueError:
        raise DraftwiseError(f"bad prior {text!r}: expected numbers like 0.9/0.5 or name=0.9/name=0.5") from None
    if len(values) != len(arms):
        raise DraftwiseError(f"prior {text!r} has {len(values)} values for {len(arms)} arms")
    return np.array(values)


@dataclass(frozen=True)
class PolicySpec:
    """A policy spec parsed once: ``"ucb:beta=0.1"`` → the registered policy that runs, its typed options.

    A preset (``hedgespec``, …) resolves to its underlying policy with the preset's options under the
    user's; ``preset`` keeps it for its arm layout and draft budgets. ``text`` is the spec as written
    (logs, saved learner states).
    """

    text: str
    name: str  # the registered policy class or factory
    options: Mapping[str, Any] = field(default_factory=dict)  # typed: what the spec (and its preset) set
    preset: Any = None  # the preset (draftwise.policies.presets.Preset) it names, if any

    @property
    def default_arms(self) -> str | None:
        """The arm layout this policy plays unless told otherwise: its preset's, else its class's."""
        if self.preset is not None:
            return str(self.preset.arms)
        return getattr(POLICIES.get(self.name), "default_arms", None)

    def with_defaults(self, **options: Any) -> PolicySpec:
        """The spec with ``options`` filled in where it sets none of them (checked like the spec's own)."""
        known = policy_options(self.name)
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise DraftwiseError(f"policy {self.name!r} takes no option {unknown[0]!r}")
        return replace(self, options={**options, **self.options})


def parse_policy(spec: str | PolicySpec) -> PolicySpec:
    """``"ucb"``, ``"ucb:beta=0.1,reward=be"``, ``"fixed:pld"`` or a preset → a :class:`PolicySpec`
    (an unknown name or option raises one clear error)."""
    if isinstance(spec, PolicySpec):
        return spec
    name, raw = _split_policy_spec(spec)
    defaults = policy_options(_known(name))
    options = typed_options(f"policy {name!r}", raw, defaults)
    if name in PRESETS and name not in POLICIES:  # a preset: its options, then the user's overrides
        preset = PRESETS.get(name)
        options = {**typed_options(f"preset {spec!r}", preset.options, defaults), **options}
        return PolicySpec(spec, preset.policy, options, preset)
    return PolicySpec(spec, name, options)


def make_policy(spec: str | PolicySpec, arms: Sequence[str], rng: np.random.Generator) -> Policy:
    """Build a policy from a spec such as ``"ucb"``, ``"ucb:beta=0.1,reward=be"`` or ``"fixed:pld"``
    (or one parsed already)."""
    parsed = parse_policy(spec)
    return POLICIES.get(parsed.name)(arms, rng, **parsed.options)


def _known(name: str) -> str:
    """Fail with every valid name (policies and presets) when ``name`` is neither."""
    if name not in POLICIES and name not in PRESETS:
        valid = ", ".join(sorted([*POLICIES, *PRESETS]))
        raise DraftwiseError(f"unknown policy {name!r}; valid: {valid}")
    return name


def _split_policy_spec(spec: str) -> tuple[str, dict[str, str]]:
    # ``fixed:NAME`` is shorthand for ``fixed:arm=NAME``.
    head, _, rest = spec.partition(":")
    if rest and "=" not in rest.split(",")[0]:
        first, _, more = rest.partition(",")
        spec = f"{head}:arm={first}" + (f",{more}" if more else "")
    return split_spec(spec)
