"""One target forward for many queries: a KV cache with one row per query, each row its own length.

:class:`BatchedLM` keeps every active query's keys and values in one preallocated buffer per
layer, shaped (rows, heads, capacity, head_dim). Row ``r`` holds its query's cached tokens at
slots ``0 … len_r − 1`` (slot = position for a chain). A forward feeds each row its own new
tokens, padded to the longest: row ``r``'s j-th token is written at slot ``len_r + j``, and a
per-row attention mask lets each query see exactly its own cached slots and its own new tokens
(causally, or along a draft tree). Padding writes land beyond a row's length and are overwritten
later, and cutting a row back after a rejection only lowers its length: no copying, no holes.

:class:`RowLM` is one row seen as a :class:`~draftwise.models.cached_lm.TokenCache` (the engine's target
for one query): alone it runs batch-of-one forwards on its row (the prompt, a white-box prefill);
the batched round asks every row for its :class:`RowInput` and runs them in one forward.

Rows stay packed (0 … B − 1): a leaving query's row takes the last row's contents, so every
forward reads one contiguous slice of the buffers, never a gathered copy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from draftwise.models.cached_lm import (
    HiddenStatesMixin,
    PendingTree,
    RowBuffer,
    cache_keyword,
    common_prefix_len,
    layer_rows,
)
from draftwise.models.layered_cache import LayeredCache, decoder_layers
from draftwise.models.numerics import computes_exactly, packs_tokens, padded_keys
from draftwise.verify.tree import check_tree, tree_attention_mask, tree_positions


@dataclass
class RowInput:
    """What one row feeds in a forward: token ids after its ``cached`` slots, their positions,
    how many trailing logits it needs, and which keys each may see (a tree's mask)."""

    row: RowLM
    ids: list[int]
    positions: list[int]
    cached: int  # slots of the row's cache kept before these tokens
    n_out: int
    allowed: torch.Tensor | None = None  # None: causal (a chain); a tree's (n, cached + n) bool mask


class RowLayer:
    """One attention layer's keys and values for every row (the transformers cache-layer calls)."""

    is_sliding = False
    is_compileable = False
    is_initialized = True

    def __init__(self, owner: BatchedLM) -> None:
        self.owner = owner
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        plan = self.owner.plan
        assert plan is not None, "a forward runs inside BatchedLM.run"
        if self.keys is None or self.values is None:
            self.keys = key_states.new_zeros(self.owner.buffer_shape(key_states))
            self.values = value_states.new_zeros(self.owner.buffer_shape(value_states))
        keys, values = self.keys[plan.rows], self.values[plan.rows]  # views: writes land in the buffers
        index = plan.slots[:, None, :, None]
        keys.scatter_(2, index.expand(-1, keys.shape[1], -1, keys.shape[3]), key_states)
        values.scatter_(2, index.expand(-1, values.shape[1], -1, values.shape[3]), value_states)
        return keys[:, :, : plan.kv_len], values[:, :, : plan.kv_len]

    def get_seq_length(self) -> int:
        plan = self.owner.plan
        return 0 if plan is None else plan.kv_len - plan.slots.shape[1]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        plan = self.owner.plan
        return (0 if plan is None else plan.kv_len), 0

    def get_max_length(self) -> int:
        return -1

    def resize(self, rows: int, capacity: int) -> None:
        """Grow the buffers to at least ``rows`` × ``capacity`` (contents kept)."""
        for name in ("keys", "values"):
            old = getattr(self, name)
            if old is None or (old.shape[0] >= rows and old.shape[2] >= capacity):
                continue
            # rows double: a join costs O(1) amortized, not a copy of every row
            grow_rows = old.shape[0] if old.shape[0] >= rows else max(rows, 2 * old.shape[0])
            shape = (grow_rows, old.shape[1], max(capacity, old.shape[2]), old.shape[3])
            grown = old.new_zeros(shape)
            grown[: old.shape[0], :, : old.shape[2]] = old
            setattr(self, name, grown)

    def copy_row(self, source: int, dest: int) -> None:
        for buffer in (self.keys, self.values):
            if buffer is not None:
                buffer[dest] = buffer[source]

    def move(self, row: int, sources: list[int], start: int) -> None:
        index = torch.tensor(sources, dtype=torch.long, device=self.owner.device)
        for buffer in (self.keys, self.values):
            if buffer is not None:  # gather first: sources and destinations may overlap
                buffer[row, :, start : start + len(sources)] = buffer[row].index_select(1, index)


@dataclass
class ForwardPlan:
    rows: slice  # the rows fed (contiguous)
    slots: torch.Tensor  # (rows, n) where each fed token's keys and values go
    kv_len: int  # slots visible to this forward (the longest row's cache + its new tokens)
    packed: torch.Tensor | None = None  # (tokens,) where each fed token sits in the flat (rows × width) batch


class RowCache(LayeredCache):
    """The transformers ``Cache`` surface a decoder forward touches, over :class:`RowLayer` buffers."""

    def __init__(self, owner: BatchedLM, n_layers: int) -> None:
        self.owner = owner
        self.layers: list[RowLayer] = [RowLayer(owner) for _ in range(n_layers)]

    @property
    def packed(self) -> torch.Tensor | None:
        """The forward's token positions when its rows are padded (the exact layers then multiply
        the tokens alone: :func:`draftwise.models.numerics.lean_llama_forward`), else None."""
        plan = self.owner.plan
        return None if plan is None else plan.packed


class BatchedLM:
    """The target's KV cache for a batch of queries, one row each; :meth:`run` is one forward."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.rows: list[RowLM] = []
        self.capacity = 0
        self.calls = 0
        self.reserve_s = 0.0  # seconds spent growing the buffers (inside run): not a forward's cost
        self.cache_keyword = cache_keyword(model)
        self.exact = computes_exactly(model)
        # a padded forward multiplies its tokens alone, not rows × the longest row's width
        self.packs = self.exact and packs_tokens(model)
        self.plan: ForwardPlan | None = None
        self.cache = self._new_cache()
        # The decoder and its LM head, for padded batches of an exact target: the head then multiplies
        # only the rows whose logits are asked for (one row verifying 3 draft tokens in a batch of 8
        # made the head multiply 32 rows for 11 wanted). None where the model does not split so.
        decoder, head = getattr(model, "model", None), model.get_output_embeddings()
        self.head_apart = (decoder, head) if self.packs and isinstance(decoder, torch.nn.Module) else None

    def _new_cache(self) -> RowCache:
        return RowCache(self, decoder_layers(self.model))

    def buffer_shape(self, states: torch.Tensor) -> tuple[int, int, int, int]:
        return (max(len(self.rows), 1), states.shape[1], max(self.capacity, 1), states.shape[3])

    # -- rows -------------------------------------------------------------------------------------
    @torch.inference_mode()
    def add_row(self) -> RowLM:
        row = RowLM(self, len(self.rows))
        self.rows.append(row)
        for layer in self.cache.layers:
            layer.resize(len(self.rows), self.capacity)
        return row

    @torch.inference_mode()
    def drop_row(self, row: RowLM) -> None:
        """Free ``row``: the last row moves into its place (rows stay packed)."""
        last = self.rows.pop()
        if last is not row:
            for layer in self.cache.layers:
                layer.copy_row(last.index, row.index)
            last.index = row.index
            self.rows[row.index] = last
        row.index = -1

    def reset(self) -> None:
        """Forget every row's cache (an interrupted forward may have left any of them half-written)."""
        for row in self.rows:
            row.forget()

    def kv_bytes(self) -> int:
        """Memory held by the keys and values of every layer (all rows, full capacity)."""
        return sum(t.numel() * t.element_size() for layer in self.cache.layers for t in (layer.keys, layer.values)
                   if t is not None)

    @torch.inference_mode()
    def reserve(self, rows: int, length: int) -> None:
        """Make room now for ``rows`` rows of ``length`` slots (a join: what its queries may reach),
        so that no round has to grow the buffers — each growth copies every row — and rows joining
        one by one do not double the buffers once per power of two."""
        start = time.perf_counter()
        self.capacity = max(self.capacity, length)
        for layer in self.cache.layers:
            layer.resize(rows, self.capacity)
        self.reserve_s += time.perf_counter() - start

    def _reserve(self, length: int) -> None:
        if length > self.capacity:  # a forward that needs more room: double (rows as they are)
            self.reserve(len(self.rows), max(2 * self.capacity, length, 64))

    # -- one forward for many rows ----------------------------------------------------------------
    @torch.inference_mode()
    def run(self, inputs: Sequence[RowInput], argmax: bool = False) -> list[torch.Tensor]:
        """One forward feeding every input's tokens to its row; float32 logits (n_out, V) per input.

        With ``argmax``, each row's ``choices`` also get the target's argmax at those n_out
        positions, from one max over the whole batch (a max per row costs ≈ 20 µs of call overhead
        on CPU: most of a greedy batch's bookkeeping). The inputs' rows must be distinct and
        contiguous (a whole batch, or one row). A failure inside the forward leaves the fed rows
        empty (their caches may be half-written)."""
        indices = sorted(i.row.index for i in inputs)
        if indices != list(range(indices[0], indices[0] + len(indices))):
            raise ValueError("a batched forward feeds distinct, contiguous rows")
        given = list(inputs)
        inputs = sorted(given, key=lambda i: i.row.index)
        width = max(len(i.ids) for i in inputs)
        cached = [i.cached for i in inputs]
        kv_len = max(c + width for c in cached)
        if self.exact:  # keys padded to the exact attention's multiple: read in place, never copied
            kv_len = padded_keys(kv_len)
        self._reserve(kv_len)
        ids = torch.zeros((len(inputs), width), dtype=torch.long)
        positions = torch.zeros((len(inputs), width), dtype=torch.long)
        for b, item in enumerate(inputs):
            n = len(item.ids)
            ids[b, :n] = torch.tensor(item.ids)
            positions[b, :n] = torch.tensor(item.positions)
            positions[b, n:] = item.positions[-1] if item.positions else 0
        slots = torch.tensor(cached)[:, None] + torch.arange(width)[None, :]
        # causal over each row's own slots; padding queries too (never a fully masked row: no NaN)
        allowed = torch.arange(kv_len)[None, None, :] <= slots[:, :, None]
        for b, item in enumerate(inputs):
            if item.allowed is not None:  # a tree: exactly the mask it asked for
                allowed[b, : len(item.ids), : item.cached + len(item.ids)] = item.allowed
                allowed[b, : len(item.ids), item.cached + len(item.ids) :] = False
        blocked = torch.finfo(self.dtype).min
        mask = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill(~allowed, blocked)[:, None]
        lengths = [len(i.ids) for i in inputs]
        packed = None
        if self.packs and min(lengths) < width:  # padded: the products skip the padding
            packed = torch.tensor([b * width + j for b, n in enumerate(lengths) for j in range(n)], device=self.device)
        self.plan = ForwardPlan(slice(indices[0], indices[0] + len(indices)), slots.to(self.device), kv_len, packed)
        keep_hidden = any(i.row.hidden_layers for i in inputs)
        # the LM head runs only where some row needs logits (a prompt needs its last position only):
        # of a padded batch, exactly those rows; else the last ``keep`` positions of every row
        split = self.head_apart if packed is not None else None
        keep = max(width - len(i.ids) + i.n_out for i in inputs)
        feed = {"input_ids": ids.to(self.device), "position_ids": positions.to(self.device),
                "attention_mask": mask.to(self.device), "use_cache": True, self.cache_keyword: self.cache,
                **({"output_hidden_states": True} if keep_hidden else {})}
        try:
            if split is None:
                out = self.model(**feed, logits_to_keep=keep)
                logits = out.logits
            else:
                out = split[0](**feed)
                hidden = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
                wanted = [b * width + j for b, n in enumerate(lengths) for j in range(n - inputs[b].n_out, n)]
                logits = split[1](hidden.index_select(0, torch.tensor(wanted, device=self.device)))
        except BaseException:
            for item in inputs:
                item.row.forget()
            raise
        finally:
            self.plan = None
        self.calls += 1
        choices = logits.max(-1).indices.tolist() if argmax else None  # argmax's first maximal index
        if choices is None:
            wait_for(self.device)  # the caller times this forward: on a GPU, kernels run after the call returns
        results, start = {}, 0
        for b, item in enumerate(inputs):
            n = len(item.ids)
            item.row.length = cached[b] + n
            if item.row.hidden_layers:
                item.row.hidden.append(layer_rows(out.hidden_states, item.row.hidden_layers, b, n))
            if split is None:
                first = keep - width + n - item.n_out  # logits row of position n - n_out
                results[id(item)] = logits[b, first : first + item.n_out].float()
                item.row.choices = None if choices is None else choices[b][first : first + item.n_out]
            else:
                results[id(item)] = logits[start : start + item.n_out].float()
                item.row.choices = None if choices is None else choices[start : start + item.n_out]
                start += item.n_out
        return [results[id(item)] for item in given]  # in the order given


def wait_for(device: torch.device) -> None:
    """Block until ``device`` has run the work queued on it (CUDA, MPS, XPU: asynchronous; the CPU
    is not), so a timed forward is timed whole."""
    if device.type == "cpu":
        return
    sync = getattr(getattr(torch, device.type, None), "synchronize", None)
    if callable(sync):
        sync()


class RowLM(HiddenStatesMixin):
    """One row of a :class:`BatchedLM`: a query's target cache, following its token sequence.

    ``tokens`` are the tokens whose keys and values the row holds (its first ``length`` slots);
    a pending draft tree (:class:`~draftwise.models.cached_lm.TreeCacheMixin`) sits after them until the
    next sync keeps its accepted path.
    """

    def __init__(self, batch: BatchedLM, index: int) -> None:
        self.batch = batch
        self.index = index
        self.model = batch.model
        self.vocab_size = batch.vocab_size
        self.device = batch.device
        self.hidden_layers: tuple[int, ...] = ()
        self.calls = 0
        self.choices: list[int] | None = None  # the target's argmax at the last forward's rows (run(argmax=True))
        self.forget()

    def forget(self) -> None:
        self.tokens: list[int] = []
        self.length = 0
        self.tree = None
        self.hidden = RowBuffer()

    def reset(self) -> None:
        self.forget()

    # -- inputs for a batched forward ---------------------------------------------------------------
    def chain_input(self, tokens: Sequence[int], n_out: int = 1) -> RowInput:
        """Sync to ``tokens`` (keep the common prefix, drop the rest) and feed the unseen tokens."""
        self._resolve_tree(tokens)
        keep = min(common_prefix_len(self.tokens, tokens), len(tokens) - n_out)
        self._truncate(keep)
        fresh = list(tokens[keep:])
        self.tokens = list(tokens)
        return RowInput(self, fresh, list(range(keep, len(tokens))), keep, n_out)

    def tree_input(self, context: Sequence[int], tokens: Sequence[int], parents: Sequence[int]) -> RowInput:
        """Sync to ``context`` and feed a draft tree after it (logits: after the context, then each node)."""
        self._resolve_tree(context)
        keep = min(common_prefix_len(self.tokens, context), len(context) - 1)
        self._truncate(keep)
        fresh = list(context[keep:])
        self.tokens = list(context)
        self.tree = PendingTree(len(context), list(tokens), list(parents))
        check_tree(tokens, parents)
        allowed = tree_attention_mask(parents, keep, len(fresh))
        positions = list(range(keep, len(context))) + tree_positions(parents, len(context))
        return RowInput(self, fresh + list(tokens), positions, keep, len(tokens) + 1, allowed)

    # -- the TokenCache calls, as batch-of-one forwards ------------------------------------------------
    def logits(self, tokens: Sequence[int], n_out: int = 1) -> torch.Tensor:
        return self._run(self.chain_input(tokens, n_out))

    def extend(self, new_tokens: Sequence[int], n_out: int = 1) -> torch.Tensor:
        return self.logits(self.tokens + list(new_tokens), n_out)

    def tree_logits(self, context: Sequence[int], tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        return self._run(self.tree_input(context, tokens, parents))

    def tree_extend(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        raise NotImplementedError("a batched target verifies whole trees; trees are grown on drafters")

    def _run(self, item: RowInput) -> torch.Tensor:
        self.calls += 1
        return self.batch.run([item])[0]

    # -- TreeCacheMixin's cache operations on this row --------------------------------------------------
    @torch.inference_mode()
    def _move(self, sources: list[int], start: int) -> None:
        for layer in self.batch.cache.layers:
            layer.move(self.index, sources, start)
        self.hidden.move(sources, start)

    def _truncate(self, length: int) -> None:
        self.length = min(self.length, length)
        self.hidden.truncate(length)
