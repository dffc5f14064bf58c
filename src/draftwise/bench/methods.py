"""What ``draftwise bench`` can compare: a registry of methods, named by spec strings.

* ``ar`` — plain decoding with draftwise's engine (no drafter): the baseline of every speedup;
* ``hf-ar`` — transformers' own greedy/sampled ``generate``;
* ``default`` — the library's default policy over the whole pool;
* any registered policy or preset (``ucb``, ``exp3:gamma=0.4``, ``hedgespec``, ``random``, …) over
  the whole pool; ``POLICY@K`` uses only the first K drafters (MAT vs number of drafters);
* ``fixed:NAME`` — one drafter of the pool, alone (``pld`` and ``suffix`` included); ``fixed:NAME@L`` at
  draft length L (the default drafts lookups at 8: compare it with ``fixed:suffix@8``);
* ``router`` — a TF-IDF + logistic-regression classifier routes each prompt to one drafter;
* ``oracle`` — the best single drafter per domain in hindsight (derived from ``fixed:*`` rows);
* ``hf-assisted:NAME`` — transformers assisted generation with that LM drafter
  (``schedule=constant`` k tokens, confidence threshold 0 — the default; ``schedule=heuristic``;
  ``schedule=default`` — transformers' own defaults);
* ``hf-pld`` — transformers prompt-lookup decoding (``hf-pld:tokens=10,ngram=2``);
* ``llama-cpp`` — llama.cpp (llama-cpp-python, an optional extra) on the target's GGUF file, greedy,
  same prompt ids and threads; ``llama-cpp-pld`` — with its prompt-lookup drafting
  (``llama-cpp-pld:tokens=10``). Its numerics are its own, so its tokens are not compared with ``ar``'s.

Groups expand against the pool: ``fixed:*``, ``hf-assisted:*``, ``policies:*`` (every registered
policy and preset except the fixed/random/round-robin baselines), ``presets:*`` (the papers'
configurations only).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from draftwise.api import DEFAULT_DRAFT_LEN, DEFAULT_POLICY, Generator
from draftwise.bench.router import route_table
from draftwise.drafters import ModelDrafter
from draftwise.errors import DraftwiseError
from draftwise.models.named_models import NAMED_MODELS, gguf_file, is_named_model
from draftwise.models.vocab_map import vocab_map_of
from draftwise.options import split_spec, typed_options
from draftwise.policies import POLICIES, PRESETS
from draftwise.registry import Registry
from draftwise.request import Request

log = logging.getLogger(__name__)

BASELINE = "ar"
INTERRUPTED = "interrupted"  # stats.stopped_by of a generation Ctrl-C cut short
BASELINE_POLICIES = ("fixed", "random", "round-robin")  # not learners: left out of ``policies:*``
GROUPS = ("fixed:*", "hf-assisted:*", "policies:*", "presets:*")


@dataclass
class Output:
    """One generation: tokens, measured wall time, statistics and a compact per-round trace."""

    token_ids: list[int]
    wall_s: float
    stats: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, list] = field(default_factory=dict)


class Method(Protocol):
    name: str

    def run(self, ids: list[int], text: str, seed: int, settings: Request) -> Output: ...


@dataclass
class Workbench:
    """What one process loads once: the target, its tokenizer, a pristine drafter pool, the router."""

    model: Any
    tokenizer: Any
    pool: list[Any]  # never generated with: each method gets fresh copies (drafters keep state)
    draft_len: int | None  # None: the library's default, or a preset's own
    seed: int
    drafter_domains: dict[str, tuple[str, ...]] = field(default_factory=dict)
    router: Any = None
    sampling: str = "coupled"  # the scheme of every draftwise generator (ar included)
    target: str = ""  # the target's name as given (peers that load it themselves: llama.cpp)

    @property
    def drafter_names(self) -> list[str]:
        return [d.name for d in self.pool]

    @property
    def lm_names(self) -> list[str]:
        return [d.name for d in self.pool if _hf_model(d) is not None]

    def fresh_pool(self, names: Sequence[str] | None = None) -> list[Any]:
        """New drafter objects with every option (tree shapes included): weights and datastores
        shared, per-query state empty."""
        return [d.fresh() for d in self.pool if names is None or d.name in names]

    def generator(self, policy: str, names: Sequence[str] | None = None, draft_len: int | None = None) -> Any:
        return Generator(self.model, self.tokenizer, self.fresh_pool(names), policy=policy,
                         draft_len=draft_len or self.draft_len, seed=self.seed, sampling=self.sampling)

    @property
    def peer_draft_len(self) -> int:
        return self.draft_len or DEFAULT_DRAFT_LEN

    def lm_model(self, name: str) -> Any:
        for d in self.pool:
            if d.name == name and (model := _hf_model(d)) is not None:
                return model
        raise DraftwiseError(f"no LM drafter {name!r} in the pool; LM drafters: {', '.join(self.lm_names) or 'none'}")


def _hf_model(drafter: Any) -> Any | None:
    """The Hugging Face LM behind a drafter (None for lookups and heads)."""
    return drafter.hf_model() if isinstance(drafter, ModelDrafter) else None


MethodFactory = Callable[[Workbench, str], Method]


@dataclass(frozen=True)
class MethodKind:
    build: MethodFactory | None  # None: derived from other methods' rows, never run
    summary: str
    # raises a DraftwiseError naming what to install when the method needs an optional extra that is missing:
    # called with the spec before any model loads or any row is run
    requires: Callable[[str], object] | None = None


METHODS: Registry[MethodKind] = Registry("bench method")


def register_method(name: str, summary: str, derived: bool = False,
                    requires: Callable[[str], object] | None = None) -> Callable[[MethodFactory], MethodFactory]:
    """Register a method kind; ``name:ARG`` specs reach the factory with ``ARG``."""

    def decorate(factory: MethodFactory) -> MethodFactory:
        METHODS.register(name)(MethodKind(None if derived else factory, summary, requires))
        return factory

    return decorate


# ----------------------------------------------------------------------------- engine methods


def compact_trace(records: Sequence[Any]) -> dict[str, list]:
    """What the plots need from each round: the arm played, what it got, the policy's reward."""
    return {
        "arm": [r.arm_name for r in records],
        "accepted": [r.accepted for r in records],
        "emitted": [r.emitted for r in records],
        "reward": [None if r.reward is None else round(float(r.reward), 5) for r in records],
    }


STAT_KEYS = ("new_tokens", "rounds", "target_calls", "drafted", "accepted", "draft_s", "verify_s", "policy_s",
             "eval_s", "other_s", "pulls", "stopped_by")


@dataclass
class EngineMethod:
    name: str
    generator: Any

    def run(self, ids: list[int], text: str, seed: int, settings: Request) -> Output:
        start = time.perf_counter()
        result = self.generator.generate(ids, replace(settings, seed=seed))
        wall = time.perf_counter() - start
        if result.stats.stopped_by == INTERRUPTED:
            # The engine keeps a Ctrl-C's partial output for `generate`; for the bench it is a cut-short
            # run, not a row: raise, so the bench stops and a rerun redoes this run.
            raise KeyboardInterrupt
        stats = result.stats.to_dict()
        return Output(list(result.token_ids), wall, {k: stats[k] for k in STAT_KEYS}, compact_trace(result.trace))


@register_method("ar", "plain decoding with draftwise's engine, no drafter: the baseline of every speedup")
def _ar(bench: Workbench, arg: str) -> Method:
    return EngineMethod("ar", Generator(bench.model, bench.tokenizer, [], policy="fixed", seed=bench.seed,
                                        sampling=bench.sampling))


@register_method("default", "the library's default policy over the whole pool")
def _default(bench: Workbench, arg: str) -> Method:
    return EngineMethod("default", bench.generator(DEFAULT_POLICY))


@register_method("fixed", "one drafter of the pool alone: fixed:NAME, or fixed:NAME@L at draft length L")
def _fixed(bench: Workbench, arg: str) -> Method:
    name, length = fixed_spec(arg, bench.drafter_names)
    return EngineMethod(f"fixed:{arg}", bench.generator("fixed", [name], length))


def fixed_spec(arg: str, drafters: Sequence[str]) -> tuple[str, int | None]:
    """``NAME`` or ``NAME@L`` of ``fixed:…``: the drafter and its draft length (None: the bench's).
    A lookup is only a fair "best single drafter" at the length the default drafts it with
    (the cascade's ``suffix@8``), not at the library's 4.

    >>> fixed_spec("suffix@8", ["pld", "suffix"])
    ('suffix', 8)
    """
    name, at, length = arg.partition("@")
    if name not in drafters:
        raise DraftwiseError(f"method fixed:{arg}: no drafter {name!r}; drafters: {', '.join(drafters)}")
    if at and not (length.isdigit() and int(length) >= 1):
        raise DraftwiseError(f"method fixed:{arg}: the draft length after @ must be an integer ≥ 1, got {length!r}")
    return name, int(length) if at else None


def policy_method(bench: Workbench, spec: str) -> Method:
    """Any registered policy or preset over the pool (``POLICY@K``: the first K drafters)."""
    policy, _, size = spec.partition("@")
    names = None
    if size:
        if not size.isdigit() or not 1 <= int(size) <= len(bench.pool):
            raise DraftwiseError(f"method {spec!r}: @K needs 1 ≤ K ≤ {len(bench.pool)} (the pool size)")
        names = bench.drafter_names[: int(size)]
    return EngineMethod(spec, bench.generator(policy, names))


@dataclass
class RouterMethod:
    name: str
    router: Any
    table: dict[str, str]
    generators: dict[str, Any]

    def run(self, ids: list[int], text: str, seed: int, settings: Request) -> Output:
        start = time.perf_counter()
        drafter = self.table[self.router.predict([text])[0]]  # routing time counts: the router runs per query
        out = EngineMethod(self.name, self.generators[drafter]).run(ids, text, seed, settings)
        out.wall_s = time.perf_counter() - start
        out.stats["routed_to"] = drafter
        return out


@register_method("router", "TF-IDF + logistic regression on the prompt routes each query to one drafter")
def _router(bench: Workbench, arg: str) -> Method:
    if bench.router is None:
        raise DraftwiseError("method router: no router was trained (it needs --router-train FILE or the zoo corpus)")
    names = bench.drafter_names
    fallback = "generalist" if "generalist" in names else (bench.lm_names or names)[0]
    table = route_table(bench.router.labels, names, bench.drafter_domains, fallback)
    generators = {d: bench.generator("fixed", [d]) for d in sorted(set(table.values()))}
    return RouterMethod("router", bench.router, table, generators)


@register_method("oracle", "the best single drafter per domain in hindsight (from the fixed:* rows)", derived=True)
def _oracle(bench: Workbench, arg: str) -> Method:
    raise AssertionError("derived method: never run")


# ----------------------------------------------------------------------------- transformers peers


def count_forwards(model: Any) -> tuple[list[int], Any]:
    """A forward hook counting the target's forward passes (the peers' target calls)."""
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1

    return calls, model.register_forward_hook(hook)


def eos_ids(model: Any) -> set[int]:
    value = getattr(model.generation_config, "eos_token_id", None)
    return {value} if isinstance(value, int) else set(value or ())


@dataclass
class HFMethod:
    """transformers ``generate`` with extra keyword arguments (an assistant, prompt lookup, nothing)."""

    name: str
    model: Any
    kwargs: dict[str, Any]

    def run(self, ids: list[int], text: str, seed: int, settings: Request) -> Output:
        x = torch.tensor([ids], device=self.model.device)
        sample = settings.temperature > 0
        kwargs: dict[str, Any] = dict(attention_mask=torch.ones_like(x), max_new_tokens=settings.max_new_tokens,
                                      do_sample=sample, **self.kwargs)
        if sample:
            kwargs.update(temperature=settings.temperature, top_k=settings.top_k or 0, top_p=settings.top_p or 1.0)
            torch.manual_seed(seed)  # transformers samples from torch's global generator
        calls, handle = count_forwards(self.model)
        try:
            start = time.perf_counter()
            with torch.inference_mode():
                out = self.model.generate(x, **kwargs)
            wall = time.perf_counter() - start
        finally:
            handle.remove()
        new = out[0, len(ids):].tolist()
        eos = eos_ids(self.model)
        cut = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))  # the engine keeps the EOS token too
        stats = {"new_tokens": cut, "rounds": calls[0], "target_calls": calls[0],
                 "stopped_by": "eos" if cut < len(new) or (new and new[-1] in eos) else "max_new_tokens"}
        return Output(new[:cut], wall, stats, {})


@register_method("hf-ar", "transformers' own generate, no drafter")
def _hf_ar(bench: Workbench, arg: str) -> Method:
    return HFMethod("hf-ar", bench.model, {})


SCHEDULES = ("constant", "heuristic", "default")


@register_method("hf-assisted",
                 "transformers assisted generation: hf-assisted:NAME[,schedule=constant|heuristic|default]")
def _hf_assisted(bench: Workbench, arg: str) -> Method:
    drafter, raw = split_spec(arg.replace(",", ":", 1)) if "," in arg else (arg, {})
    options = typed_options(f"method hf-assisted:{drafter}", raw, {"schedule": "constant"})
    schedule = options.get("schedule", "constant")
    if schedule not in SCHEDULES:
        raise DraftwiseError(f"method hf-assisted:{arg}: schedule must be one of {', '.join(SCHEDULES)}")
    kwargs: dict[str, Any] = {"assistant_model": full_vocabulary_view(bench.lm_model(drafter))}
    if schedule != "default":  # threshold 0: a constant-k comparison (MEASURED.md); 'default' = transformers' own
        kwargs.update(num_assistant_tokens=bench.peer_draft_len, num_assistant_tokens_schedule=schedule,
                      assistant_confidence_threshold=0.0)
    name = f"hf-assisted:{drafter}" + ("" if schedule == "constant" else f",schedule={schedule}")
    return HFMethod(name, bench.model, kwargs)


def full_vocabulary_view(model: Any) -> Any:
    """A drafter over a vocabulary subset as transformers' assisted generation can use it: the same
    weights, reading and writing the target's ids (draftwise.models.vocab_map); any other model as it is."""
    found = vocab_map_of(model)
    if found is None:
        return model
    vocab = found

    class FullVocabulary(type(model)):  # type: ignore[misc]
        def forward(self, input_ids: Any = None, **kwargs: Any) -> Any:
            mapped = None if input_ids is None else vocab.to_draft.to(input_ids.device)[input_ids]
            out = super().forward(input_ids=mapped, **kwargs)
            out.logits = vocab.target_logits(out.logits)
            return out

    view = copy.copy(model)  # shares every parameter and buffer
    view.__class__ = FullVocabulary
    view.config = copy.deepcopy(model.config)
    view.config.vocab_size = vocab.target_size  # what transformers compares with the target's
    return view


@register_method("hf-pld", "transformers prompt-lookup decoding: hf-pld[:tokens=K,ngram=N]")
def _hf_pld(bench: Workbench, arg: str) -> Method:
    _, raw = split_spec(f"hf-pld:{arg}")
    options = {"tokens": bench.peer_draft_len, "ngram": 2,
               **typed_options("method hf-pld", raw, {"tokens": 0, "ngram": 0})}
    return HFMethod("hf-pld" + (f":{arg}" if arg else ""), bench.model,
                    {"prompt_lookup_num_tokens": options["tokens"], "max_matching_ngram_size": options["ngram"]})


# ----------------------------------------------------------------------------- llama.cpp peers


def target_gguf(target: str) -> str:
    """The GGUF file behind a target: a ``.gguf`` path as given, a named model's own (kept in the cache)."""
    if target.lower().endswith(".gguf"):
        return target
    if is_named_model(target):
        return str(gguf_file(target))
    raise DraftwiseError(f"the llama-cpp methods run a GGUF file: the target must be a .gguf path or a named "
                         f"model ({', '.join(NAMED_MODELS)}), not {target!r}")


def llama_cpp_module(method: str) -> Any:
    """The ``llama_cpp`` module (llama-cpp-python, an optional extra: only these methods need it), its
    prompt-lookup drafting loaded; one clear error naming the extra when it is not installed."""
    try:
        import llama_cpp
        import llama_cpp.llama_speculative
    except ImportError:
        raise DraftwiseError(f"method {method} needs llama-cpp-python: pip install -e \".[llama-cpp]\" "
                             "(it builds from source: minutes)") from None
    return llama_cpp


@dataclass
class LlamaCppMethod:
    """llama.cpp on the target's GGUF file, greedy, fed the same prompt ids; ``lookup`` > 0 drafts that
    many tokens a step with its prompt-lookup decoding."""

    name: str
    gguf: str
    eos: set[int]
    lookup: int = 0
    llm: Any = None

    def load(self, context: int) -> Any:
        api = llama_cpp_module(self.name)
        draft = api.llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=self.lookup) if self.lookup else None
        threads = torch.get_num_threads()
        return api.Llama(model_path=self.gguf, n_ctx=context, n_threads=threads, n_threads_batch=threads,
                         draft_model=draft, verbose=False, seed=0)

    def run(self, ids: list[int], text: str, seed: int, settings: Request) -> Output:
        if settings.temperature > 0:
            raise DraftwiseError(f"method {self.name} runs greedy only (temperature 0)")
        if self.llm is None:
            self.llm = self.load(context=8192)
        self.llm.reset()  # no prefix kept from an earlier prompt: every run prefills its whole prompt
        new: list[int] = []
        start = time.perf_counter()
        for token in self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            new.append(int(token))
            if token in self.eos or len(new) >= settings.max_new_tokens:
                break
        wall = time.perf_counter() - start
        stopped = "eos" if new and new[-1] in self.eos else "max_new_tokens"
        return Output(new, wall, {"new_tokens": len(new), "stopped_by": stopped}, {})


@register_method("llama-cpp", "llama.cpp on the target's GGUF file, greedy (optional extra llama-cpp)",
                 requires=llama_cpp_module)
def _llama_cpp(bench: Workbench, arg: str) -> Method:
    return LlamaCppMethod("llama-cpp", target_gguf(bench.target), eos_ids(bench.model))


@register_method("llama-cpp-pld", "llama.cpp with its prompt-lookup drafting: llama-cpp-pld[:tokens=K] (default 10)",
                 requires=llama_cpp_module)
def _llama_cpp_pld(bench: Workbench, arg: str) -> Method:
    _, raw = split_spec(f"llama-cpp-pld:{arg}")
    tokens = typed_options("method llama-cpp-pld", raw, {"tokens": 10}).get("tokens", 10)
    if tokens < 1:
        raise DraftwiseError(f"method llama-cpp-pld: tokens must be ≥ 1, got {tokens}")
    return LlamaCppMethod("llama-cpp-pld" + (f":{arg}" if arg else ""), target_gguf(bench.target),
                          eos_ids(bench.model), lookup=tokens)


# ----------------------------------------------------------------------------- resolution


def split_methods(text: str) -> list[str]:
    """Split a comma-separated method list, keeping policy options together.

    >>> split_methods("ar,ucb:beta=0.1,reward=be,fixed:pld")
    ['ar', 'ucb:beta=0.1,reward=be', 'fixed:pld']
    """
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if out and "=" in part and ":" not in part:  # key=value continues the previous spec's options
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def method_head(spec: str) -> str:
    return spec.split(":", 1)[0].split("@", 1)[0]


def policy_names() -> list[str]:
    """Every registered policy and paper preset (``draftwise policies``)."""
    return sorted({*POLICIES, *PRESETS})


def is_policy(spec: str) -> bool:
    return method_head(spec) in policy_names() and method_head(spec) not in METHODS


def learner_names() -> list[str]:
    return [name for name in policy_names() if name not in BASELINE_POLICIES]


def preset_names() -> list[str]:
    return list(PRESETS)


def expand_methods(specs: Sequence[str], drafters: Sequence[str], lm_drafters: Sequence[str]) -> list[str]:
    """Expand groups, put ``ar`` first, add the ``fixed:*`` rows ``oracle`` needs, drop repeats."""
    groups = {
        "fixed:*": [f"fixed:{d}" for d in drafters],
        "hf-assisted:*": [f"hf-assisted:{d}" for d in lm_drafters],
        "policies:*": learner_names(),
        "presets:*": preset_names(),
    }
    out = [BASELINE]
    for spec in specs:
        out += groups.get(spec, [spec])
    if "oracle" in out:
        out += [f"fixed:{d}" for d in drafters]
    return list(dict.fromkeys(out))


def check_method(spec: str) -> None:
    """Raise a clear error for a spec no registry knows, or whose optional extra is not installed (before
    any model is loaded)."""
    head = method_head(spec)
    if head in METHODS:
        requires = METHODS.get(head).requires
        if requires is not None:
            requires(spec)
        return
    if is_policy(spec) or spec in GROUPS:
        return
    raise DraftwiseError(
        f"unknown method {spec!r}; valid: {', '.join(sorted(METHODS))}, a policy or preset "
        f"({', '.join(policy_names())}), or a group ({', '.join(GROUPS)})"
    )


def is_derived(spec: str) -> bool:
    head = method_head(spec)
    return head in METHODS and METHODS.get(head).build is None


def build_method(bench: Workbench, spec: str) -> Method:
    check_method(spec)
    head = method_head(spec)
    if head in METHODS:
        kind = METHODS.get(head)
        if kind.build is None:
            raise DraftwiseError(f"method {spec!r} is derived from other rows and is never run")
        return kind.build(bench, spec.partition(":")[2])
    return policy_method(bench, spec)
