"""The drafter bank: a lean forward for small Llama drafters that runs several of them at once.

Why: a drafter of about one layer × 128 hidden spends most of a transformers forward in Python
and dispatch overhead (≈ 0.8 ms on these CPUs whatever the size). Drafter numerics never touch
losslessness — the target decides every token — so drafters may run on this hand-written path:
the same maths (RMSNorm, rotary embeddings, grouped-query attention, SiLU-gated MLP) on stacked
weights with ``torch.bmm``. Drafters of one shape share a :class:`LlamaBank`; each is driven
through a :class:`BankLM` view with the :class:`~draftwise.models.cached_lm.CachedLM` interface, and the
evaluation phase feeds the newly verified tokens to *all* of them in one batched forward.

The target runs through transformers' model (in an exact numerics with its layers rebuilt:
:mod:`draftwise.models.numerics`), never through a bank.

The LM head (vocab × hidden: most of a small drafter's weights) is read on every drafted token
and by every evaluation phase. Where the CPU multiplies bfloat16 natively (AVX512-BF16 / AMX)
the bank keeps it in bfloat16 — measured 5× faster than float32 for 4 heads on 3 tokens
(2026-11-21) — and returns float32 logits; ``head_dtype`` overrides.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from draftwise.models.cached_lm import TreeCacheMixin, all_or_nothing, common_prefix_len
from draftwise.models.vocab_map import input_ids, output_size, vocab_map_of
from draftwise.verify.chain import top1_hits

SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
              "vocab_size", "rms_norm_eps", "tie_word_embeddings")


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rope_theta(config: Any) -> float | None:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if params.get("rope_type", params.get("type", "default")) != "default":
        return None
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def bank_key(model: Any) -> tuple | None:
    """A key equal for models that can share a bank; None when the lean path does not apply."""
    shape = _shape_key(model)
    if shape is None:
        return None
    parameter = next(model.parameters())
    vocab = vocab_map_of(model)
    return shape + (parameter.dtype, parameter.device, vocab.key if vocab is not None else None)


_SHAPE_KEYS: weakref.WeakKeyDictionary[Any, tuple | None] = weakref.WeakKeyDictionary()


def _shape_key(model: Any) -> tuple | None:
    """The config part of :func:`bank_key`, read once per model (a transformers config's attributes
    are slow to read, and a batch attaches every query's drafter copies to banks)."""
    if model in _SHAPE_KEYS:
        return _SHAPE_KEYS[model]
    config = model.config
    key: tuple | None = None
    if (type(model).__name__ == "LlamaForCausalLM" and getattr(config, "hidden_act", "silu") == "silu"
            and not getattr(config, "attention_bias", False) and not getattr(config, "mlp_bias", False)
            and _rope_theta(config) is not None):
        key = tuple(getattr(config, k) for k in SHAPE_KEYS) + (_head_dim(config), _rope_theta(config))
    _SHAPE_KEYS[model] = key
    return key


def _stack(tensors: list[torch.Tensor], transpose: bool = False) -> torch.Tensor:
    return torch.stack([t.detach().t() if transpose else t.detach() for t in tensors]).contiguous()


# Stacked weights are read-only: banks over the same models (one per Generator, e.g. one per
# benchmark method) share them. Keyed weakly by the first model, then by every member's identity.
_WEIGHTS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], dict[str, Any]]] = weakref.WeakKeyDictionary()


DEFAULT_HEAD_DTYPE = "auto"  # what banks use unless told otherwise (the test suite pins "float32")
MATMULS = ("qkv", "o", "gate_up", "down")  # a layer's weight matrices
# Forwards of at least this many rows (drafters × tokens: routing, catch-up, the evaluation phase)
# run the layers' matmuls in the head's low precision too. bfloat16 multiplies 7 × 65 rows 4×
# faster than float32, but a single row 3-5× slower (kernel overhead), so drafted tokens stay in
# float32; the break-even is ≈ 5 rows (measured, 1 thread).
WIDE_ROWS = 8


@functools.cache
def _native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (asked once: a batch makes a bank per query)."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_head_dtype(head_dtype: str | torch.dtype | None, weights_dtype: torch.dtype) -> torch.dtype:
    """``"auto"``: bfloat16 for a float32 bank on a CPU with native bfloat16 matmuls, else the weights' dtype."""
    head_dtype = DEFAULT_HEAD_DTYPE if head_dtype is None else head_dtype
    if isinstance(head_dtype, torch.dtype):
        return head_dtype
    if head_dtype == "auto":
        native = weights_dtype == torch.float32 and _native_bfloat16()
        return torch.bfloat16 if native else weights_dtype
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if head_dtype not in choices:
        raise ValueError(f"head_dtype {head_dtype!r}: expected 'auto' or one of {sorted(choices)}")
    return choices[head_dtype]


def single_row_dtype(head_dtype: str | torch.dtype | None, weights_dtype: torch.dtype) -> torch.dtype:
    """The dtype a white-box head multiplies one row in (one drafted token, bound by reading its weights).

    ``"auto"``: float16 for float32 weights — PyTorch's CPU float16 matrix–vector kernel reads half
    the bytes and accumulates in float32: 1.4× faster in the loop for the SmolLM2 EAGLE head, whose
    ≈ 16 MB of weights fall out of cache between rounds. Its many-row float16 products have no fast
    CPU kernel, so wider inputs keep :func:`resolve_head_dtype`'s choice. An explicit dtype is used as given.
    """
    head_dtype = DEFAULT_HEAD_DTYPE if head_dtype is None else head_dtype
    if head_dtype == "auto":
        return torch.float16 if weights_dtype == torch.float32 else weights_dtype
    return resolve_head_dtype(head_dtype, weights_dtype)


def _stacked_weights(models: Sequence[Any], head_dtype: torch.dtype) -> dict[str, Any]:
    per_first = _WEIGHTS.setdefault(models[0], {})
    key = tuple(id(m) for m in models) + (head_dtype,)
    if key not in per_first:
        inner = [m.model for m in models]
        layers = []
        low = head_dtype if head_dtype != next(models[0].parameters()).dtype else None
        for i in range(models[0].config.num_hidden_layers):
            blocks = [m.layers[i] for m in inner]
            attn = [b.self_attn for b in blocks]
            mlp = [b.mlp for b in blocks]
            layers.append({
                "in_norm": _stack([b.input_layernorm.weight for b in blocks]),
                "post_norm": _stack([b.post_attention_layernorm.weight for b in blocks]),
                "qkv": torch.cat([_stack([a.q_proj.weight for a in attn], True),  # (D, H, (nh+2nkv)·hd)
                                  _stack([a.k_proj.weight for a in attn], True),
                                  _stack([a.v_proj.weight for a in attn], True)], dim=2).contiguous(),
                "o": _stack([a.o_proj.weight for a in attn], True),
                "gate_up": torch.cat([_stack([m.gate_proj.weight for m in mlp], True),
                                      _stack([m.up_proj.weight for m in mlp], True)], dim=2).contiguous(),
                "down": _stack([m.down_proj.weight for m in mlp], True),
            })
            if low is not None:  # low-precision copies for wide forwards (see LlamaBank.forward)
                layers[-1].update({f"{name}_low": layers[-1][name].to(low) for name in MATMULS})
        per_first[key] = {
            "embed": _stack([m.embed_tokens.weight for m in inner]),  # (D, V, H)
            # float32 multiplies fastest as (D, H, V); bfloat16 as (D, V, H) read transposed (measured)
            "head": _stack([m.lm_head.weight.to(head_dtype) for m in models], transpose=head_dtype == torch.float32),
            "final_norm": _stack([m.norm.weight for m in inner]),  # (D, H)
            "layers": layers,
        }
    return per_first[key]


MIN_CAPACITY = 256  # a bank's first KV buffers: positions (doubled when a forward needs more)


class LlamaBank:
    """D Llama drafters of one shape: stacked weights, one KV cache slot each."""

    def __init__(self, models: Sequence[Any], head_dtype: str | torch.dtype | None = None) -> None:
        config = models[0].config
        self.count = len(models)
        self.n_heads, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = _head_dim(config)
        self.eps = config.rms_norm_eps
        self.vocab = vocab_map_of(models[0])  # every member speaks the same (bank_key): None = the target's
        self.vocab_size = output_size(models[0])
        theta = _rope_theta(config)
        if theta is None:
            raise ValueError("a drafter bank needs default rotary embeddings (see bank_key)")
        device = next(models[0].parameters()).device
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
                                         / self.head_dim))
        self.head_dtype = resolve_head_dtype(head_dtype, next(models[0].parameters()).dtype)
        weights = _stacked_weights(models, self.head_dtype)
        self.embed, self.head, self.final_norm, self.layers = (
            weights["embed"], weights["head"], weights["final_norm"], weights["layers"])
        self.dtype, self.device = self.embed.dtype, self.embed.device
        self.sliced: dict[tuple[int | None, int | None], dict[str, Any]] = {}
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.cos = self.sin = torch.empty(0)  # rotary tables for positions < capacity
        # No buffers until the first forward: a batch makes a bank per query, and most queries
        # never play a model arm (allocating them was ≈ 1 ms of a lane's join on this CPU).
        self.tokens: list[list[int]] = [[] for _ in range(self.count)]  # per drafter: tokens in its slot
        self.views: list[Any] = [None] * self.count  # the BankLM of each slot (to resolve pending draft trees)

    def _grow(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        with torch.inference_mode(False):  # plain tensors: a draft tree's moves write them outside inference mode
            self._reallocate(needed)

    def _reallocate(self, needed: int) -> None:
        capacity = max(needed, 2 * self.capacity, MIN_CAPACITY)
        shape = (self.count, self.n_kv, capacity, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        for old, new in zip(self.keys + self.values, keys + values):
            new[:, :, : self.capacity] = old
        self.keys, self.values, self.capacity = keys, values, capacity
        # rotary tables computed once per capacity, not per forward (a drafted token is ~60 small ops)
        freqs = torch.outer(torch.arange(capacity, dtype=torch.float32, device=self.device), self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if weight.shape[0] == 1 and x.dtype == torch.float32:  # one drafter: the fused op with its weight
            return F.rms_norm(x, (x.shape[-1],), weight[0], eps)
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
        return weight[:, None, :] * normed.to(x.dtype)

    def _weights(self, which: slice) -> dict[str, Any]:
        """The weights of the drafters in ``which``, sliced once (a drafted token is ~60 small ops:
        slicing the stacks anew on each one costs a measurable share)."""
        key = (which.start, which.stop)
        if key not in self.sliced:
            head = self.head[which]
            self.sliced[key] = {
                "layers": [{name: w[which] for name, w in layer.items()} for layer in self.layers],
                "final_norm": self.final_norm[which],
                "head": head if self.head_dtype == torch.float32 else head.transpose(1, 2),
                "embed": self.embed[which],
            }
        return self.sliced[key]

    @torch.inference_mode()
    def forward(self, which: slice, ids: list[int], start: int, n_out: int, positions: list[int] | None = None,
                allowed: torch.Tensor | None = None) -> torch.Tensor:
        """Feed ``ids`` into cache slots ``start..`` of the drafters in ``which``; logits (B, n_out, V).

        By default at positions ``start..`` with a causal mask; a draft tree passes its own
        (depth-based) ``positions`` and ``allowed`` (len(ids), start + len(ids)) bool mask.
        """
        x = self.features(which, ids, start, n_out, positions, allowed)
        logits = torch.bmm(x.to(self.head_dtype), self._weights(which)["head"]).float()  # (B, n_out, V)
        return logits if self.vocab is None else self.vocab.target_logits(logits)

    @torch.inference_mode()
    def features(self, which: slice, ids: list[int], start: int, n_out: int, positions: list[int] | None = None,
                 allowed: torch.Tensor | None = None) -> torch.Tensor:
        """Like :meth:`forward`, but the LM head's inputs (B, n_out, H): the final-normed hidden states."""
        length = len(ids)
        self._grow(start + length)
        weights = self._weights(which)
        x = weights["embed"][:, input_ids(self.vocab, ids, self.device)]  # (B, T, H)
        batch = x.shape[0]
        if positions is None:
            cos, sin = self.cos[start : start + length], self.sin[start : start + length]  # (T, hd)
        else:
            where = torch.tensor(positions, device=self.device)
            cos, sin = self.cos[where], self.sin[where]
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        low = self.head_dtype if self.head_dtype != self.dtype and batch * length >= WIDE_ROWS else None

        def mm(h: torch.Tensor, layer: dict[str, Any], name: str) -> torch.Tensor:
            if low is None:
                return torch.bmm(h, layer[name])
            return torch.bmm(h.to(low), layer[f"{name}_low"]).to(self.dtype)

        mask = allowed
        if mask is None and length > 1:  # position i sees the cache and new positions ≤ i
            mask = torch.ones(length, start + length, dtype=torch.bool, device=self.device).tril(diagonal=start)
        elif mask is not None:
            mask = mask.to(self.device)
        for i, layer in enumerate(weights["layers"]):
            h = self._rms(x, layer["in_norm"], self.eps)
            qkv = mm(h, layer, "qkv")  # (B, T, (nh + 2 nkv) hd)
            qk, v = qkv.split([(nh + nkv) * hd, nkv * hd], dim=-1)
            qk = _rotate(qk.view(batch, length, nh + nkv, hd).transpose(1, 2), cos, sin)  # q and k at once
            q, k = qk.split([nh, nkv], dim=1)
            v = v.view(batch, length, nkv, hd).transpose(1, 2)
            self.keys[i][which, :, start : start + length] = k
            self.values[i][which, :, start : start + length] = v
            keys = self.keys[i][which, :, : start + length]
            values = self.values[i][which, :, : start + length]
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=nkv != nh)
            x = x + mm(attn.transpose(1, 2).reshape(batch, length, nh * hd), layer, "o")
            h = self._rms(x, layer["post_norm"], self.eps)
            gate, up = mm(h, layer, "gate_up").chunk(2, dim=-1)
            x = x + mm(F.silu(gate) * up, layer, "down")
        return self._rms(x[:, -n_out:], weights["final_norm"], self.eps)

    def reset(self) -> None:
        """Forget every slot's tokens (an interrupted batched forward may have half-written them)."""
        for slot in range(self.count):
            self.tokens[slot] = []
            if self.views[slot] is not None:
                self.views[slot].tree = None

    @all_or_nothing
    def sync_all(self, tokens: Sequence[int], n_out: int) -> torch.Tensor:
        """Logits (D, n_out, V) of every drafter after ``tokens``, in one batched forward.

        Every slot is cut back to the shortest common prefix (a played drafter may re-feed a few
        accepted draft tokens) so all drafters continue from the same position. A slot's pending
        draft tree is resolved first (its accepted path kept).
        """
        return self.forward(slice(None), *self._sync_plan(tokens, n_out), n_out)

    @all_or_nothing
    @torch.inference_mode()
    def top1_all(self, tokens: Sequence[int], targets: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Whether each drafter's top-1 after each of the last ``len(targets)`` positions of ``tokens``
        is the next token (``targets``): (D, len(targets)) bool, synced like :meth:`sync_all`.

        What routing needs, without the (D, n, V) float32 logits: each drafter's scores are made
        in the head's precision and reduced at once (a fresh multi-megabyte tensor costs page
        faults; one drafter's scores stay in cache).
        """
        n_out = len(targets)
        x = self.features(slice(None), *self._sync_plan(tokens, n_out), n_out).to(self.head_dtype)
        head = self._weights(slice(None))["head"]
        targets = torch.as_tensor(targets, device=self.device)
        if self.vocab is None:
            return torch.stack([top1_hits(x[d] @ head[d], targets) for d in range(self.count)])
        # over a vocabulary subset: the drafter's top-1 among the tokens it can propose, and a
        # target token it cannot propose is never a hit
        mapped, listed = self.vocab.draft_targets(targets), self.vocab.other
        hits = [top1_hits((x[d] @ head[d])[..., :listed], mapped.clamp(min=0)) for d in range(self.count)]
        return torch.stack(hits) & (mapped >= 0)

    def _sync_plan(self, tokens: Sequence[int], n_out: int) -> tuple[list[int], int]:
        """Cut every slot back to what all share with ``tokens``: the ids to feed and where from."""
        for view in self.views:
            if view is not None and view.tree is not None:
                view._resolve_tree(tokens)
        keep = min(min(common_prefix_len(seen, tokens) for seen in self.tokens), len(tokens) - n_out)
        self.tokens = [list(tokens) for _ in range(self.count)]
        return list(tokens[keep:]), keep


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class BankLM(TreeCacheMixin):
    """One drafter of a bank, with the :class:`~draftwise.models.cached_lm.TokenCache` interface."""

    def __init__(self, bank: LlamaBank, slot: int, model: Any) -> None:
        self.bank, self.slot, self.model = bank, slot, model
        self.tree = None
        bank.views[slot] = self
        self.which = slice(slot, slot + 1)
        self.device = bank.device
        self.vocab_size = bank.vocab_size
        self.calls = 0

    @property
    def tokens(self) -> list[int]:
        return self.bank.tokens[self.slot]

    @tokens.setter
    def tokens(self, value: list[int]) -> None:
        self.bank.tokens[self.slot] = value

    def reset(self) -> None:
        self.bank.tokens[self.slot] = []
        self.tree = None

    @all_or_nothing
    def logits(self, tokens: Sequence[int], n_out: int = 1) -> torch.Tensor:
        self._resolve_tree(tokens)
        keep = min(common_prefix_len(self.tokens, tokens), len(tokens) - n_out)
        self.bank.tokens[self.slot] = list(tokens)
        self.calls += 1
        return self.bank.forward(self.which, list(tokens[keep:]), keep, n_out)[0]

    @all_or_nothing
    def extend(self, new_tokens: Sequence[int], n_out: int = 1) -> torch.Tensor:
        if self.tree is not None:
            return self.logits(self.tokens + list(new_tokens), n_out)
        start = len(self.tokens)
        self.tokens.extend(new_tokens)
        self.calls += 1
        return self.bank.forward(self.which, list(new_tokens), start, n_out)[0]

    # the draft-tree hooks: the slot's buffers are fixed-size, entries past the end are just overwritten
    @all_or_nothing
    def _masked_forward(self, ids: list[int], positions: list[int], allowed: torch.Tensor, n_out: int) -> torch.Tensor:
        self.calls += 1
        start = allowed.shape[1] - len(ids)
        return self.bank.forward(self.which, ids, start, n_out, positions, allowed)[0]

    def _move(self, sources: list[int], start: int) -> None:
        index = torch.tensor(sources, dtype=torch.long, device=self.device)
        for buffers in (self.bank.keys, self.bank.values):
            for layer in buffers:
                layer[self.slot, :, start : start + len(sources)] = layer[self.slot, :, index]

    def _truncate(self, length: int) -> None:
        pass  # attention never reads past the entries a forward is told about
