"""What a pool is set up with, parsed once where it enters (the API, the CLI, the server, the bench):
the drafters, the learner (a :class:`~draftwise.policies.base.PolicySpec`) and the arms it chooses among.

Explicit arguments win over the policy preset's, which win over the defaults::

    >>> setup = Setup.parse("banditspec-length")
    >>> setup.policy.name, setup.layout, setup.arms.draft_len
    ('ucbspec', 'lengths', 4)
    >>> Setup.parse("banditspec-length", draft_len=3, arms="drafters").layout
    'drafters'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from draftwise.decision.arms import ArmSettings
from draftwise.errors import DraftwiseError
from draftwise.policies import PolicySpec, parse_policy

# draftwise's own learner (docs/policies.md): UCB per context — does each lookup propose this round —
# over the lookups' long drafts, a model drafter (the generalist, else routed) and no speculation,
# rewarded by measured tokens/s. Each arm pays where it is cheap: a lookup's match is known before the
# round, and a model arm is kept only where the machine's measured costs say it pays. The answer's first
# 16 tokens are a context of their own: lookups rarely match there, and under load what those rounds
# teach would stop a query drafting for the rest of its answer. A one-token match counts as no match
# (``min_match=2``): where the model drafter pays it drafts better there. How it does against the best
# single drafter: docs/policies.md, "How it does"; the reasons, measured: docs/design.md, "Policies".
DEFAULT_POLICY = "ctx-ucb:opening=16,follow=1,min_match=2"
DEFAULT_DRAFT_LEN = 4  # draft tokens per round; verifying 5 tokens costs 1.4–1.9× one on CPUs (BENCHMARKS.md)
DEFAULT_LAYOUT = "drafters"


@dataclass(frozen=True)
class Setup:
    """A pool's learner and arms, checked: an unknown policy, option or bad length raised at :meth:`parse`."""

    policy: PolicySpec
    layout: str  # drafters, lengths, stops, drafters×stops, cascade or an explicit list (draftwise.decision.arms)
    arms: ArmSettings
    drafters: tuple[str, ...] | None = None  # drafter specs (None: the target's default pool)

    @classmethod
    def parse(cls, policy: str | PolicySpec = DEFAULT_POLICY, *, drafters: Sequence[str] | None = None,
              draft_len: int | None = None, arms: str | None = None, max_draft: int | None = None,
              stops: Sequence[str] | None = None, arm_drafter: str | None = None) -> Setup:
        spec = parse_policy(policy)
        preset = spec.preset

        def pick(value: Any, preset_value: Any, default: Any) -> Any:
            return value if value is not None else (preset_value if preset_value is not None else default)

        settings = ArmSettings(
            draft_len=pick(draft_len, preset and preset.draft_len, DEFAULT_DRAFT_LEN),
            max_draft=pick(max_draft, preset and preset.max_draft, ArmSettings.max_draft),
            stops=tuple(pick(stops, preset and preset.stops, ArmSettings.stops)),
            drafter=arm_drafter,
        )
        for key in ("draft_len", "max_draft"):
            if getattr(settings, key) < 1:
                raise DraftwiseError(f"{key} must be ≥ 1, got {getattr(settings, key)}")
        layout = pick(arms, None, spec.default_arms or DEFAULT_LAYOUT)
        return cls(spec, layout, settings, None if drafters is None else tuple(drafters))
