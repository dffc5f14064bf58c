"""The public face: ``Generator.from_pretrained(...).generate(...)``."""

from __future__ import annotations

import logging
import math
import numbers
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from draftwise.arms import ArmSettings, build_arms
from draftwise.cached_lm import CachedLM
from draftwise.decide import make_learner
from draftwise.drafter_bank import attach_banks
from draftwise.drafters import Drafter, build_drafters
from draftwise.engine import Engine, QueryOutcome, QuerySettings, StopCheck
from draftwise.errors import DraftwiseError
from draftwise.loading import LoadOptions, context_limit, load_causal_lm
from draftwise.policies import POLICIES, PRESETS
from draftwise.pools import DEFAULT_TARGET, default_drafters
from draftwise.step_costs import StepCostModel
from draftwise.trace import GenerationResult, summarize
from draftwise.verify import Sampling, sampling_settings

if TYPE_CHECKING:
    from draftwise.session import BatchSession

log = logging.getLogger(__name__)

# draftwise's own learner (docs/policies.md): UCB per context — does each lookup propose this round —
# over the lookups' long drafts, a routed model drafter and no speculation, rewarded by measured
# tokens/s. Each arm pays where it is cheap: a lookup's match is known before the round, and a model
# arm is kept only where the machine's measured costs say it pays. The answer's first 16 tokens are a
# context of their own: lookups rarely match there, and under load what those rounds teach would stop a
# query drafting for the rest of its answer. On the zoo it ties the best single drafter one request at
# a time (BENCHMARKS.md; the reasons, measured: docs/design.md, "Policies").
DEFAULT_POLICY = "ctx-ucb:opening=16"
SAMPLING_SCHEMES = ("coupled", "rejection")  # how sampled tokens are drawn (draftwise.coupling)
DEFAULT_SAMPLING = "coupled"  # one seed, one text: whatever the drafters, policy, batch or clock
DEFAULT_DRAFT_LEN = 4  # draft tokens per round; verifying 5 tokens costs ≈ 1.6–2× one on CPU


class Generator:
    """A target model, a pool of drafters and a policy choosing among them each round.

    Safe to share between threads: its calls run one at a time. :meth:`generate` and
    :meth:`generate_batch` hold the Generator's lock from start to end, and so does each call on one of
    its :class:`~draftwise.session.BatchSession` objects (``add``, ``step``, ``run``, ``cancel``), so a
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
        self.coupled = check_sampling_scheme(sampling)
        self.tokenizer = tokenizer
        self.seed = check_seed(seed)
        self.chat = chat
        self.target = CachedLM(target)
        self.drafters = list(drafters)
        self.fast_drafters, self.drafter_head_dtype = fast_drafters, drafter_head_dtype
        if fast_drafters:  # small Llama drafters run on the lean batched path (draftwise.drafter_bank)
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
        self.max_context = context_limit(target)
        self.eos_ids = _eos_ids(target, tokenizer)
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
        target's own pool (:func:`draftwise.pools.default_drafters`: its zoo drafters plus ``pld``
        and ``suffix`` for ``smollm2`` and ``zoo:target``, none for other targets).

        Drafter specs: a model path or hub id, ``zoo:NAME``, ``zoo:all``, ``pld``, ``suffix``,
        with options such as ``pld:max_ngram=4``. ``arm_options``: ``arms`` (layout: drafters,
        lengths, stops, drafters×stops or an explicit list), ``max_draft``, ``stops``,
        ``arm_drafter`` — see :mod:`draftwise.arms`.
        """
        options = LoadOptions(device=device, dtype=dtype)
        model, tokenizer = load_causal_lm(target, options)
        pool = build_drafters(default_drafters(target) if drafters is None else drafters, model, tokenizer, options)
        return cls(model, tokenizer, pool, policy=policy, draft_len=draft_len, seed=seed, chat=chat, **arm_options)

    # ------------------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt (text through the tokenizer, and its chat template when asked)."""
        if isinstance(prompt, str):
            check_prompt_text(prompt)
            if not prompt.strip():
                raise DraftwiseError("the prompt is empty")
            if self.tokenizer is None:
                raise DraftwiseError("this target has no tokenizer: pass token ids instead of text")
            use_chat = self.chat if self.chat is not None else bool(getattr(self.tokenizer, "chat_template", None))
            if use_chat:
                ids = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
                return [int(i) for i in ids]
            return [int(i) for i in self.tokenizer(prompt, add_special_tokens=True)["input_ids"]]
        ids = [int(i) for i in prompt]
        if not ids:
            raise DraftwiseError("the prompt is empty")
        if (self.target.vocab_size and max(ids) >= self.target.vocab_size) or min(ids) < 0:
            raise DraftwiseError(f"prompt token ids must lie in [0, {self.target.vocab_size})")
        return ids

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
        :data:`~draftwise.verify.GREEDY_BELOW`, 1e-5).

        ``truncate`` keeps only the last tokens of a prompt too long for the target's context.
        """
        ids, settings, seed = self.prepare(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, ignore_eos,
                                           truncate)
        with self.lock:
            generator = torch.Generator(device=self.target.device).manual_seed(seed)
            self.policy.rng = np.random.default_rng(seed)
            return self.result(ids, self.engine.run(ids, settings, generator), seed)

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
        return [self.failed(str(h)) if isinstance(h, DraftwiseError) else h.result for h in handles]

    def batch_session(self, max_batch: int = 32, decide: str = "query") -> BatchSession:
        """A continuous batch over this Generator's target, pool, arms and learner: queries are added
        at any time and run together, one :meth:`BatchSession.step` (round) at a time."""
        from draftwise.session import BatchSession

        return BatchSession(self, max_batch, decide)

    def prepare(self, prompt: str | Sequence[int], max_new_tokens: int, temperature: float, top_k: int | None,
                top_p: float | None, seed: int | None, stop: Sequence[str], ignore_eos: bool,
                truncate: bool) -> tuple[list[int], QuerySettings, int]:
        """Check a query's arguments and build its token ids, settings and seed (one clear error)."""
        sampling = replace(check_generate_args(max_new_tokens, temperature, top_k, top_p, seed), coupled=self.coupled)
        ids = self._fit_context(self.encode(prompt), max_new_tokens, truncate)
        if stop and self.tokenizer is None:
            raise DraftwiseError("stop strings need a tokenizer")
        settings = QuerySettings(
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            eos_ids=frozenset() if ignore_eos else self.eos_ids,
            stop_check=stop_checker(self.tokenizer, list(stop)) if stop else None,
        )
        return ids, settings, self.seed if seed is None else seed

    def result(self, ids: list[int], outcome: QueryOutcome, seed: int) -> GenerationResult:
        """A finished query's tokens, text and statistics."""
        new_ids = outcome.tokens[len(ids):]
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True) if self.tokenizer is not None else ""
        stats = summarize(outcome.records, len(new_ids), outcome.wall_s, outcome.stopped_by,
                          outcome.extra_target_calls)
        return GenerationResult(new_ids, text, stats, outcome.records, prompt_ids=ids, seed=seed)

    @staticmethod
    def failed(message: str) -> GenerationResult:
        """The result of a query that could not run."""
        return GenerationResult([], "", summarize([], 0, 0.0, "error"), [], error=message)

    def _fit_context(self, ids: list[int], max_new_tokens: int, truncate: bool) -> list[int]:
        limit = self.max_context
        if limit is None or len(ids) + max_new_tokens <= limit:
            return ids
        room = limit - max_new_tokens
        if not truncate or room < 1:
            raise DraftwiseError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the target's context "
                f"of {limit} tokens; shorten the prompt, lower max_new_tokens, or truncate the prompt "
                "(--truncate / truncate=True keeps its last tokens)"
            )
        log.warning("prompt truncated from %d to its last %d tokens", len(ids), room)
        return ids[-room:]


def stop_checker(tokenizer: Any, stops: Sequence[str]) -> StopCheck:
    """A :data:`StopCheck` for stop strings: after a round that added ``new`` tokens, the length to
    keep (through the first token completing a stop string), else None.

    A stop string that completes this round ends within the new tokens and starts at most
    ``longest`` tokens before them (a token decodes to ≥ 1 character; 8 more cover multi-byte
    characters split across tokens), so only that tail is decoded — a round may add many tokens.
    """
    longest = max(len(s) for s in stops)

    def check(generated: list[int], new: int) -> int | None:
        tail_start = max(0, len(generated) - new - longest - 8)
        if not any(s in tokenizer.decode(generated[tail_start:]) for s in stops):
            return None
        for keep in range(max(tail_start + 1, len(generated) - new + 1), len(generated) + 1):
            if any(s in tokenizer.decode(generated[tail_start:keep]) for s in stops):
                return keep
        return None

    return check


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


SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes seeds below 2**64; numpy's generators refuse negatives


def check_seed(seed: Any, name: str = "seed") -> int:
    """A seed every generator accepts: an integer in [0, 2**64)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < SEED_LIMIT:
        raise DraftwiseError(f"{name} must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


def check_prompt_text(text: str, where: str = "the prompt") -> str:
    """Text the tokenizer can encode: no lone surrogates (undecodable bytes smuggled in by
    Python's surrogateescape, or a JSON ``\\udcff`` escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DraftwiseError(f"{where} is not valid Unicode text (undecodable character {text[error.start]!r} at "
                             f"position {error.start}); pass UTF-8 text") from None
    return text


def _check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> Sampling:
    # NaN fails every comparison, so each check is written as "ok" and negated.
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens <= 0:
        raise DraftwiseError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not (isinstance(temperature, numbers.Real) and math.isfinite(temperature) and temperature >= 0):
        raise DraftwiseError(f"temperature must be ≥ 0 and finite (0 = greedy), got {temperature!r}")
    if top_p is not None and not (isinstance(top_p, numbers.Real) and 0 < top_p <= 1):
        raise DraftwiseError(f"top_p must lie in (0, 1], got {top_p!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise DraftwiseError(f"top_k must be an integer ≥ 1, got {top_k!r}")
    return sampling_settings(float(temperature), None if top_k is None else int(top_k),
                             None if top_p is None else float(top_p))


def check_sampling_scheme(scheme: str) -> bool:
    """Whether ``scheme`` is coupled sampling (one clear error for an unknown scheme)."""
    if scheme not in SAMPLING_SCHEMES:
        raise DraftwiseError(f"sampling must be one of {', '.join(SAMPLING_SCHEMES)}, got {scheme!r}")
    return scheme == "coupled"


def check_generate_args(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None,
                        seed: int | None) -> Sampling:
    """Every numeric argument of :meth:`Generator.generate`, checked before any work (the CLI calls
    it before loading models); returns the sampling settings."""
    if seed is not None:
        check_seed(seed)
    return _check_sampling(max_new_tokens, temperature, top_k, top_p)


def _eos_ids(model: Any, tokenizer: Any | None) -> frozenset[int]:
    """End-of-sequence ids as transformers' ``generate`` sees them: generation config first."""
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            return frozenset({value})
        if isinstance(value, (list, tuple)) and value:
            return frozenset(int(v) for v in value)
    return frozenset()
