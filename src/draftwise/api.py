"""The public face: ``Generator.from_pretrained(...).generate(...)``.

What a Generator runs with is parsed here, once: the pool's learner and arms into a
:class:`~draftwise.decision.setup.Setup`, each query's settings into a :class:`~draftwise.request.Request`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from draftwise.decision import StepCostModel, build_arms, make_learner
from draftwise.decision.pricing import DraftGate
from draftwise.decision.setup import DEFAULT_DRAFT_LEN, DEFAULT_POLICY, Setup
from draftwise.drafters import Drafter, build_drafters
from draftwise.drafters.pool import attach_banks
from draftwise.engine import Engine
from draftwise.engine.batch import BatchEngine
from draftwise.engine.intake import Intake, eos_ids_of, failed
from draftwise.engine.session import BatchSession, check_batch_size
from draftwise.errors import DraftwiseError
from draftwise.models.cached_lm import CachedLM
from draftwise.models.costs import target_costs
from draftwise.models.defaults import DEFAULT_TARGET, default_drafters
from draftwise.models.loading import LoadOptions, context_limit, load_target
from draftwise.request import Request, check_seed, make_request
from draftwise.trace import GenerationResult

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_DRAFT_LEN", "DEFAULT_POLICY", "DEFAULT_SAMPLING", "Generator", "Request", "Setup"]

SAMPLING_SCHEMES = ("coupled", "rejection")  # how sampled tokens are drawn (draftwise.verify.coupling)
DEFAULT_SAMPLING = "coupled"  # one seed, one text: whatever the drafters, policy, batch or clock


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
        setup: Setup | None = None,
    ) -> None:
        """``setup``: the learner and arms, parsed already (:meth:`Setup.parse`); else they are parsed
        from ``policy``, ``draft_len``, ``arms``, ``max_draft``, ``stops`` and ``arm_drafter``."""
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
        if setup is None:
            setup = Setup.parse(policy, draft_len=draft_len, arms=arms, max_draft=max_draft, stops=stops,
                                arm_drafter=arm_drafter)
        self.setup = setup
        self.arms = build_arms(setup.layout, self.drafters, setup.arms)
        self.policy_spec = setup.policy.text
        self.policy = make_learner(setup.policy, self.arms, self.drafters, np.random.default_rng(seed))
        self.engine = Engine(self.target, self.drafters, self.arms, self.policy)
        # What the target's forwards cost on this machine: measured at its first load here, then kept
        self.costs = target_costs(target)
        self.engine.costs = self.costs
        # What a batched step costs on this target and device: from the measured curve, refitted to the
        # steps every batch session times
        self.step_costs = StepCostModel(prior=self.costs.step_prior())
        # … and at which loads its drafting pays (a batch session's gate, shared like the costs)
        self.draft_gate = DraftGate()
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
        numerics: str = "auto",
        seed: int = 0,
        chat: bool | None = None,
        setup: Setup | None = None,
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
        ``arm_drafter`` — see :mod:`draftwise.decision.arms`. ``setup``: all of these parsed already
        (:meth:`Setup.parse`; its drafters, when it names them, stand for ``drafters``).

        ``numerics``: how the target computes (:mod:`draftwise.models.numerics`): ``auto`` (the
        checkpoint's own precision, token-exact: ``int4`` for the default target's 4-bit GGUF),
        ``int4``, ``bfloat16``, ``float32`` (each token-exact on CPU), or ``native`` (as transformers
        loads it in ``dtype``, on any device, without that guarantee). ``dtype`` is what the drafters
        load in, and the target under ``native``.
        """
        options = LoadOptions(device=device, dtype=dtype, numerics=numerics)
        model, tokenizer, _ = load_target(target, options)
        if setup is not None and setup.drafters is not None:
            drafters = setup.drafters
        pool = build_drafters(default_drafters(target) if drafters is None else drafters, model, tokenizer, options)
        if setup is not None:
            return cls(model, tokenizer, pool, seed=seed, chat=chat, setup=setup, **arm_options)
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

    def generate(self, prompt: str | Sequence[int], request: Request | None = None,
                 **settings: Any) -> GenerationResult:
        """Generate for ``prompt`` as ``request`` asks — or as ``settings`` do, the fields of a
        :class:`~draftwise.request.Request` given as keywords (``max_new_tokens=64, temperature=0.7``).
        Greedy when the temperature is 0 (or below :data:`~draftwise.verify.chain.GREEDY_BELOW`, 1e-5);
        ``truncate`` shortens a prompt too long for the target's context to fit with room for the answer:
        text loses the start of its own text (the chat template stays whole), token ids their first tokens;
        a warning and ``result.stats.prompt_tokens_cut`` say how many tokens went.
        """
        request = make_request(request, settings)
        ids, query, seed = self.intake.prepare(prompt, request)
        with self.lock:
            generator = torch.Generator(device=self.target.device).manual_seed(seed)
            outcome = self.engine.run(ids, query, generator, np.random.default_rng(seed))
            return self.intake.result(ids, outcome, seed, query.prompt_cut)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], request: Request | None = None, *,
                       seed: int | Sequence[int] | None = None, batch_size: int = 32, decide: str = "query",
                       **settings: Any) -> list[GenerationResult]:
        """Generate for every prompt, up to ``batch_size`` at once: each round every active query picks
        its own arm and drafts, and one target forward verifies them all (continuous batching: a
        finished query's place goes to the next prompt). Results in prompt order; a prompt that
        cannot run (too long, empty, a bad setting) gets a result with ``error`` set and the others finish.

        ``request`` (or ``settings``, its fields as keywords) applies to every prompt. ``decide``:
        ``"query"`` (each query's learner chooses) or ``"batch"`` (one learner chooses one arm per round
        for the whole batch, rewarded by the round's throughput: BanditSpec §6.2). Every query draws
        from its own generator seeded with ``seed`` (one per prompt, or one for all; the request's, else
        the Generator's, by default). Ctrl-C returns what every query generated so far (``stopped_by``
        "interrupted").
        """
        seeds = list(seed) if isinstance(seed, Sequence) else [seed] * len(prompts)
        if len(seeds) != len(prompts):
            raise DraftwiseError(f"seed: one per prompt ({len(prompts)}), got {len(seeds)}")
        with self.lock:
            session = self.batch_session(batch_size, decide)
            handles: list[Any] = []
            for prompt, one_seed in zip(prompts, seeds):
                try:
                    one = make_request(request, settings if one_seed is None else {**settings, "seed": one_seed})
                    handles.append(session.add(prompt, one))
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
                                 costs=self.step_costs, routes=self.engine.routes, curve=self.costs,
                                 acceptance=self.engine.pricing, gate=self.draft_gate)
        except ValueError as error:
            raise DraftwiseError(str(error)) from None
        return BatchSession(engine, self.intake, self.lock, max_batch)


def check_sampling_scheme(scheme: str) -> bool:
    """Whether ``scheme`` is coupled sampling (one clear error for an unknown scheme)."""
    if scheme not in SAMPLING_SCHEMES:
        raise DraftwiseError(f"sampling must be one of {', '.join(SAMPLING_SCHEMES)}, got {scheme!r}")
    return scheme == "coupled"
