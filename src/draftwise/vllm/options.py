"""draftwise's own options for the vLLM proposer, and where they come from.

vLLM builds the proposer from ``speculative_config`` alone (``method="custom_class"``), which has
no room for draftwise's settings, so they travel in an environment variable that the server and
its worker processes inherit:

* ``DRAFTWISE_VLLM_CONFIG`` — a path to a JSON or TOML file, or an inline JSON object
  (``'{"policy": "metasd-ucb", "drafters": ["pld", "suffix"]}'``).

Keys (all optional): ``policy`` (a draftwise policy or preset spec, default ``ctx-ucb:follow=1,min_match=2``),
``drafters`` (drafter specs, default ``["arctic-suffix:name=suffix"]`` where arctic-inference is
installed, else ``["suffix"]``: the same method either way, plus the zoo's generalist LM drafter where
the zoo has one distilled for the served model's vocabulary; see ``default_drafters``), ``arms`` (an
arm layout or explicit list, default: the policy's own, see :func:`default_arms`), ``draft_len`` (default: vLLM's
``num_speculative_tokens``, which caps every draft), ``mode`` (``request``: one learner per request,
the default; ``batch``: BanditSpec §6.2, one draft length for the whole batch chosen by UCBSpec — the
``banditspec-length`` preset unless ``policy`` names another — one learner per load bucket, each
step also a side observation of every shorter length),
``batch_lengths`` (the batch mode's arms, default ``0..draft_len``), ``load_context`` (add the
batch-size bucket to contextual learners' context, default false: the reward is already in
units of the current load's plain step, and without it a new load starts from what the last
one taught), ``time_unit`` (``plain-step``
or ``seconds``, see :mod:`draftwise.decision.step_costs`), ``free_none`` (in plain-step units a round
without speculation is worth exactly one token per unit, so the learner is told so after every
drafted round, as if it had also played ``none``; default true; needs ``time_unit="plain-step"``),
``cap_acceptance`` (the load-aware length cap: every
draft is cut to the length that would pay most, at the measured step costs, for a drafter accepting
each token with this probability — 0 under heavy load, where the proposer then skips drafting
altogether; 0 disables the cap; default 0.9), ``admit`` (default true: each step, the lookup
drafts' tokens are ranked by their predicted acceptance — learned from every verified draft, by
how long a stretch the lookup matched — and only as many go to vLLM as pay for the step they
lengthen, so a loaded batch verifies only the tokens likely kept), ``gate`` (default true: under load, a step's
requests draft only where drafting steps have emitted more tokens for their time than plain steps at
that load, both measured — one step in 16 still drafts, and one in 32 stays plain, to keep
measuring; a lone request always drafts), ``seed``, ``stats_file`` (a JSONL file that gets
one line of statistics per finished request), ``log_requests`` (log that line too, default true).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from draftwise.drafters.arctic_suffix import arctic_available
from draftwise.errors import DraftwiseError
from draftwise.zoo.load import zoo_generalist

ENV_VAR = "DRAFTWISE_VLLM_CONFIG"
MODES = ("request", "batch")
TIME_UNITS = ("plain-step", "seconds")
# The engine's default learner without its `opening=16` (which did not pay under vLLM): a trie
# proposal of two tokens or more is played, its tokens admitted by predicted acceptance, and the
# learner chooses between the generalist and no draft elsewhere (in the engine a one-token suffix
# match was accepted 22 % of the time). On SmolLM2 at one request: 1.03× plain `ctx-ucb` on zoo:test (48
# prompts, 2 repeats; `min_match=2` alone 1.05× and 1.03× in two runs), 1.02× on self_instruct; the
# same at 8 and 32 requests (BENCHMARKS.md, "vLLM").
DEFAULT_POLICY = "ctx-ucb:follow=1,min_match=2"
# The suffix method alone: its trie holds the prompt (what PLD looks up) and earlier responses. With
# PLD beside it the default learner ran 0.87–0.94× its speed at c = 1–32 in vLLM on a 2-core CPU
# (interleaved, `benchmarks/vllm_throughput.py --interleaved`, 2026-11-26; docs/design.md, "vLLM
# proposer"): a second lookup every step, and an arm to explore in every request.
DEFAULT_DRAFTERS = ("suffix",)
# The same method on Arctic Inference's C++ tries, where that package is installed (vLLM's own
# `suffix` method needs it too): the Python trie's upkeep is paid per request per step, and at
# c = 4–32 it cost the proposer 11–16 % of its throughput (BENCHMARKS.md, "vLLM").
# Named `suffix` either way, so that arms and statistics do not change with what is installed.
NATIVE_DRAFTERS = ("arctic-suffix:name=suffix",)


def default_lookups() -> tuple[str, ...]:
    """The default lookup drafter: ``arctic-suffix`` (named ``suffix``) where arctic-inference
    imports, else ``suffix``."""
    return NATIVE_DRAFTERS if arctic_available() else DEFAULT_DRAFTERS


def default_drafters(vocab_size: int) -> tuple[str, ...]:
    """The default lookup drafter (:func:`default_lookups`); then the zoo's generalist LM drafter for a
    served model of ``vocab_size`` tokens, where the zoo has one: on SmolLM2 at one request it made
    the proposer 1.05–1.11× vLLM's ``suffix:8`` (BENCHMARKS.md, "vLLM").
    The toy zoo target's generalist is not one of them: its 2 ms step is too short for a model
    drafter to pay (1.83 against 1.94× no speculation at one request)."""
    lookups = default_lookups()
    generalist = zoo_generalist(vocab_size)
    return lookups if generalist is None else (*lookups, generalist)


@dataclass(frozen=True)
class ProposerOptions:
    """Everything draftwise needs besides what vLLM's config says."""

    policy: str = DEFAULT_POLICY
    drafters: tuple[str, ...] | None = None  # None: default_drafters for the served model
    arms: str = ""  # "" = the policy's own layout (default_arms)
    draft_len: int = 0  # 0 = vLLM's num_speculative_tokens
    mode: str = "request"
    batch_lengths: tuple[int, ...] = ()  # () = 0..draft_len
    load_context: bool = False
    time_unit: str = "plain-step"
    free_none: bool = True
    cap_acceptance: float = 0.9
    admit: bool = True
    gate: bool = True
    seed: int = 0
    stats_file: str = ""
    log_requests: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)  # unknown keys, rejected by validate()

    def validate(self) -> None:
        """Raise one :class:`DraftwiseError` naming what is wrong (checked at start-up)."""
        if self.extra:
            valid = ", ".join(f.name for f in fields(self) if f.name != "extra")
            raise DraftwiseError(f"{ENV_VAR}: unknown option(s) {', '.join(sorted(self.extra))}; valid: {valid}")
        if self.mode not in MODES:
            raise DraftwiseError(f"{ENV_VAR}: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.time_unit not in TIME_UNITS:
            raise DraftwiseError(f"{ENV_VAR}: time_unit must be one of {', '.join(TIME_UNITS)}, got {self.time_unit!r}")
        if self.draft_len < 0:
            raise DraftwiseError(f"{ENV_VAR}: draft_len must be ≥ 0 (0 = num_speculative_tokens), got {self.draft_len}")
        if any(length < 0 for length in self.batch_lengths):
            raise DraftwiseError(f"{ENV_VAR}: batch_lengths must be ≥ 0, got {list(self.batch_lengths)}")
        if not 0.0 <= self.cap_acceptance < 1.0:
            raise DraftwiseError(f"{ENV_VAR}: cap_acceptance must be in [0, 1), got {self.cap_acceptance}")
        if self.free_none and self.time_unit != "plain-step":
            raise DraftwiseError(f"{ENV_VAR}: free_none needs time_unit='plain-step' (set free_none to false)")
        if self.drafters is not None and not self.drafters and self.mode == "batch":
            raise DraftwiseError(f"{ENV_VAR}: the batch mode needs at least one drafter")


def drafter_specs(options: ProposerOptions, vocab_size: int) -> tuple[str, ...]:
    """The drafters the proposer builds: the options' own, else the default for the served model."""
    return default_drafters(vocab_size) if options.drafters is None else options.drafters


def options_from_mapping(raw: Mapping[str, Any]) -> ProposerOptions:
    """Build options from a parsed JSON/TOML object; unknown keys are kept to be reported."""
    known = {f.name for f in fields(ProposerOptions)} - {"extra"}
    values: dict[str, Any] = {k: v for k, v in raw.items() if k in known}
    extra = {k: v for k, v in raw.items() if k not in known}
    try:
        if isinstance(values.get("drafters"), str):
            values["drafters"] = [values["drafters"]]
        for key in ("drafters", "batch_lengths"):
            if key in values:
                values[key] = tuple(values[key])
        for key, kind in (("cap_acceptance", float), ("draft_len", int), ("seed", int), ("policy", str),
                          ("arms", str), ("mode", str),
                          ("time_unit", str), ("stats_file", str)):
            if key in values:
                values[key] = kind(values[key])
        values["batch_lengths"] = tuple(int(x) for x in values.get("batch_lengths", ()))
        for key in ("load_context", "log_requests", "free_none", "admit", "gate"):
            if key in values and not isinstance(values[key], bool):
                raise TypeError(f"{key} must be true or false")
    except (TypeError, ValueError) as exc:
        raise DraftwiseError(f"{ENV_VAR}: bad option value ({exc})") from None
    return ProposerOptions(**values, extra=extra)


def parse_config_text(text: str, origin: str) -> dict[str, Any]:
    """A JSON object (or TOML document, for ``*.toml`` origins) → dict, with one clear error."""
    try:
        if origin.endswith(".toml"):
            data: Any = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as exc:
        raise DraftwiseError(f"{ENV_VAR}: cannot parse {origin}: {exc}") from None
    if not isinstance(data, dict):
        raise DraftwiseError(f"{ENV_VAR}: {origin} must hold an object of options, got {type(data).__name__}")
    return data


def load_options(environ: Mapping[str, str] | None = None) -> ProposerOptions:
    """Options from ``$DRAFTWISE_VLLM_CONFIG`` (a file path or inline JSON); defaults when unset."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if not value:
        return ProposerOptions()
    if value.startswith("{"):
        raw = parse_config_text(value, "the inline JSON")
    else:
        path = Path(value).expanduser()
        if not path.is_file():
            raise DraftwiseError(f"{ENV_VAR}={value!r}: no such file (give a JSON/TOML file or an inline JSON object)")
        raw = parse_config_text(path.read_text(encoding="utf-8"), str(path))
    options = options_from_mapping(raw)
    options.validate()
    return options
