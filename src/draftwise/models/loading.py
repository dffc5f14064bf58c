"""Loading Hugging Face causal LMs (a local path, a hub id or ``zoo:NAME``) and what their config says."""

from __future__ import annotations

import gc
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftwise.errors import DraftwiseError
from draftwise.models.cached_lm import CachedLM
from draftwise.models.costs import fastest_keeping
from draftwise.models.named_models import (
    COMPLETE,
    check_loaded_weights,
    gguf_folder,
    hub_reachable,
    hub_unreachable_reason,
    is_named_model,
    one_line,
    resolve_named_model,
)
from draftwise.models.numerics import AUTO, NUMERICS, Numerics, coarser_than, numerics_named, resolve_numerics
from draftwise.zoo import resolve_zoo_name

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class LoadOptions:
    device: str = "cpu"
    dtype: str = "float32"  # what models load in: the drafters, and the target under numerics "native"
    numerics: str = AUTO  # how the target computes (draftwise.models.numerics)

    def __post_init__(self) -> None:
        check_device(self.device)  # an unusable device fails here, before anything loads
        if self.numerics != AUTO:
            numerics_named(self.numerics)  # a bad name fails here, before anything loads

    def torch_dtype(self) -> torch.dtype:
        try:
            return DTYPES[self.dtype]
        except KeyError:
            raise DraftwiseError(f"unknown dtype {self.dtype!r}; valid: {', '.join(DTYPES)}") from None


# Where models can run: each has kernels for every model operation and seeds its own torch.Generator
# (``meta`` holds no data, so generation cannot run there)
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")


def check_device(device: str) -> None:
    """A torch device of :data:`DEVICE_TYPES` that this machine has; one clear error otherwise."""
    try:
        parsed: torch.device | None = torch.device(device)
    except (RuntimeError, TypeError):  # not a device string at all
        parsed = None
    if parsed is None or parsed.type not in DEVICE_TYPES:
        raise DraftwiseError(f"device {device!r} cannot run models; valid: cpu, cuda, cuda:N, mps, xpu "
                             f"(available here: {', '.join(available_devices())})")
    if device_count(parsed.type) <= (parsed.index or 0):
        raise DraftwiseError(f"device {device!r} is not available here; valid here: {', '.join(available_devices())}")


def device_count(kind: str) -> int:
    """How many devices of type ``kind`` torch can use here (the CPU counts as one)."""
    if kind == "cpu":
        return 1
    backend = getattr(torch, kind, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        return 0
    count = getattr(backend, "device_count", None)
    return int(count()) if count is not None else 1


def available_devices() -> list[str]:
    """The device strings :func:`check_device` accepts here, as a user would type them."""
    found = []
    for kind in DEVICE_TYPES:
        count = device_count(kind)
        if count:
            found.append(kind if count == 1 else f"{kind} ({kind}:0 to {kind}:{count - 1})")
    return found


def resolve_model_path(name: str) -> str:
    """Map ``zoo:NAME`` to the embedded zoo's directory, a named real model (``smollm2``) to its
    cached folder (fetched on first use) and a ``.gguf`` file to its converted folder; anything
    else is a local path or hub id."""
    if name.startswith("zoo:"):
        return str(resolve_zoo_name(name))
    if is_named_model(name):
        return str(resolve_named_model(name))
    if name.lower().endswith(".gguf"):
        return str(gguf_folder(Path(name).expanduser()))
    return name


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # what a folder's tokenizer is read from

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def _check_location(name: str, path: str) -> None:
    """A path that is not a directory is an error unless it could be a hub id (``org/model``)."""
    if os.path.isdir(path):
        return
    if os.path.exists(path):
        raise DraftwiseError(f"model path {name!r} is not a directory (expected a Hugging Face checkpoint folder)")
    if not _HUB_ID.fullmatch(path):
        raise DraftwiseError(f"model path {name!r} does not exist")


def load_causal_lm(name: str, options: LoadOptions, path: str | None = None) -> tuple[Any, Any | None]:
    """Load ``AutoModelForCausalLM`` and (when it has one) its tokenizer from a path or hub id. A checkpoint
    that cannot be read (damaged or cut-short weights, a config its weights do not fit) is one clear error,
    naming ``name`` as given; ``path``: where ``name`` resolves to, when the caller resolved it already."""
    # transformers takes seconds to import: this module is read by every command, which loads a model only to run
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.path.expanduser(path or resolve_model_path(name))
    _check_location(name, path)
    local = os.path.isdir(path)
    # A hub id while the hub cannot be reached: the local Hugging Face cache only, at once (transformers would
    # retry the connection for half a minute before failing the same way)
    cache_only = not local and not hub_reachable()
    if cache_only and not _in_hub_cache(path):
        raise DraftwiseError(f"cannot load model {name!r}: it is not a local folder nor in the Hugging Face cache, "
                             f"and {hub_unreachable_reason()}; pass a local folder or a .gguf file")
    dtype = options.torch_dtype()
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=cache_only,
                                                           ignore_mismatched_sizes=True, output_loading_info=True)
        model, info = loaded  # output_loading_info: the model and what loading it found
    # a missing or unreadable file, a config transformers refuses, weights that are not safetensors
    except (OSError, ValueError, StrictDataclassError, SafetensorError) as exc:
        if cache_only:
            where = f" (from the Hugging Face cache: {hub_unreachable_reason()})"
        elif not local:
            where = " (not a local folder, and the Hugging Face hub has no such model)"
        else:
            where = ""
        detail = one_line(exc)
        if isinstance(exc, SafetensorError):
            detail = f"its safetensors weights are damaged or cut short ({detail}); copy or download them again"
        raise DraftwiseError(f"cannot load model {name!r}{where}: {detail}") from None
    check_loaded_weights(name, info)
    try:
        model.to(options.device)
    except (RuntimeError, AssertionError) as exc:
        raise DraftwiseError(f"cannot move model {name!r} to device {options.device!r}: {exc}") from None
    model.eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=cache_only)
    except (OSError, ValueError, TypeError) as exc:
        # A folder without tokenizer files is a model of token ids (drafters often are); one whose tokenizer
        # files do not load is damaged, and must not pass for the other
        present = [f for f in TOKENIZER_FILES if local and os.path.isfile(os.path.join(path, f))]
        if present:
            raise DraftwiseError(f"cannot load the tokenizer of model {name!r} ({', '.join(present)}): "
                                 f"{one_line(exc)}; copy or download it again, or remove its files to work with "
                                 "token ids only") from None
        tokenizer = None
        log.info("model %s has no tokenizer files: it takes and returns token ids only", name)
    return model, tokenizer


def load_target(name: str, options: LoadOptions) -> tuple[Any, Any | None, Numerics]:
    """The target model and its tokenizer, computing in the numerics ``options`` ask for (the
    checkpoint's own precision by default)."""
    path = resolve_model_path(name)  # once: a named model may be fetched, a GGUF file converted
    precision = checkpoint_precision(path)
    numerics = resolve_numerics(options.numerics, options.device, precision)
    dtype = options.dtype if numerics.linear is None else "float32"  # exact modes build on the float weights
    model, tokenizer = load_causal_lm(name, LoadOptions(options.device, dtype, options.numerics), path)
    if options.numerics == AUTO and numerics.exact:  # the fastest on this machine that keeps the precision
        numerics = numerics_named(fastest_keeping(model, precision))
    numerics.apply(model)
    if numerics.exact and not rows_are_independent(model):
        others = ", ".join(n for n in NUMERICS if n != numerics.name)
        raise DraftwiseError(f"numerics {numerics.name!r} does not compute {name!r} token-exact on "
                             f"{torch.get_num_threads()} thread(s) (a layer or attention it cannot rebuild, or a "
                             f"kernel that changes its sums with the threads); valid: {others}, or --threads 1")
    if coarser_than(numerics, precision):
        # asked for explicitly (auto keeps the precision): the user should know the answers are not the checkpoint's
        how, to = ("quantizes", "4 bits") if numerics.name == "int4" else ("rounds", numerics.name)
        log.warning("numerics %s %s target %s from its published %s weights to %s: answers may differ from the "
                    "checkpoint's own; numerics %s (or auto) keeps its precision", numerics.name, how, name,
                    precision, to, precision)
    log.info("target %s computes in numerics %s: %s", name, numerics.name, numerics.summary)
    return model, tokenizer, numerics


def checkpoint_precision(location: str) -> str:
    """The precision a checkpoint's weights were published in, as a numerics name: ``int4`` for a
    4-bit GGUF (named in the converted folder's source line), ``bfloat16`` for bfloat16 or float16
    weights, else ``float32`` (a hub id not yet downloaded counts as float32)."""
    path = Path(os.path.expanduser(location))
    source = path / COMPLETE
    if source.is_file():
        text = source.read_text()
        if "precision: int4" in text or re.search(r"\.Q4_[01K][^/]*\.gguf", text):
            return "int4"
    config = path / "config.json"
    if config.is_file():
        try:
            values = json.loads(config.read_text())
            dtype = values.get("dtype") or values.get("torch_dtype")
        except (OSError, ValueError, AttributeError):
            dtype = None
        if dtype in ("bfloat16", "float16"):
            return "bfloat16"
    return "float32"


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds the config of the hub model ``repo_id``."""
    from huggingface_hub import try_to_load_from_cache  # as transformers: only when loading

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repository id
        return False


def context_limit(model: Any) -> int | None:
    """The longest sequence the model's positions allow (None when unbounded or unknown)."""
    config = model.config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def freeze_loaded_objects() -> None:
    """Put everything made so far (imported modules, loaded models and tokenizers: ≈ 400,000 objects
    in a bench process) out of reach of Python's cyclic garbage collector, which otherwise walks
    them all in each full collection — ≈ 0.25 s on this CPU, landing in whichever timed run or
    served request is going at the time. Objects made later are collected as usual; the frozen
    ones stay until the process ends. For processes that load once and then run: the CLI's
    ``bench`` and ``serve`` (a library user may call it after building a Generator).
    """
    gc.collect()
    gc.freeze()


def rows_are_independent(model: Any, context: int = 190, new: int = 5, seed: int = 0) -> bool:
    """Whether a forward over ``new`` tokens after a cached context gives bit-identical logits to
    ``new`` one-token forwards: what an exact numerics promises, checked on the model as built (a
    layer that numerics cannot rebuild, attention it cannot swap, or a kernel that sums a whole
    64-token block of rows another way shows here)."""
    generator = torch.Generator().manual_seed(seed)
    limit = context_limit(model)
    if limit is not None:  # a model of short contexts: as much of one as it takes
        context = max(1, min(context, limit - new))
    vocab = int(model.get_output_embeddings().weight.shape[0])
    tokens = torch.randint(0, vocab, (context + new,), generator=generator).tolist()
    whole = CachedLM(model).logits(tokens, new)
    stepwise = CachedLM(model)
    stepwise.logits(tokens[:context])
    return all(torch.equal(stepwise.logits(tokens[: context + j + 1])[0], whole[j]) for j in range(new))
