"""White-box drafters: small heads that read the target's hidden states (EAGLE, Medusa).

A white-box drafter owns only its head; the token embedding and the LM head are the target's own
(frozen, shared by reference, never saved with the head). The engine hands it the target's final
hidden state at every verified position (:meth:`Drafter.observe_target`), which the target computed
anyway while verifying, so drafting costs the head's forwards and the LM-head projections only.

Checkpoints are Hugging Face-style folders::

    config.json        {"draftwise_head": "eagle" | "medusa", "hidden_size": …, "target": …, …}
    model.safetensors  the head's weights only (fp16 when shipped)

Heads are loaded with :func:`load_head_drafter` (specs ``eagle:head=PATH``, ``medusa:head=PATH``,
``zoo:eagle-NAME``, see :mod:`draftwise.drafters`).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from draftwise.drafters.base import ModelDrafter
from draftwise.drafters.draft_shapes import TreeOptions
from draftwise.errors import DraftwiseError
from draftwise.models.cached_lm import RowBuffer
from draftwise.models.drafter_bank import resolve_head_dtype, single_row_dtype
from draftwise.models.loading import resolve_model_path
from draftwise.models.vocab_map import FILE, VocabMap, load_vocab_map

log = logging.getLogger(__name__)

MARKER = "draftwise_head"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FINGERPRINT_VALUES = 8  # LM-head entries recorded to recognise the target a head was trained for


@dataclass(frozen=True)
class HeadConfig:
    """Everything that shapes a head, plus which target it belongs to (written to config.json)."""

    kind: str  # "eagle" or "medusa"
    hidden_size: int  # the target's hidden size (its LM head's input)
    vocab_size: int
    intermediate_size: int = 0  # eagle: the decoder layer's MLP width
    num_attention_heads: int = 0  # eagle
    num_key_value_heads: int = 0  # eagle (grouped-query attention when fewer than the heads)
    num_heads: int = 0  # medusa: tokens predicted ahead (t+1 … t+k)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    target: str = ""  # the target's name or path when trained
    target_fingerprint: tuple[float, ...] = ()
    domains: tuple[str, ...] = ()
    # the target's hidden states read (transformers' indices, −1 the final one): eagle fuses several
    # (EAGLE-3's low, middle and high layers) into one feature
    feature_layers: tuple[int, ...] = (-1,)

    def to_json(self) -> dict[str, Any]:
        return {MARKER: self.kind, **{k: v for k, v in asdict(self).items() if k != "kind"}}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> HeadConfig:
        if MARKER not in data:
            raise DraftwiseError(f"{where} is not a draftwise head checkpoint (config.json lacks {MARKER!r})")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["kind"] = data[MARKER]
        values.setdefault("feature_layers", (-1,))
        for key in ("target_fingerprint", "domains", "feature_layers"):
            values[key] = tuple(values.get(key, ()))
        return cls(**values)


# -- the target's pieces a head reuses ----------------------------------------------------------------
def target_dims(target: Any) -> tuple[int, int]:
    """(hidden size, vocabulary size) of the target's LM head."""
    vocab, hidden = target.get_output_embeddings().weight.shape
    return int(hidden), int(vocab)


def lm_head_fingerprint(target: Any) -> tuple[float, ...]:
    """A few LM-head weights at fixed places: recognises the target (fp16 storage keeps them to 1e-3)."""
    flat = target.get_output_embeddings().weight.detach().flatten()
    step = max(flat.numel() // FINGERPRINT_VALUES, 1)
    return tuple(float(x) for x in flat[::step][:FINGERPRINT_VALUES])


def check_target(config: HeadConfig, target: Any, where: str) -> None:
    """Shapes must match (else the head cannot run); a different LM head only warns (still lossless)."""
    hidden, vocab = target_dims(target)
    if (config.hidden_size, config.vocab_size) != (hidden, vocab):
        raise DraftwiseError(
            f"head {where} was trained for a target with hidden size {config.hidden_size} and vocabulary "
            f"{config.vocab_size}; this target has {hidden} and {vocab}")
    mine = lm_head_fingerprint(target)
    if config.target_fingerprint and not torch.allclose(torch.tensor(mine), torch.tensor(config.target_fingerprint),
                                                        atol=2e-3, rtol=1e-2):
        log.warning("head %s was trained for another target (%s): its drafts will rarely be accepted", where,
                    config.target or "unknown")


# -- small pure building blocks ---------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).to(x.dtype) * self.weight


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (…, T, head_dim) for integer ``positions`` (…, T) (the half-split rotary layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[..., None] * inv_freq  # (…, T, head_dim / 2)
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, heads, T, d) queries or keys by their positions' angles."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + rotated * sin[:, None]


def one_row(x: torch.Tensor) -> bool:
    """Whether ``x`` (…, H) holds a single row: one drafted token, a product bound by reading the weights."""
    return x.numel() == x.shape[-1]


class RowDtypeLinear(nn.Module):
    """A trained linear layer that multiplies a single row in ``row_dtype`` (its own copy of the
    weights) and several rows in the weights' dtype. Same parameters, same state dict."""

    row_weight: torch.Tensor
    row_bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear, row_dtype: torch.dtype) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.register_buffer("row_weight", linear.weight.detach().to(row_dtype), persistent=False)
        row_bias = None if linear.bias is None else linear.bias.detach().to(row_dtype)
        self.register_buffer("row_bias", row_bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not one_row(x):
            return F.linear(x, self.weight, self.bias)
        return F.linear(x.to(self.row_weight.dtype), self.row_weight, self.row_bias).to(x.dtype)


def with_row_dtype(module: nn.Module) -> nn.Module:
    """``module`` (a loaded head, for inference) with each linear layer a :class:`RowDtypeLinear` where
    single rows get their own dtype (:func:`~draftwise.models.drafter_bank.single_row_dtype`)."""
    weights = next(module.parameters()).dtype
    row_dtype = single_row_dtype(None, weights)
    if row_dtype == weights:
        return module
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, RowDtypeLinear(child, row_dtype))
    return module


def causal_allowed(past: int, new: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(new, past + new) bool: every new query sees the whole past and the new keys up to itself."""
    return torch.ones(new, past + new, dtype=torch.bool, device=device).tril(diagonal=past)


# -- head runtime shared by EAGLE and Medusa -----------------------------------------------------------------
def save_head(module: nn.Module, config: HeadConfig, folder: Path, dtype: torch.dtype = torch.float16) -> Path:
    """Write config.json and model.safetensors (the head's own weights only)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(config.to_json(), indent=2, sort_keys=True) + "\n")
    return folder


def read_head_config(folder: str | Path) -> HeadConfig:
    path = Path(folder).expanduser() / CONFIG_FILE
    if not path.exists():
        raise DraftwiseError(f"no head checkpoint at {folder} (missing {CONFIG_FILE})")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DraftwiseError(f"{path}: not valid JSON ({exc})") from None
    return HeadConfig.from_json(data, str(folder))


def load_head_weights(module: nn.Module, folder: str | Path) -> nn.Module:
    """Load the weights into ``module`` in float32 (CPU fp16 kernels are slow; storage stays fp16)."""
    path = Path(folder).expanduser() / WEIGHTS_FILE
    if not path.exists():
        raise DraftwiseError(f"no head weights at {path}")
    state = {k: v.float() for k, v in load_file(str(path)).items()}
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise DraftwiseError(f"{path}: weights do not fit the head described by its config.json ({exc})") from None
    return module.float().eval()


class WhiteBoxDrafter(ModelDrafter):
    """A drafter that reads the target's hidden states and shares its embedding and LM head.

    Keeps the hidden states the engine handed over (``seen``, one row per position of
    ``seen_tokens`` but the last). Subclasses implement :meth:`next_logits` (the first draft token's
    logits after each of the last positions — what the evaluation phase and the prompt prior score)
    and :meth:`propose`.
    """

    reads_target_hidden = True

    def __init__(self, target: Any, config: HeadConfig, *, name: str, source: str = "",
                 tree: TreeOptions | None = None, vocab: VocabMap | None = None) -> None:
        self.name = name
        self.source = source
        self.config = config
        self.domains = config.domains
        self.feature_layers = config.feature_layers
        self.tree = tree or TreeOptions()
        self.embed = target.get_input_embeddings()  # shared with the target, never trained here
        self.lm_head = target.get_output_embeddings()
        # A copy of the LM head in bfloat16 where the CPU multiplies it natively: it is read for
        # every drafted token, and in float32 it is most of a draft's cost (see draftwise.models.drafter_bank).
        # With a vocabulary subset (``vocab``, FR-Spec) only its rows are kept: a large target's head
        # (49k rows) would otherwise cost more than the head's own layer.
        weight = self.lm_head.weight
        self.vocab = vocab
        self.head_dtype = resolve_head_dtype(None, weight.dtype)
        plain = self.head_dtype == weight.dtype or getattr(self.lm_head, "bias", None) is not None
        if vocab is not None:
            if getattr(self.lm_head, "bias", None) is not None:
                raise DraftwiseError(f"head {name}: a vocabulary subset needs a target LM head without bias")
            weight = weight[vocab.to_target.to(weight.device)]
            plain = False
        self.head_weight = None if plain else weight.detach().to(self.head_dtype)
        # one drafted token multiplies a single row: reading the weights is all its cost
        row_dtype = single_row_dtype(None, weight.dtype)
        self.row_weight = None if row_dtype == self.head_dtype else weight.detach().to(row_dtype)
        self.vocab_size = config.vocab_size
        self.seen = RowBuffer()
        self.seen_tokens: list[int] = []

    def begin_query(self, prompt: Sequence[int]) -> None:
        self.seen.truncate(0)
        self.seen_tokens = []
        self._invalidate(0)

    def recover(self) -> None:
        self.begin_query(())  # the engine hands the hidden states over again next query

    def observe_target(self, tokens: Sequence[int], hidden: torch.Tensor, start: int) -> None:
        self.seen.truncate(start)
        if hidden.numel():
            self.seen.append(hidden.float())
        self.seen_tokens = list(tokens)
        self._invalidate(start)

    def _invalidate(self, start: int) -> None:
        """Hidden states from position ``start`` on were replaced: drop what was computed from them."""

    def hidden_for(self, context: Sequence[int], start: int, stop: int) -> torch.Tensor:
        """The target's hidden states at positions ``start:stop`` of ``context`` (handed over by the engine)."""
        if stop > self.seen.length or self.seen_tokens[:stop] != list(context[:stop]):
            raise DraftwiseError(
                f"white-box drafter {self.name!r} has no target hidden states for this context; it drafts inside "
                "the engine, which hands them over after each verification")
        return self.seen.view(start, stop)

    def head_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's own LM head on predicted features, float32 (…, V)."""
        weight = self.row_weight if self.row_weight is not None and one_row(features) else self.head_weight
        if weight is None:
            return self.lm_head(features).float()
        logits = torch.nn.functional.linear(features.to(weight.dtype), weight).float()
        return logits if self.vocab is None else self.vocab.target_logits(logits)

    def fresh(self) -> WhiteBoxDrafter:
        """A copy with no query state; the head's weights and the target's embedding and LM head are shared."""
        head = self.head_module()
        shared = [self.embed, self.lm_head, self.head_weight, self.row_weight, *head.parameters(), *head.buffers()]
        return copy.deepcopy(self, {id(t): t for t in shared if t is not None})

    def padded(self, logits: torch.Tensor, n_out: int) -> torch.Tensor:
        """Left-pad with flat rows where no hidden state exists (the very first position of a sequence)."""
        missing = n_out - logits.shape[0]
        if missing <= 0:
            return logits[-n_out:]
        return torch.cat([torch.zeros(missing, self.vocab_size, device=logits.device), logits])

    def describe(self) -> dict[str, Any]:
        tree = {} if self.tree.kind == "chain" else {"tree": self.tree.__dict__}
        return {**super().describe(), **tree, "head": self.source, "head_kind": self.config.kind,
                "params": sum(p.numel() for p in self.head_module().parameters())}

    def head_module(self) -> nn.Module:
        raise NotImplementedError


HeadFactory = Callable[..., WhiteBoxDrafter]
# kind → loader(folder, config, target, name, source, tree, vocab); eagle.py and medusa.py register theirs
# (draftwise.drafters imports them, so any import of this package has them)
HEAD_KINDS: dict[str, HeadFactory] = {}


def register_head_kind(kind: str) -> Callable[[HeadFactory], HeadFactory]:
    def decorate(factory: HeadFactory) -> HeadFactory:
        HEAD_KINDS[kind] = factory
        return factory

    return decorate


def load_head_drafter(path: str, target: Any, *, kind: str = "", name: str = "",
                      tree: TreeOptions | None = None) -> WhiteBoxDrafter:
    """Load a head checkpoint (a folder or ``zoo:NAME``) as a drafter for ``target``.

    ``kind`` (eagle / medusa), when given, must match the checkpoint's marker.
    """
    folder = Path(resolve_model_path(path)).expanduser()
    config = read_head_config(folder)
    if kind and config.kind != kind:
        raise DraftwiseError(f"{path} is a {config.kind!r} head, not {kind!r}")
    if config.kind not in HEAD_KINDS:
        raise DraftwiseError(f"{path}: unknown head kind {config.kind!r}; valid: {', '.join(sorted(HEAD_KINDS))}")
    check_target(config, target, str(path))
    default = path.split(":", 1)[1] if path.startswith("zoo:") else folder.name
    vocab = load_vocab_map(folder)  # draft_vocab.json beside the weights: the head drafts over a subset
    if vocab is not None and vocab.target_size != config.vocab_size:
        raise DraftwiseError(f"{path}: its {FILE} is for a vocabulary of {vocab.target_size}, the head's is "
                             f"{config.vocab_size}")
    drafter = HEAD_KINDS[config.kind](folder, config, target, name or default, str(path), tree, vocab)
    with_row_dtype(drafter.head_module())
    return drafter
