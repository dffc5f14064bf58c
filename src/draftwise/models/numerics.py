"""How the target computes: its numerics, each one token-exact (rows that do not depend on the forward).

Speculative decoding is lossless only if the target's logits at a position do not depend on how
many tokens the forward that computed them carried: a round verifies k drafted tokens in one
forward, plain decoding feeds one token a forward, and a batch puts other queries' rows beside
them. Dense CPU kernels break that: a float32 product of 2–16 rows takes another path than one
row, and attention sums its keys in an order that changes with the number of queries and keys. A
near-tie then rounds the other way and the greedy token changes.

Each :class:`Numerics` here makes every row's arithmetic independent of the forward's shape:

- its linear layers multiply rows in a way whose result per row does not depend on the other rows
  (``int4``: a weight-only 4-bit kernel that is row-independent by construction; ``bfloat16``:
  dense products always run on fixed blocks of 16 rows; ``float32``: one row at a time);
- attention (:func:`exact_attention`) gives each query row a product whose rows are the query heads
  that share its key head (rows in fours: BLAS kernels take other paths for 1–3), over exactly
  its visible keys rounded up to a multiple of 64: the sums then follow the same order whatever the
  forward carried, and a long prompt's rows still go through the kernel in blocks of 64 tokens.

Norms, rotary embeddings and the residual stream stay float32, as transformers computes them
(row-wise already), and so does the KV cache. ``native`` leaves the model as transformers loaded it:
any device, any dtype, and no such guarantee (it warns once).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftwise.errors import DraftwiseError
from draftwise.models.layered_cache import LayeredCache
from draftwise.models.numerics_modes import AUTO, EXACT_MODES, NUMERICS_MODES

log = logging.getLogger(__name__)

GROUP = 32  # weights per 4-bit group (a scale and a zero each): GGUF's Q4_1 block
OUT_MULTIPLE = 16  # the 4-bit kernel's outputs come in sixteens
BLOCK_ROWS = 16  # rows per dense bfloat16 product
KEY_MULTIPLE = 64  # attention's keys are padded to a multiple of this
MIN_ROWS = 4  # an attention product's rows come in fours: BLAS kernels compute 1–3 rows another way
ATTENTION = "draftwise_exact"  # the attention implementation's registered name
CHAIN = "draftwise_chain"  # a causal mask's (cached, new), set on it where it is made


# -- linear layers ------------------------------------------------------------------------------------
class Int4Linear(nn.Module):
    """A linear layer with 4-bit weights in groups of 32 along the input (asymmetric: a scale and a
    zero per group, as GGUF's Q4_1), multiplied by bfloat16 activations through PyTorch's CPU
    weight-only kernel. Each output row depends on its input row only, whatever the number of rows.
    Input and output keep their dtype (float32 in the residual stream)."""

    kernel_args: tuple[torch.Tensor, int, torch.Tensor]

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        if self.in_features % GROUP:
            raise DraftwiseError(f"numerics 'int4' needs layers whose inputs are a multiple of {GROUP} wide "
                                 f"(this model has one of {self.in_features}); valid here: float32, bfloat16")
        weight = weight.detach().float()
        spare = -self.out_features % OUT_MULTIPLE  # the kernel packs outputs in sixteens: zero rows, cut off
        if spare:
            weight = torch.cat([weight, weight.new_zeros(spare, self.in_features)])
        codes, scales_zeros = quantize_int4(weight)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1), persistent=False)
        self.register_buffer("scales_zeros", scales_zeros, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self._refresh()

    def _refresh(self) -> None:
        # what every call reads, as plain attributes: a module's buffers are slow to look up
        self.__dict__["kernel_args"] = (self.packed, GROUP, self.scales_zeros)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)
        self._refresh()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, *self.kernel_args)
        if out.shape[1] != self.out_features:  # the kernel's spare outputs (sixteens)
            out = out[:, : self.out_features]
        out = out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bits=4, group={GROUP}"


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """4-bit codes (N, K) int32 and the kernel's (K/32, N, 2) bfloat16 scales and zeros, such that
    w ≈ (q − 8)·scale + zero. A group's scale spans its minimum to its maximum over 15 steps, as
    GGUF's Q4_1 does; scale and zero are rounded to bfloat16 (the kernel's) before the codes are
    chosen, so the codes are the nearest for the scales the kernel will use. A model dequantized
    from Q4_1 gets back its own codes wherever bfloat16 holds its scale."""
    n, k = weight.shape
    groups = weight.reshape(n, k // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp_min(1e-20).to(torch.bfloat16)
    zero = (low + 8 * scale.float()).to(torch.bfloat16)
    codes = torch.round((groups - zero.float()[..., None]) / scale.float()[..., None] + 8).clamp_(0, 15)
    scales_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()  # (K/32, N, 2)
    return codes.reshape(n, k).to(torch.int32), scales_zeros


def dequantize_int4(codes: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """The (N, K) float32 weights that :func:`quantize_int4`'s codes and scales stand for:
    (q − 8)·scale + zero, each group of 32 inputs with its own scale and zero."""
    scale = scales_zeros[..., 0].float().T.repeat_interleave(GROUP, 1)  # (N, K)
    zero = scales_zeros[..., 1].float().T.repeat_interleave(GROUP, 1)
    return (codes.float() - 8) * scale + zero


class BlockLinear(nn.Module):
    """A dense linear layer whose rows are multiplied in fixed blocks of ``block`` rows (zero-padded),
    so that the kernel, and its order of sums, never changes with the number of rows. ``block`` 1
    is a matrix–vector product per row."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, block: int) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dense: torch.Tensor
        self.dense_bias: torch.Tensor | None
        self.register_buffer("dense", weight.detach().to(dtype).contiguous(), persistent=False)
        self.register_buffer("dense_bias", None if bias is None else bias.detach().to(dtype), persistent=False)
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(self.dense.dtype)
        n = rows.shape[0]
        padded = -(-n // self.block) * self.block
        if padded != n:
            rows = torch.cat([rows, rows.new_zeros(padded - n, self.in_features)])
        out = torch.cat([F.linear(rows[i : i + self.block], self.dense, self.dense_bias)
                         for i in range(0, padded, self.block)])[:n]
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"dtype={self.dense.dtype}, block={self.block}")


# -- attention ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """Query rows of one batch element that read the same number of keys: one attention product.

    ``keys`` is a row's visible keys rounded up to a multiple of 64: a row always reads exactly that
    many, whatever else the forward carries (the kernel's sums over its keys follow their number).
    ``order`` is set when the rows do not each see a prefix of the keys (a draft tree's nodes see
    their ancestors among their siblings): per row, the key order that puts its visible keys first,
    where one-token decoding of its path holds them; each such row is then its own product."""

    element: int
    rows: slice | torch.Tensor
    keys: int
    mask: torch.Tensor  # (products, 1, rows per product, keys) additive, every head group's rows alike
    order: torch.Tensor | None = None  # (rows, keys)


class MaskMemo:
    """The segments of the forward in progress (:func:`segments`): worked out by its first layer,
    reused by the others."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.source: torch.Tensor | None = None  # held, so its id cannot be reused while memoized
        self.segments: list[Segment] = []


_memo = MaskMemo()


def padded_mask(attention_mask: torch.Tensor | None, batch: int, n: int, keys: int, padded: int,
                device: torch.device) -> torch.Tensor:
    """A (batch, n, padded) additive float32 mask: the given one (bool, or additive over ``keys``),
    else causal for the last ``n`` of ``keys`` positions; the padding keys masked."""
    if attention_mask is None:
        return chain_mask(keys - n, n, device)[0].expand(batch, n, padded)
    given = attention_mask[:, 0, :, :keys]  # one mask for every head
    blocked = torch.finfo(torch.float32).min
    if given.dtype == torch.bool:
        given = torch.zeros(given.shape, device=device).masked_fill_(~given, blocked)
    return pad_mask(given.float().clamp_min(blocked)).expand(batch, n, padded)


def segments(attention_mask: torch.Tensor | None, batch: int, n: int, keys: int, group: int,
             device: torch.device) -> list[Segment]:
    """The forward's attention products (:class:`Segment`), once per forward: every layer reads the same mask."""
    key = (id(attention_mask), batch, n, keys, group)
    if _memo.key == key and _memo.source is attention_mask:
        return _memo.segments
    chain: tuple[int, int] | None = getattr(attention_mask, CHAIN, None)
    if chain is not None and attention_mask is not None:  # a causal mask: its segments follow from its size
        cached, new = chain
        found = [segment for element in range(batch)
                 for segment in chain_segments(element, cached, new, attention_mask[0, 0], group)]
    else:
        mask = padded_mask(attention_mask, batch, n, keys, padded_keys(keys), device)
        found = [segment for element in range(batch) for segment in element_segments(element, mask[element], group)]
    _memo.key, _memo.source, _memo.segments = key, attention_mask, found
    return found


def chain_segments(element: int, cached: int, new: int, mask: torch.Tensor, group: int) -> list[Segment]:
    """The segments of ``new`` tokens after ``cached`` ones, causal (mask (new, padded)): token i sees
    cached + i + 1 keys, so runs end where that count passes a multiple of 64."""
    found, start = [], 0
    while start < new:
        width = padded_keys(cached + start + 1)
        stop = min(new, width - cached)
        found.append(Segment(element, slice(start, stop), width, stacked_rows(mask[start:stop, :width], group)))
        start = stop
    return found


def stacked_rows(mask: torch.Tensor, group: int) -> torch.Tensor:
    """The (1, 1, rows, keys) mask of a product over a segment's tokens (mask (tokens, keys)): a copy
    of them for each head of a group, then rows of zeros (padding rows, unmasked) up to
    :func:`product_rows`."""
    count = mask.shape[0]
    stacked = mask.repeat(group, 1)
    spare = product_rows(group, count) - group * count
    if spare:
        stacked = torch.cat([stacked, stacked.new_zeros(spare, mask.shape[1])])
    return stacked[None, None]


def element_segments(element: int, mask: torch.Tensor, group: int) -> list[Segment]:
    """One batch element's segments from its (n, padded) additive mask: runs of rows that each see
    a prefix of the keys and read the same padded number of them; then the other rows (a tree's
    nodes), by the number they read, each over its own keys gathered in order."""
    blocked = torch.finfo(mask.dtype).min
    seen = mask > blocked
    counts = seen.sum(-1)
    reads = ((counts + KEY_MULTIPLE - 1) // KEY_MULTIPLE).clamp_min(1) * KEY_MULTIPLE
    first = torch.arange(mask.shape[-1], device=mask.device) < counts[:, None]
    prefix = (seen == first).all(-1)
    found, widths, prefixes = [], reads.tolist(), prefix.tolist()
    start = 0
    for stop in range(1, len(widths) + 1):
        if stop < len(widths) and (widths[stop], prefixes[stop]) == (widths[start], prefixes[start]):
            continue
        if prefixes[start]:
            width = widths[start]
            found.append(Segment(element, slice(start, stop), width, stacked_rows(mask[start:stop, :width], group)))
        start = stop
    if not all(prefixes):
        order = torch.sort((~seen).to(torch.uint8), dim=-1, stable=True).indices
        ordered = torch.zeros_like(mask).masked_fill_(~first, blocked)
        for width in reads[~prefix].unique().tolist():
            rows = torch.nonzero((reads == width) & ~prefix).flatten()
            row_mask = ordered[rows, None, None, :width].expand(-1, 1, product_rows(group, 1), width)
            found.append(Segment(element, rows, width, row_mask, order[rows, :width]))
    return found


def product_rows(group: int, count: int) -> int:
    """Rows of an attention product over ``count`` query tokens: a head group's rows for each, padded
    to a multiple of MIN_ROWS (BLAS kernels take other paths for fewer rows, and the attention kernel
    cuts a product's rows into blocks of 32, 64 or 256: no block is then left with fewer)."""
    return -(-group * count // MIN_ROWS) * MIN_ROWS


def exact_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Scaled dot-product attention whose every query row is computed the same way whatever the
    forward carries. A row's product has the heads that share its key head as rows (in fours, with
    other tokens' rows beside them or zeros), and reads exactly its visible keys rounded up to a
    multiple of 64 (the rest masked): the kernel's sums then follow the same order in one-token
    decoding, in a k-token forward, in a batch and in a long prompt's prefill, on any number of
    threads (its threads split heads and blocks of rows, never one row's keys). Query (B, H, n, d),
    keys and values (B, H_kv, L, d); returns (B, n, H, d) as transformers expects."""
    batch, heads, n, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    padded = padded_keys(keys)
    if padded != keys:  # a cache without room (transformers' own): copy into padded keys
        pad = (0, 0, 0, padded - keys)
        key, value = F.pad(key, pad), F.pad(value, pad)
    found = segments(attention_mask, batch, n, keys, group, query.device)
    threads = torch.get_num_threads()
    with contextlib.nullcontext() if threads == 1 or threads_keep_rows(threads) else one_thread():
        if batch == 1 and len(found) == 1 and found[0].order is None:  # one-token decoding, most rounds
            return chain_product(query[0], key, value, found[0], group, scaling).transpose(0, 1)[None], None
        out = query.new_empty(batch, heads, n, dim)
        for segment in found:
            b = segment.element
            if segment.order is None:
                out[b, :, segment.rows] = chain_product(query[b], key[b : b + 1], value[b : b + 1], segment, group,
                                                        scaling)
            else:
                out[b][:, segment.rows] = gathered_product(query[b], key[b], value[b], segment, group, scaling)
    return out.transpose(1, 2), None


def chain_product(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segment: Segment, group: int,
                  scaling: float | None) -> torch.Tensor:
    """A segment of rows that each see a prefix of the keys, as one product per key head: its rows
    are each head of the key head's group for each token, stacked (then zeros, to the segment's
    rows). Query (H, n, d) of one batch element, keys and values (1, H_kv, L, d); returns (H, rows, d)."""
    heads, n, dim = query.shape
    kv_heads, width = key.shape[1], segment.keys
    q = query.view(kv_heads, group, n, dim)
    if segment.rows != slice(0, n):
        q = q[:, :, segment.rows]
    q = q.reshape(1, kv_heads, -1, dim)
    count, rows = q.shape[2], segment.mask.shape[2]
    if q.dtype != key.dtype:
        q = q.to(key.dtype)
    if rows != count:
        q = F.pad(q, (0, 0, 0, rows - count))
    if width != key.shape[2]:
        key, value = key[:, :, :width], value[:, :, :width]
    o = F.scaled_dot_product_attention(q, key, value, attn_mask=segment.mask, scale=scaling)
    o = o[0, :, :count].reshape(heads, -1, dim)
    return o if o.dtype == query.dtype else o.to(query.dtype)


def gathered_product(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segment: Segment, group: int,
                     scaling: float | None) -> torch.Tensor:
    """A segment of rows that do not each see a prefix of the keys (a tree's nodes): a product per
    row, (rows, H_kv, group, d), over its own keys gathered to the front in order. Query (H, n, d)
    of one batch element, keys and values (H_kv, L, d); returns (H, rows, d)."""
    heads, _, dim = query.shape
    kv_heads = key.shape[0]
    assert segment.order is not None, "a gathered segment has its rows' key orders"
    q = query[:, segment.rows].view(kv_heads, group, -1, dim).permute(2, 0, 1, 3).to(key.dtype)
    rows = segment.mask.shape[2]
    if rows != group:
        q = F.pad(q, (0, 0, 0, rows - group))
    k = key[:, segment.order].transpose(0, 1)
    v = value[:, segment.order].transpose(0, 1)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=segment.mask, scale=scaling)
    return o[:, :, :group].reshape(-1, heads, dim).transpose(0, 1).to(query.dtype)


_threads_keep_rows: dict[int, bool] = {}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """PyTorch's threads off for a while (a kernel whose results change with their number)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def threads_keep_rows(threads: int, seed: int = 0) -> bool:
    """Whether attention products give the same bits on ``threads`` threads as on one, for the shapes
    the engine uses (one-token decoding, a prefill block, a tree's rows, short and long keys). The
    answer is kept: attention then runs on ``threads`` threads, or on one where it is not so."""
    if threads in _threads_keep_rows:
        return _threads_keep_rows[threads]
    generator = torch.Generator().manual_seed(seed)
    before = torch.get_num_threads()
    same = True
    blocked = torch.finfo(torch.float32).min
    for batch, rows, width in ((1, MIN_ROWS, 64), (1, MIN_ROWS, 576), (1, MIN_ROWS, 8192), (4, MIN_ROWS, 1088),
                               (1, 3 * KEY_MULTIPLE, 640), (1, 3 * KEY_MULTIPLE, 4160)):
        q = torch.randn(batch, 3, rows, 64, generator=generator)
        k, v = (torch.randn(batch, 3, width, 64, generator=generator) for _ in range(2))
        mask = torch.zeros(batch, 1, rows, width)
        mask[..., width - 40 :] = blocked
        results = []
        for count in (1, threads):
            torch.set_num_threads(count)
            results.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125))
        torch.set_num_threads(before)
        same = same and torch.equal(*results)
    _threads_keep_rows[threads] = same
    if not same:
        log.info("attention runs on one thread: on %d its results change with the threads", threads)
    return same


def register_attention() -> None:
    """Register :func:`exact_attention`, with transformers' SDPA masks: callers that hand a 2D padding
    mask (transformers' own ``generate`` on a padded batch) get it as a 4D one (or None: causal)."""
    # transformers takes seconds to import: only when a model loads
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, exact_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


class PaddedLayer:
    """One attention layer's keys and values in a buffer with room: what a forward reads is padded to a
    multiple of 64 keys (zeros or stale entries past the length, masked out), so exact attention needs
    no copy. The transformers cache-layer calls a decoder forward makes."""

    is_sliding = False
    is_compileable = False
    is_initialized = True

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        padded = padded_keys(end)
        if self.keys is None or self.values is None or self.keys.shape[-2] < padded:
            room = max(padded, 2 * (0 if self.keys is None else self.keys.shape[-2]))
            grown_keys = key_states.new_zeros((*key_states.shape[:-2], room, key_states.shape[-1]))
            grown_values = value_states.new_zeros((*value_states.shape[:-2], room, value_states.shape[-1]))
            if self.keys is not None and self.values is not None:
                grown_keys[..., : self.length, :] = self.keys[..., : self.length, :]
                grown_values[..., : self.length, :] = self.values[..., : self.length, :]
            self.keys, self.values = grown_keys, grown_values
        self.keys[..., self.length : end, :] = key_states
        self.values[..., self.length : end, :] = value_states
        self.length = end
        return self.keys[..., :padded, :], self.values[..., :padded, :]

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return padded_keys(self.length + query_length), 0

    def get_max_length(self) -> int:
        return -1


class PaddedCache(LayeredCache):
    """The KV cache of a token-following target in an exact numerics (:class:`PaddedLayer` per layer);
    its forwards come with an explicit mask over the padded keys (:func:`chain_mask`)."""

    def __init__(self, n_layers: int) -> None:
        self.layers: list[PaddedLayer] = [PaddedLayer() for _ in range(n_layers)]

    def crop(self, max_length: int) -> None:
        """Keep ``max_length`` entries (a negative number: drop that many from the end), as transformers' caches."""
        for layer in self.layers:
            layer.length = max(0, layer.length + max_length if max_length < 0 else min(layer.length, max_length))


def padded_keys(length: int) -> int:
    return -(-length // KEY_MULTIPLE) * KEY_MULTIPLE


def chain_mask(cached: int, new: int, device: torch.device) -> torch.Tensor:
    """(1, 1, new, padded) additive mask: ``new`` tokens after ``cached`` ones, causal, padding masked.
    A decoding step's or a round's masks are kept; a prompt's, large and seen once, are not."""
    return _small_chain_mask(cached, new, device) if new <= KEY_MULTIPLE else _chain_mask(cached, new, device)


@functools.lru_cache(maxsize=64)
def _small_chain_mask(cached: int, new: int, device: torch.device) -> torch.Tensor:
    return _chain_mask(cached, new, device)


def _chain_mask(cached: int, new: int, device: torch.device) -> torch.Tensor:
    padded = padded_keys(cached + new)
    positions = torch.arange(cached, cached + new, device=device)
    allowed = torch.arange(padded, device=device)[None, :] <= positions[:, None]
    mask = torch.zeros((new, padded), device=device).masked_fill_(~allowed, torch.finfo(torch.float32).min)[None, None]
    setattr(mask, CHAIN, (cached, new))  # attention reads its segments from these, not from its entries
    return mask


def pad_mask(additive: torch.Tensor) -> torch.Tensor:
    """An additive (…, keys) mask widened to the padded keys, the padding masked."""
    keys = additive.shape[-1]
    extra = padded_keys(keys) - keys
    return F.pad(additive, (0, extra), value=torch.finfo(additive.dtype).min) if extra else additive


def computes_exactly(model: Any) -> bool:
    """Whether ``model`` runs an exact numerics (its attention is :func:`exact_attention`)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == ATTENTION


# -- the modes ----------------------------------------------------------------------------------------
LinearFactory = Callable[[torch.Tensor, "torch.Tensor | None"], nn.Module]


@dataclass(frozen=True)
class Numerics:
    """One way of computing the target: what its linear layers become, and what it guarantees."""

    name: str
    summary: str
    linear: LinearFactory | None  # None: the model as transformers loaded it, with no exactness guarantee

    @property
    def exact(self) -> bool:
        return self.linear is not None

    def apply(self, model: Any) -> Any:
        """Turn ``model`` (float32 as loaded) into this numerics, in place; returns it."""
        if self.linear is None:
            log.warning("numerics %r: outputs may differ from the target's plain decoding at near-ties "
                        "(valid token-exact numerics on CPU: %s)", self.name, ", ".join(EXACT_MODES))
            return model
        device = next(model.parameters()).device
        if device.type != "cpu":  # the exact kernels are PyTorch's CPU ones
            raise DraftwiseError(f"numerics {self.name!r} runs on cpu, not {device.type}; valid there: native")
        replace_linears(model, self.linear)
        register_attention()
        try:
            model.set_attn_implementation(ATTENTION)
        except (ValueError, AttributeError) as exc:
            raise DraftwiseError(f"numerics {self.name!r} needs a model whose attention transformers can swap "
                                 f"({type(model).__name__} cannot: {exc}); valid for it: native") from None
        lean_layers(model)
        return model


def linear_weights(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight (out, in), bias) of a linear layer: ``nn.Linear``, or transformers' ``Conv1D`` (GPT-2's,
    which stores its weight transposed); None for any other module."""
    if isinstance(module, nn.Linear):
        return module.weight, module.bias
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
        weight, bias = module.weight, module.bias
        assert isinstance(weight, torch.Tensor) and (bias is None or isinstance(bias, torch.Tensor))
        return weight.t(), bias
    return None


# Sibling projections of one input, multiplied as one product: fewer, larger kernel calls
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SharedProduct(nn.Module):
    """One product for several sibling layers that read the same input (a Llama layer's q, k and v
    projections): the first sibling called computes all of their outputs, the others take theirs."""

    def __init__(self, layer: nn.Module, parts: int) -> None:
        super().__init__()
        self.layer = layer
        # (input, output, shares taken) in a plain list: a module's own attributes are slow to set
        self.last: list[Any] = [None, None, 0]
        self.parts = parts

    def product(self, x: torch.Tensor) -> torch.Tensor:
        last = self.last
        if last[0] is not x:
            last[0], last[1], last[2] = x, self.layer(x), 0
        out = last[1]
        last[2] += 1
        if last[2] == self.parts:  # every sibling has its share: hold no activations between forwards
            last[0] = last[1] = None
        return out


class FusedPart(nn.Module):
    """A sibling layer's share (output columns ``start:stop``) of a :class:`SharedProduct`."""

    def __init__(self, shared: SharedProduct, start: int, stop: int) -> None:
        super().__init__()
        self.shared = shared
        self.start, self.stop = start, stop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared.product(x)[..., self.start : self.stop]


def norm_rows(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> torch.Tensor:
    """transformers' Llama RMSNorm, the same operations in the same order (no casts where the rows
    are float32 already); its weight and epsilon read once by the caller: a module's are slow to read."""
    rows = x if x.dtype == torch.float32 else x.to(torch.float32)
    rows = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + epsilon)
    return weight * (rows if x.dtype == torch.float32 else rows.to(x.dtype))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotary embedding (``x·cos + rotate_half(x)·sin``) of (…, heads, head_dim) rows,
    ``cos`` and ``sin`` broadcast over the heads: the same operations, elementwise, in the same order."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def fused_product(parts: tuple[nn.Module, ...]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The one product that sibling layers reading one input (a Llama layer's q, k, v; gate, up)
    were fused into by :func:`replace_linears`: their outputs side by side, in this order (:func:`fuse`)."""
    first = parts[0]
    assert isinstance(first, FusedPart) and all(isinstance(p, FusedPart) and p.shared is first.shared
                                                for p in parts), "an exact numerics fuses a Llama layer's siblings"
    return first.shared.layer.forward


def pack(states: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """The rows of a padded batch's (rows, width, d) ``states`` that hold tokens, as (tokens, d)."""
    return states.reshape(-1, states.shape[-1]).index_select(0, packed)


def unpack(states: torch.Tensor, packed: torch.Tensor | None, rows: torch.Size) -> torch.Tensor:
    """:func:`pack` undone: (tokens, d) back in their places of a (rows, width, d) batch, zeros
    elsewhere (padding: never seen by a token's attention, never read back). Every exact mode's
    products compute each row on its own, so a token's bits do not depend on the padding left out."""
    if packed is None:
        return states
    full = states.new_zeros((rows.numel(), states.shape[-1]))
    return full.index_copy_(0, packed, states).view(*rows, -1)


def lean_llama_forward(layer: Any) -> Callable[..., torch.Tensor]:
    """A Llama decoder layer's forward as one function over its (rebuilt) parts: the operations of
    transformers' own, without its per-module calls, decorators and keyword plumbing. Fused siblings
    (q, k, v; gate, up) are one product read by columns, and the queries' and keys' rotary embedding
    runs on their adjacent columns at once: the same elementwise operations, so the same bits. Its
    sub-modules' parameters stay the model's. Given a padded batch (its cache's ``packed``), the
    layer's products run on the tokens alone: a batch whose one row verifies 8 tokens multiplies
    R + 8 rows, not 9·R."""
    attention, mlp = layer.self_attn, layer.mlp
    first, second = layer.input_layernorm, layer.post_attention_layernorm
    first_weight, first_epsilon = first.weight, first.variance_epsilon
    second_weight, second_epsilon = second.weight, second.variance_epsilon
    qkv = fused_product((attention.q_proj, attention.k_proj, attention.v_proj))
    gate_up = fused_product((mlp.gate_proj, mlp.up_proj))
    o_proj, down, act = attention.o_proj.forward, mlp.down_proj.forward, mlp.act_fn.forward
    head_dim, scaling, index = attention.head_dim, attention.scaling, attention.layer_idx
    heads = attention.config.num_attention_heads
    kv_heads = heads // attention.num_key_value_groups
    k_end = (heads + kv_heads) * head_dim  # q | k | v: the keys end here

    def forward(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                cache: Any = None, **kwargs: Any) -> torch.Tensor:
        cache = kwargs.get("past_key_values") if cache is None else cache
        packed = getattr(cache, "packed", None)  # a padded batch: the positions that hold tokens
        rows = hidden_states.shape[:-1]
        states = hidden_states if packed is None else pack(hidden_states, packed)
        projected = unpack(qkv(norm_rows(states, first_weight, first_epsilon)), packed, rows)
        assert position_embeddings is not None, "Llama's forward hands every layer its rotary tables"
        cos, sin = (table.unsqueeze(-2) for table in position_embeddings)  # over the heads of (…, heads, d)
        rotated = rotate(projected[..., :k_end].view(*rows, heads + kv_heads, head_dim), cos, sin)
        query = rotated[..., :heads, :].transpose(1, 2).contiguous()  # a no-op for one token
        key = rotated[..., heads:, :].transpose(1, 2)
        value = projected[..., k_end:].view(*rows, kv_heads, head_dim).transpose(1, 2)
        key, value = (key.contiguous(), value.contiguous()) if cache is None else cache.update(key, value, index)
        out, _ = exact_attention(attention, query, key, value, attention_mask, scaling=scaling)
        out = out.reshape(*rows, -1)
        states = states + o_proj(out if packed is None else pack(out, packed))
        x = norm_rows(states, second_weight, second_epsilon)
        both = gate_up(x)
        inner = both.shape[-1] // 2  # gate | up
        return unpack(states + down(act(both[..., :inner]) * both[..., inner:]), packed, rows)

    forward.packs = True  # type: ignore[attr-defined]  # reads a padded batch's ``packed`` (packs_tokens)
    return forward


def packs_tokens(model: nn.Module) -> bool:
    """Whether ``model``'s layers multiply a padded batch's tokens alone (:func:`lean_llama_forward`)."""
    return any(getattr(layer.forward, "packs", False) for layer in model.modules())


def lean_layers(model: nn.Module) -> None:
    """Give every transformers ``LlamaDecoderLayer`` of ``model`` its lean forward, and a
    ``LlamaForCausalLM`` and its ``LlamaModel`` their lean model forwards (:func:`lean_causal_lm_forward`,
    :func:`lean_model_forward`: the latter is what a padded batch runs, its head applied apart)."""
    for layer in model.modules():
        if type(layer).__name__ == "LlamaDecoderLayer":
            layer.forward = lean_llama_forward(layer)
    if type(model).__name__ == "LlamaForCausalLM":
        model.forward = lean_causal_lm_forward(model)
        inner: Any = model.model
        if type(inner).__name__ == "LlamaModel":
            inner.forward = lean_model_forward(inner)


LEAN_CALL = frozenset({"input_ids", "attention_mask", "position_ids", "cache", "past_key_values", "use_cache",
                       "logits_to_keep", "output_hidden_states"})  # what the engine's forwards pass


def lean_call(kwargs: dict[str, Any]) -> bool:
    """Whether a forward's arguments are the engine's (token ids, a prepared 4-D mask, a cache, …)."""
    mask = kwargs.get("attention_mask")
    return LEAN_CALL.issuperset(kwargs) and kwargs.get("input_ids") is not None and mask is not None \
        and mask.dim() == 4


def lean_decoder(inner: Any) -> Callable[[dict[str, Any]], tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]]:
    """A ``LlamaModel``'s work for an engine call: embeddings, rotary tables, the layers and the final
    norm, the same operations in the same order as transformers'; the final norm's output, and with
    ``output_hidden_states`` every layer's input then that output (as transformers gives them)."""
    embed, rotary, norm = inner.embed_tokens.forward, inner.rotary_emb.forward, inner.norm.forward
    layers = [layer.forward for layer in inner.layers[: inner.config.num_hidden_layers]]

    def decode(kwargs: dict[str, Any]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        mask = kwargs["attention_mask"]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        hidden = embed(kwargs["input_ids"])
        positions = kwargs.get("position_ids")
        if positions is None:
            seen = cache.get_seq_length() if cache is not None else 0
            positions = (torch.arange(hidden.shape[1], device=hidden.device) + seen)[None]
        tables = rotary(hidden, position_ids=positions)
        states: list[torch.Tensor] | None = [] if kwargs.get("output_hidden_states") else None
        for layer in layers:
            if states is not None:
                states.append(hidden)
            hidden = layer(hidden, attention_mask=mask, position_embeddings=tables, cache=cache)
        hidden = norm(hidden)
        if states is None:
            return hidden, None
        states.append(hidden)
        return hidden, tuple(states)

    return decode


def lean_causal_lm_forward(model: Any) -> Callable[..., Any]:
    """A ``LlamaForCausalLM``'s forward for the calls the engine makes (:func:`lean_call`): the decoder
    (:func:`lean_decoder`) and the head on the rows kept, without transformers' decorators, mask
    builder and per-module calls. Any other call (transformers' ``generate``, training) goes to its own
    forward."""
    from transformers.modeling_outputs import CausalLMOutputWithPast  # with the model: loaded already

    own, decode, head = model.forward, lean_decoder(model.model), model.lm_head.forward

    def forward(**kwargs: Any) -> Any:
        if not lean_call(kwargs):
            return own(**kwargs)
        hidden, states = decode(kwargs)
        keep = kwargs.get("logits_to_keep", 0)  # the last ``keep`` rows (0: all), or the rows listed
        logits = head(hidden[:, slice(-keep, None) if isinstance(keep, int) else keep, :])
        # the cache stays the caller's: not handed back (its field's name changes across transformers)
        return CausalLMOutputWithPast(logits=logits, hidden_states=states)

    return forward


def lean_model_forward(inner: Any) -> Callable[..., Any]:
    """A ``LlamaModel``'s forward for the engine's calls (:func:`lean_decoder`); any other call goes to
    its own forward."""
    from transformers.modeling_outputs import BaseModelOutputWithPast  # with the model: loaded already

    own, decode = inner.forward, lean_decoder(inner)

    def forward(**kwargs: Any) -> Any:
        if not lean_call(kwargs):
            return own(**kwargs)
        hidden, states = decode(kwargs)
        return BaseModelOutputWithPast(last_hidden_state=hidden, hidden_states=states)

    return forward


def replace_linears(model: nn.Module, factory: LinearFactory) -> None:
    """Every linear layer of ``model`` rebuilt by ``factory``, siblings of one input (``FUSED``) as one
    product. The LM head keeps its float weight as ``weight`` (shared with the embedding when tied):
    white-box drafters read it."""
    outputs = getattr(model, "get_output_embeddings", None)
    head = outputs() if callable(outputs) else None
    for module in list(model.modules()):
        for names in FUSED:
            found = [linear_weights(getattr(module, name, nn.Identity())) for name in names]
            weights = [w for w in found if w is not None]
            if len(weights) == len(names) and len({w.shape[1] for w, _ in weights}) == 1:
                fuse(module, names, weights, factory)
        for child_name, child in list(module.named_children()):
            found_weights = linear_weights(child)
            if found_weights is not None:
                replacement = factory(*found_weights)
                if child is head:
                    replacement.weight = child.weight
                setattr(module, child_name, replacement)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False  # the head computes with its own weights now; never tie them back


def fuse(module: nn.Module, names: tuple[str, ...], weights: list[tuple[torch.Tensor, torch.Tensor | None]],
         factory: LinearFactory) -> None:
    """Replace ``module``'s layers ``names`` by parts of one product over their stacked weights."""
    stacked = torch.cat([w for w, _ in weights])
    biases = [b if b is not None else w.new_zeros(w.shape[0]) for w, b in weights]
    bias = None if all(b is None for _, b in weights) else torch.cat(biases)
    shared = SharedProduct(factory(stacked, bias), len(names))
    start = 0
    for name, (weight, _) in zip(names, weights):
        setattr(module, name, FusedPart(shared, start, start + weight.shape[0]))
        start += weight.shape[0]


LINEARS: dict[str, LinearFactory | None] = {
    "int4": Int4Linear,
    "bfloat16": lambda w, b: BlockLinear(w, b, torch.bfloat16, BLOCK_ROWS),
    "float32": lambda w, b: BlockLinear(w, b, torch.float32, 1),
    "native": None,
}
NUMERICS: dict[str, Numerics] = {name: Numerics(name, summary, LINEARS[name])
                                  for name, summary in NUMERICS_MODES.items()}


def numerics_named(name: str) -> Numerics:
    try:
        return NUMERICS[name]
    except KeyError:
        raise DraftwiseError(f"unknown numerics {name!r}; valid: {AUTO}, {', '.join(NUMERICS)}") from None


def coarser_than(numerics: Numerics, precision: str) -> bool:
    """Whether ``numerics`` holds the weights in less precision than the checkpoint's published ``precision``
    (a numerics name: int4, bfloat16 or float32), so that it rounds them and its answers may differ."""
    if not numerics.exact or precision not in EXACT_MODES:  # native computes in the dtype asked for, as asked
        return False
    return EXACT_MODES.index(numerics.name) < EXACT_MODES.index(precision)


def resolve_numerics(name: str, device: str, precision: str) -> Numerics:
    """The numerics a setting names; ``auto``: ``native`` off the CPU, else the mode of the
    checkpoint's own ``precision`` (int4, bfloat16 or float32), which the loader may trade for
    another that keeps the precision where this machine runs it faster
    (:func:`draftwise.models.costs.fastest_keeping`)."""
    if name == AUTO:
        name = precision if device.split(":", 1)[0] == "cpu" else "native"
    return numerics_named(name)
