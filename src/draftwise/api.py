"""The public face: ``Generator.from_pretrained(...).generate(...)``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from draftwise.decision.arms import ArmSettings, build_arms
from draftwise.decision.core import make_learner
from draftwise.decision.step_costs import StepCostModel
from draftwise.drafters import Drafter, build_drafters
from draftwise.drafters.pool import attach_banks
from draftwise.engine import Engine
from draftwise.engine.batch import BatchEngine
from draftwise.engine.intake import Intake, eos_ids_of, failed
from draftwise.engine.session import BatchSession, check_batch_size
from draftwise.errors import DraftwiseError
from draftwise.models.cached_lm import CachedLM
from draftwise.models.defaults import DEFAULT_TARGET, default_drafters
from draftwise.models.loading import LoadOptions, context_limit, load_causal_lm
from draftwise.policies import POLICIES, PRESETS
from draftwise.request import check_seed
from draftwise.trace import GenerationResult

log = logging.getLogger(__name__)

# draftwise's own learner (docs/policies.md): UCB per context — does each lookup propose this round —
# over the lookups' long drafts, a routed model drafter and no speculation, rewarded by measured
# tokens/s. Each arm pays where it is cheap: a lookup's match is known before the round, and a model
# arm is kept only where the machine's measured costs say it pays. The answer's first 16 tokens are a
# context of their own: lookups rarely match there, and under load what those rounds teach would stop a
# query drafting for the rest of its answer. On the zoo it ties the best single drafter one request at
# a time (BENCHMARKS.md; the reasons, measured: docs/design.md, "Policies").
DEFAULT_POLICY = "ctx-ucb:opening=16"
SAMPLING_SCHEMES = ("coupled", "rejection")  # how sampled tokens are drawn (draftwise.verify.coupling)
DEFAULT_SAMPLING = "coupled"  # one seed, one text: whatever the drafters, policy, batch or clock
DEFAULT_DRAFT_LEN = 4  # draft tokens per round; verifying 5 tokens costs ≈ 1.6–2× one on CPU


class Generator:
    """A target model, a pool of drafters and a policy choosing among them each round.

    Safe to share between threads: its calls run one at a time. :meth:`generate` and
    :meth:`generate_batch` hold the Generator's lock from start to end, and so does each call on one of
    its :class:`~draftwise.engine.session.BatchSession` objects (``add``, ``step``, ``run``, ``cancel``), so a
    second thread waits for the first to finish rather than share the target's caches and the learner
    mid-query. For throughput from many threads, feed one batch session (as ``draftwise serve`` does)
    or give each thread its own Generator.
    """

    def __init__(
        self,
        target: Any,
        tokenizer: Any | None,
        drafters: Sequence[Drafter] = (),
        *,
        policy: str = DEFAULT_POLICY,
        draft_len: int | None = None,
        seed: int = 0,
        chat: bool | None = None,
        arms: str | None = None,
        max_draft: int | None = None,
        stops: Sequence[str] | None = None,
        arm_drafter: str | None = None,
        fast_drafters: bool = True,
        drafter_head_dtype: str | None = None,
        sampling: str = DEFAULT_SAMPLING,
    ) -> None:
        self.model = target
        coupled = check_sampling_scheme(sampling)
        seed = check_seed(seed)
        self.target = CachedLM(target)
        self.drafters = list(drafters)
        self.fast_drafters, self.drafter_head_dtype = fast_drafters, drafter_head_dtype
        if fast_drafters:  # small Llama drafters run on the lean batched path (draftwise.models.drafter_bank)
            try:  # their LM head in bfloat16 where the CPU multiplies it natively (default "auto")
                attach_banks(self.drafters, drafter_head_dtype)
            except ValueError as error:
                raise DraftwiseError(f"drafter_head_dtype: {error}") from None
        layout, settings = arm_settings(policy, draft_len, arms, max_draft, stops, arm_drafter)
        self.arms = build_arms(layout, self.drafters, settings)
        self.policy_spec = policy
        self.policy = make_learner(policy, self.arms, self.drafters, np.random.default_rng(seed))
        self.engine = Engine(self.target, self.drafters, self.arms, self.policy)
        # What a batched step costs on this target and device: learned once, shared by every batch session
        self.step_costs = StepCostModel()
        self.intake = Intake(tokenizer, chat, self.target.vocab_size, context_limit(target),
                             eos_ids_of(target, tokenizer), coupled, seed)
        # One query or session call at a time (see the class docstring); reentrant: generate_batch runs a session
        self.lock = threading.RLock()

    @classmethod
    def from_pretrained(
        cls,
        target: str = DEFAULT_TARGET,
        drafters: Sequence[str] | None = None,
        policy: str = DEFAULT_POLICY,
        *,
        draft_len: int | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        seed: int = 0,
        chat: bool | None = None,
        **arm_options: Any,
    ) -> Generator:
        """Load the target and the drafters named by ``drafters``.

        Targets: ``smollm2`` (the default: SmolLM2-135M-Instruct, fetched once into the local cache),
        a local folder, a ``.gguf`` file, a hub id, or ``zoo:target``. ``drafters=None`` takes the
        target's own pool (:func:`draftwise.models.defaults.default_drafters`: its zoo drafters plus ``pld``
        and ``suffix`` for ``smollm2`` and ``zoo:target``, none for other targets).

        Drafter specs: a model path or hub id, ``zoo:NAME``, ``zoo:all``, ``pld``, ``suffix``,
        with options such as ``pld:max_ngram=4``. ``arm_options``: ``arms`` (layout: drafters,
        lengths, stops, drafters×stops or an explicit list), ``max_draft``, ``stops``,
        ``arm_drafter`` — see :mod:`draftwise.decision.arms`.
        """
        options = LoadOptions(device=device, dtype=dtype)
        model, tokenizer = load_causal_lm(target, options)
        pool = build_drafters(default_drafters(target) if drafters is None else drafters, model, tokenizer, options)
        return cls(model, tokenizer, pool, policy=policy, draft_len=draft_len, seed=seed, chat=chat, **arm_options)

    # ------------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any | None:
        return self.intake.tokenizer

    @property
    def max_context(self) -> int | None:
        """The target's context length in tokens (None: unbounded)."""
        return self.intake.max_context

    @property
    def eos_ids(self) -> frozenset[int]:
        """The token ids that end an answer (unless a query ignores EOS)."""
        return self.intake.eos_ids

    @eos_ids.setter
    def eos_ids(self, ids: frozenset[int]) -> None:
        self.intake = replace(self.intake, eos_ids=frozenset(ids))

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt (text through the tokenizer, and its chat template when asked)."""
        return self.intake.encode(prompt)

    def generate(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        truncate: bool = False,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens; greedy when ``temperature`` is 0 (or below
        :data:`~draftwise.verify.chain.GREEDY_BELOW`, 1e-5).

        ``truncate`` keeps only the last tokens of a prompt too long for the target's context.
        """
        ids, settings, seed = self.intake.prepare(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop,
                                                  ignore_eos, truncate)
        with self.lock:
            generator = torch.Generator(device=self.target.device).manual_seed(seed)
            self.policy.rng = np.random.default_rng(seed)
            return self.intake.result(ids, self.engine.run(ids, settings, generator), seed)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 128,
                       temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                       seed: int | Sequence[int] | None = None, stop: Sequence[str] = (), ignore_eos: bool = False,
                       truncate: bool = False, batch_size: int = 32, decide: str = "query") -> list[GenerationResult]:
        """Generate for every prompt, up to ``batch_size`` at once: each round every active query picks
        its own arm and drafts, and one target forward verifies them all (continuous batching: a
        finished query's place goes to the next prompt). Results in prompt order; a prompt that
        cannot run (too long, empty) gets a result with ``error`` set and the others finish.

        ``decide``: ``"query"`` (each query's learner chooses) or ``"batch"`` (one learner chooses
        one arm per round for the whole batch, rewarded by the round's throughput: BanditSpec §6.2).
        Every query draws from its own generator seeded with ``seed`` (one per prompt, or one for
        all; the Generator's by default). Ctrl-C returns what every query generated so far
        (``stopped_by`` "interrupted").
        """
        seeds = list(seed) if isinstance(seed, Sequence) else [seed] * len(prompts)
        if len(seeds) != len(prompts):
            raise DraftwiseError(f"seed: one per prompt ({len(prompts)}), got {len(seeds)}")
        with self.lock:
            session = self.batch_session(batch_size, decide)
            handles: list[Any] = []
            for prompt, one_seed in zip(prompts, seeds):
                try:
                    handles.append(session.add(prompt, max_new_tokens, temperature, top_k, top_p, one_seed, stop,
                                               ignore_eos, truncate))
                except DraftwiseError as error:
                    handles.append(error)
            session.run()
        return [failed(str(h)) if isinstance(h, DraftwiseError) else h.result for h in handles]

    def batch_session(self, max_batch: int = 32, decide: str = "query") -> BatchSession:
        """A continuous batch over this Generator's target, pool, arms and learner: queries are added
        at any time and run together, one :meth:`BatchSession.step` (round) at a time."""
        check_batch_size(max_batch)
        try:
            engine = BatchEngine(self.model, self.drafters, self.arms, self.policy, decide=decide,
                                 fast_drafters=self.fast_drafters, head_dtype=self.drafter_head_dtype,
                                 costs=self.step_costs, routes=self.engine.routes)
        except ValueError as error:
            raise DraftwiseError(str(error)) from None
        return BatchSession(engine, self.intake, self.lock, max_batch)


def arm_settings(
    policy: str,
    draft_len: int | None,
    arms: str | None,
    max_draft: int | None,
    stops: Sequence[str] | None,
    arm_drafter: str | None,
) -> tuple[str, ArmSettings]:
    """The arm layout and settings: explicit arguments first, then the policy preset's, then defaults."""
    name = policy.split(":", 1)[0]
    preset = PRESETS.get(name) if name in PRESETS else None
    policy_arms = getattr(POLICIES.get(name), "default_arms", None) if name in POLICIES else None

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
    return pick(arms, preset and preset.arms, policy_arms or "drafters"), settings


def check_sampling_scheme(scheme: str) -> bool:
    """Whether ``scheme`` is coupled sampling (one clear error for an unknown scheme)."""
    if scheme not in SAMPLING_SCHEMES:
        raise DraftwiseError(f"sampling must be one of {', '.join(SAMPLING_SCHEMES)}, got {scheme!r}")
    return scheme == "coupled"
