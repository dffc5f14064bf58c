"""Arms: what a policy chooses among. An arm is a drafter (or none), a draft budget and, for LM
drafters, an optional dynamic stopping rule.

Layouts (``--arms``):

* ``drafters`` — one arm per drafter at the draft length (MetaSD, HedgeSpec, BanditSpec §6.1);
* ``lengths`` — draft lengths 0 (no speculation), 1, …, L of one drafter (BanditSpec §6.2);
* ``stops`` — the stopping rules of one model drafter, up to a max draft length (TapOut);
* ``drafters×stops`` — every model drafter with every rule, plus the other drafters as they are;
* ``cascade`` — draftwise's own: one lookup drafter (suffix, else PLD) with long drafts, one *routed* arm over the
  model drafters (which one is picked per query by how well each predicts the prompt), and no
  speculation; made for the ``ctx-ucb`` policy (the default);
* an explicit list ``code@6+svip,pld@3,none`` (``DRAFTER[@LEN][+RULE]``; ``auto@4`` is the routed arm;
  ``pld|suffix@8`` is a union of lookups: each proposes, one trie of their drafts is verified;
  ``suffix/pld@8`` a pick: each proposes, the longest draft is verified — ties to the first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from draftwise.drafters import Drafter, ModelDrafter
from draftwise.drafters.stopping import validate_stop_spec
from draftwise.errors import DraftwiseError
from draftwise.registry import Registry

NONE = "none"
CASCADE_LOOKUPS = ("suffix", "pld")  # the cascade layout's lookup, in order of preference
# The cascade's routed model arm drafts while each next token pays at the machine's prices (the
# ``gain`` rule: calibrated confidence against measured round costs): SmolLM2 in int4 on zoo:dev,
# 1.39 vs 1.34× plain decoding at 1 thread and 1.42–1.43 vs 1.39× at 2 (docs/design.md, "Policies").
CASCADE_MODEL_STOP = "gain"
# Where the pool holds a generalist (:func:`generalist_of`), the model arm is that drafter alone, no
# routing, up to the short lookup length (the int4 kernel's four rows) while its top token's
# probability stays ≥ 0.3: SmolLM2 in int4, zoo:dev, 1.397 against 1.360× plain decoding with the
# generalist at 4 tokens under ``gain`` and 1.361× the routed arm (docs/design.md, "Policies").
GENERALIST_STOP = "max-confidence:h=0.3"
AUTO = "auto"  # the routed arm's drafter name in explicit lists
TAPOUT_RULES = ("static", "max-confidence", "svip", "adaedl", "svip-difference", "logit-margin")


@dataclass(frozen=True)
class Arm:
    """One choice a policy can make."""

    name: str
    drafter: int | None  # index into the drafter pool; None = no speculation (plain decoding)
    draft_len: int  # the draft budget (max length under a stopping rule)
    stop: str | None = None  # stopping-rule spec for model drafters
    # A routed arm: the engine picks its drafter among these at the start of each query, by
    # each one's top-1 accuracy on the prompt (``drafter`` is then only the first candidate).
    route: tuple[int, ...] = ()
    # A union arm (``pld|suffix@8``): these lookups propose too, and their drafts are merged with
    # the first drafter's into one trie (draftwise.verify.tree.union_of), verified in the same forward.
    # A pick arm (``suffix/pld@8``, ``pick``): they propose too, and the longest draft is verified.
    also: tuple[int, ...] = ()
    pick: bool = False

    @property
    def lookups(self) -> tuple[int, ...]:
        """The drafters that propose when this arm plays (several for a union or a pick)."""
        return () if self.drafter is None else (self.drafter, *self.also)


@dataclass(frozen=True)
class ArmSettings:
    draft_len: int = 4  # draft tokens per round (drafters layout, static rules)
    max_draft: int = 16  # draft budget under dynamic stopping rules (TapOut used 128 as "unbounded")
    stops: tuple[str, ...] = TAPOUT_RULES  # rules for the stops layouts
    drafter: str | None = None  # the drafter of the lengths / stops layouts (default: the first fitting one)


Layout = Callable[[Sequence[Drafter], ArmSettings], list[Arm]]
LAYOUTS: Registry[Layout] = Registry("arm layout")


def _arm(drafters: Sequence[Drafter], index: int | None, length: int, stop: str | None = None) -> Arm:
    if index is None or length == 0:
        return Arm(NONE, None, 0)
    name = drafters[index].name
    if stop is not None:
        name = f"{name}+{stop}"
    return Arm(name, index, length, stop)


def _stop_length(stop: str, settings: ArmSettings) -> int:
    return settings.draft_len if stop.split(":")[0] == "static" else settings.max_draft


@LAYOUTS.register("drafters")
def drafter_arms(drafters: Sequence[Drafter], settings: ArmSettings) -> list[Arm]:
    return [_arm(drafters, i, settings.draft_len) for i in range(len(drafters))]


@LAYOUTS.register("lengths")
def length_arms(drafters: Sequence[Drafter], settings: ArmSettings) -> list[Arm]:
    index = _pick(drafters, settings.drafter, model_only=False, layout="lengths")
    return [Arm(NONE, None, 0)] + [
        Arm(f"{drafters[index].name}@{k}", index, k) for k in range(1, settings.draft_len + 1)
    ]


@LAYOUTS.register("stops")
def stop_arms(drafters: Sequence[Drafter], settings: ArmSettings) -> list[Arm]:
    index = _pick(drafters, settings.drafter, model_only=True, layout="stops")
    return [_arm(drafters, index, _stop_length(s, settings), s) for s in settings.stops]


@LAYOUTS.register("drafters×stops")
def drafter_stop_arms(drafters: Sequence[Drafter], settings: ArmSettings) -> list[Arm]:
    arms: list[Arm] = []
    for i, drafter in enumerate(drafters):
        if isinstance(drafter, ModelDrafter):
            arms.extend(_arm(drafters, i, _stop_length(s, settings), s) for s in settings.stops)
        else:
            arms.append(_arm(drafters, i, settings.draft_len))
    return arms


def generalist_of(drafters: Sequence[Drafter]) -> int | None:
    """The first model drafter trained on every domain any other model drafter of the pool was (the
    zoo's generalist beside its specialists), where every one's domains are known; else None."""
    models = {i: set(d.domains) for i, d in enumerate(drafters) if isinstance(d, ModelDrafter)}
    if len(models) < 2 or not all(models.values()):
        return None  # one model drafter needs no routing; one of unknown domains may fit any query
    every = set().union(*models.values())
    return next((i for i, domains in models.items() if domains >= every), None)


def routed_arm(drafters: Sequence[Drafter], length: int, stop: str | None = None) -> Arm | None:
    """One arm over all model drafters, routed per query; a plain arm when there is only one."""
    models = tuple(i for i, d in enumerate(drafters) if isinstance(d, ModelDrafter))
    if not models:
        return None
    if len(models) == 1:
        return _arm(drafters, models[0], length, stop)
    return Arm(f"{AUTO}@{length}" + (f"+{stop}" if stop else ""), models[0], length, stop, route=models)


def lookup_lengths(draft_len: int) -> tuple[int, ...]:
    """The cascade's lookup lengths: twice the draft length, where verifying many tokens costs little
    more than a few (float32 CPU targets), and just under it, where each verified token costs more
    (the 4-bit kernel works on rows in fours: on SmolLM2, 3 drafted tokens cost 1.08–1.21× a plain
    step and 8 drafted 1.98–2.56×: BENCHMARKS.md, "The machine's cost curve")."""
    return tuple(dict.fromkeys((2 * draft_len, max(draft_len - 1, 1))))


@LAYOUTS.register("cascade")
def cascade_arms(drafters: Sequence[Drafter], settings: ArmSettings) -> list[Arm]:
    """The lookup at two lengths (:func:`lookup_lengths`: proposing costs nothing, and which length
    pays depends on the target's cost curve, which the learner measures), the routed model arm, and
    no speculation. On the dev split the short lookup arm added +5.7 % on SmolLM2 in int4 and +2.2 %
    on the toy target (2026-11-28, docs/design.md, "Policies").

    The lookup is ``arm_drafter`` when given; else, with both in the pool, a pick of ``suffix``
    and ``pld`` (each proposes, the longer draft is verified): +3–5 % over suffix alone on the dev
    split and on self_instruct, greedy and at T 0.7 (docs/design.md, "Policies"); else ``suffix``,
    else ``pld``, else the first lookup. More lookup *arms* measured slower; suffix leads because
    its trie holds the prompt *and* earlier answers, and its drafts were longer on prompts the
    project never tuned on (docs/design.md, "Policies")."""
    lookups = [i for i, d in enumerate(drafters) if not isinstance(d, ModelDrafter)]
    names = [drafters[i].name for i in lookups]
    preferred = [n for n in CASCADE_LOOKUPS if n in names]
    wanted = settings.drafter or (preferred[0] if preferred else names[0] if names else None)
    if wanted is not None and wanted not in names:
        raise DraftwiseError(
            f"no lookup drafter {wanted!r} for the cascade layout; lookups: {', '.join(names) or 'none'}")
    arms = []
    lengths = lookup_lengths(settings.draft_len)
    for length in lengths:
        if settings.drafter is None and len(preferred) == len(CASCADE_LOOKUPS):
            picked = [lookups[names.index(n)] for n in preferred]
            arms.append(Arm(f"{'/'.join(preferred)}@{length}", picked[0], length, also=tuple(picked[1:]),
                            pick=True))
        elif wanted is not None:
            arms.append(Arm(f"{wanted}@{length}", lookups[names.index(wanted)], length))
    general, short = generalist_of(drafters), lengths[-1]
    model = (Arm(f"{drafters[general].name}@{short}+{GENERALIST_STOP}", general, short, GENERALIST_STOP)
             if general is not None else routed_arm(drafters, settings.draft_len, CASCADE_MODEL_STOP))
    return arms + ([model] if model else []) + [Arm(NONE, None, 0)]


def lookups_among(arms: Sequence[Arm], drafters: Sequence[Drafter]) -> list[str]:
    """The lookup drafters the arms draft with (a union arm's too), in order, once each."""
    indices = [i for arm in arms for i in (arm.drafter, *arm.also) if i is not None]
    return list(dict.fromkeys(drafters[i].name for i in indices if not isinstance(drafters[i], ModelDrafter)))


def model_arms(arms: Sequence[Arm], drafters: Sequence[Drafter]) -> frozenset[int]:
    """The arms that draft with a model drafter (a routed arm's candidates are all model drafters):
    in a batch each one's draft runs while every other row waits."""
    return frozenset(i for i, arm in enumerate(arms)
                     if arm.drafter is not None and isinstance(drafters[arm.drafter], ModelDrafter))


LAYOUT_ALIASES = {
    "drafters*stops": "drafters×stops",
    "drafters-x-stops": "drafters×stops",
    "drafters_x_stops": "drafters×stops",
}


def build_arms(layout: str, drafters: Sequence[Drafter], settings: ArmSettings) -> list[Arm]:
    """Arms for a layout name or an explicit list; with no drafter, the single arm 'none'."""
    for rule in settings.stops:
        validate_stop_spec(rule)
    if not drafters:
        return [Arm(NONE, None, 0)]
    layout = LAYOUT_ALIASES.get(layout, layout)
    if layout in LAYOUTS:
        arms = LAYOUTS.get(layout)(drafters, settings)
    elif "," in layout or "@" in layout or "+" in layout or layout == NONE or _find(drafters, layout) is not None:
        arms = [parse_arm(item.strip(), drafters, settings) for item in layout.split(",") if item.strip()]
    else:
        raise DraftwiseError(
            f"unknown arm layout {layout!r}; valid: {', '.join(LAYOUTS)}, or a list such as 'code@6+svip,pld@3,none'")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise DraftwiseError(f"arms must be distinct; got {', '.join(names)}")
    return arms


def parse_arm(text: str, drafters: Sequence[Drafter], settings: ArmSettings) -> Arm:
    """``DRAFTER[@LEN][+RULE]`` or ``none``.

    >>> from draftwise.drafters import PromptLookupDrafter
    >>> parse_arm("pld@3", [PromptLookupDrafter()], ArmSettings())
    Arm(name='pld@3', drafter=0, draft_len=3, stop=None, route=(), also=(), pick=False)
    """
    if text == NONE:
        return Arm(NONE, None, 0)
    head, plus, stop = text.partition("+")
    name, at, length_text = head.partition("@")
    if name == AUTO and _find(drafters, AUTO) is None:
        length = _length(text, length_text if at else None, settings.draft_len)
        if plus:
            validate_stop_spec(stop)
        routed = routed_arm(drafters, length, stop if plus else None)
        if routed is None or length < 1:
            raise DraftwiseError(f"arm {text!r}: the routed arm needs a model drafter in the pool and a length ≥ 1")
        return routed
    for sign, kind in JOINS.items():
        if sign in name:
            if plus:
                raise DraftwiseError(
                    f"arm {text!r}: stopping rules apply to model drafters, not to a {kind} of lookups")
            return _joined_arm(text, name, sign, length_text if at else None, drafters, settings)
    index = _find(drafters, name)
    if index is None:
        raise DraftwiseError(f"arm {text!r}: no drafter {name!r}; drafters are: {', '.join(d.name for d in drafters)}")
    if plus:
        validate_stop_spec(stop)
        if not isinstance(drafters[index], ModelDrafter):
            raise DraftwiseError(f"arm {text!r}: stopping rules apply to model drafters only (they judge its "
                                 f"distribution), not {name!r}")
    length = _length(text, length_text if at else None, _stop_length(stop, settings) if plus else settings.draft_len)
    if length < 0:
        raise DraftwiseError(f"arm {text!r}: draft length must be ≥ 0")
    if length == 0:
        return Arm(NONE, None, 0)
    return Arm(text, index, length, stop if plus else None)


JOINS = {"|": "union", "/": "pick"}  # how an arm joins several lookups: one trie of them all, or the longest


def _joined_arm(text: str, names: str, sign: str, length_text: str | None, drafters: Sequence[Drafter],
                settings: ArmSettings) -> Arm:
    """``pld|suffix@8`` (a union) or ``suffix/pld@8`` (a pick): lookups (point masses) only — a
    model drafter's draft is a distribution."""
    kind = JOINS[sign]
    indices = []
    for name in names.split(sign):
        index = _find(drafters, name)
        if index is None or isinstance(drafters[index], ModelDrafter):
            lookups = ", ".join(d.name for d in drafters if not isinstance(d, ModelDrafter)) or "none"
            raise DraftwiseError(f"arm {text!r}: a {kind} joins lookup drafters in the pool ({lookups}), not {name!r}")
        indices.append(index)
    length = _length(text, length_text, settings.draft_len)
    if length < 1 or len(set(indices)) != len(indices):
        raise DraftwiseError(f"arm {text!r}: a {kind} needs distinct lookups and a length ≥ 1")
    return Arm(text, indices[0], length, None, also=tuple(indices[1:]), pick=kind == "pick")


def _length(text: str, length_text: str | None, default: int) -> int:
    """The arm's ``@LEN`` (``default`` without one), or one clear error for a length that is no integer."""
    if length_text is None:
        return default
    try:
        return int(length_text)
    except ValueError:
        raise DraftwiseError(f"arm {text!r}: draft length {length_text!r} is not an integer") from None


def _find(drafters: Sequence[Drafter], name: str) -> int | None:
    return next((i for i, d in enumerate(drafters) if d.name == name), None)


def _pick(drafters: Sequence[Drafter], name: str | None, *, model_only: bool, layout: str) -> int:
    if name is not None:
        index = _find(drafters, name)
        if index is None:
            raise DraftwiseError(
                f"no drafter {name!r} for the {layout} layout; drafters: {', '.join(d.name for d in drafters)}")
        return index
    for i, drafter in enumerate(drafters):
        if not model_only or isinstance(drafter, ModelDrafter):
            return i
    raise DraftwiseError(f"the {layout} layout needs a model drafter (stopping rules read its distribution)")
