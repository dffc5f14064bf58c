"""A causal LM whose KV cache follows a token sequence: the target's cache, and an LM drafter's.

:class:`CachedLM` is the one place where caches are kept, cut back and caught up: given the
token sequence it should have seen, it keeps the longest common prefix already cached, crops the
rest (rejected draft tokens) and feeds only the tokens it has not seen (a drafter's catch-up
after idle rounds, MetaSD's switching cost). Accepted tokens are never recomputed.

:class:`TokenCache` is the interface the engine and the drafters rely on; :class:`CachedLM`
(transformers' forward) and :class:`~draftwise.models.drafter_bank.BankLM` (one drafter of a batched
bank) implement it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

from draftwise.errors import DraftwiseError
from draftwise.models.layered_cache import decoder_layers
from draftwise.models.numerics import PaddedCache, chain_mask, computes_exactly, pad_mask
from draftwise.models.vocab_map import VocabMap, input_ids, output_size, vocab_map_of
from draftwise.verify.tree import additive_mask, check_tree, match_path, tree_attention_mask, tree_positions

Method = TypeVar("Method", bound=Callable[..., Any])

log = logging.getLogger(__name__)


def all_or_nothing(method: Method) -> Method:
    """A cache update either completes or leaves an empty cache: an exception (Ctrl-C, a timer
    signal) inside a forward would otherwise leave the recorded tokens ahead of the keys and
    values actually stored, and later queries would read a corrupt cache."""

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self.reset()
            raise

    return guarded  # type: ignore[return-value]


PROMPT_BLOCK = 512  # a long prompt's tokens per forward in an exact numerics (rows are exact in any split)
PROGRESS_AFTER_S = 2.0  # a prompt read for longer than this logs its progress


def prompt_blocks(tokens: int) -> list[int]:
    """Where the forwards over ``tokens`` prompt tokens stop when fed in blocks (PROMPT_BLOCK each),
    all but the last block, which the caller feeds with the rows it needs logits of: memory stays
    bounded by a block whatever the prompt's length.

    >>> prompt_blocks(1300), prompt_blocks(512), prompt_blocks(0)
    ([512, 1024], [], [])
    """
    return list(range(PROMPT_BLOCK, tokens, PROMPT_BLOCK))


class PrefillProgress:
    """Logs how far a long prompt has been read, once it has taken more than PROGRESS_AFTER_S."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.start = time.perf_counter()

    def __call__(self, done: int) -> None:
        seconds = time.perf_counter() - self.start
        if seconds > PROGRESS_AFTER_S:
            log.info("read %d of %d prompt tokens (%.0f tokens/s)", done, self.total, done / seconds)


class TokenCache(Protocol):
    """A causal LM whose cache follows a token sequence: what the engine and LM drafters call."""

    model: Any
    tokens: list[int]  # the tokens whose keys and values are cached
    calls: int  # forwards run so far

    @property
    def vocab_size(self) -> int: ...

    def reset(self) -> None:
        """Forget every cached token."""
        ...

    def logits(self, tokens: Sequence[int], n_out: int = 1) -> torch.Tensor:
        """Float32 logits (n_out, V) after each of the last ``n_out`` positions of ``tokens``."""
        ...

    def extend(self, new_tokens: Sequence[int], n_out: int = 1) -> torch.Tensor:
        """:meth:`logits` for ``self.tokens + new_tokens`` when the cache is in sync."""
        ...

    def tree_logits(self, context: Sequence[int], tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Logits after the context and after each node of a draft tree, in one forward."""
        ...

    def tree_extend(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Add nodes to the pending draft tree; their logits."""
        ...


_CACHE_KEYWORDS: dict[Any, str] = {}  # per forward function: each query's drafter copies ask again


def cache_keyword(model: Any) -> str:
    """The keyword that hands a model its KV cache: ``cache`` where its forward takes it (transformers
    renamed ``past_key_values``, which now warns and goes in 5.40), else ``past_key_values`` (older
    releases, remote code)."""
    forward = getattr(type(model), "forward", None)
    if forward in _CACHE_KEYWORDS:
        return _CACHE_KEYWORDS[forward]
    try:
        parameters = inspect.signature(model.forward).parameters
        keyword = "cache" if "cache" in parameters else "past_key_values"
    except (TypeError, ValueError):  # a forward inspect cannot read: the long-standing name
        keyword = "past_key_values"
    if forward is not None:
        _CACHE_KEYWORDS[forward] = keyword
    return keyword


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    >>> common_prefix_len([1, 2, 3, 4], [1, 2, 9]), common_prefix_len([1, 2], [1, 2, 3]), common_prefix_len([5], [6])
    (2, 2, 0)
    """
    if len(a) > len(b):
        a, b = b, a
    n = len(a)
    if a == b[:n]:  # the usual case: one extends the other (a C-speed comparison)
        return n
    # A cache and its next sequence differ near their ends (a rejected draft's tail): gallop back
    # from the end (each test a C-speed comparison of the prefix), then scan the last stretch.
    back = 1
    while back < n and a[: n - back] != b[: n - back]:
        back *= 2
    start = max(n - back, 0)  # a[:start] == b[:start]
    return next((i for i in range(start, n) if a[i] != b[i]), n)


class TreeCacheMixin:
    """Tree drafts in a token-following cache: feed a tree in one forward, keep only the accepted path.

    While a tree is pending, ``self.tokens`` is the context it hangs from and the cache holds the
    context followed by the tree's nodes. The next sync (to any token sequence) first resolves the
    tree: the longest root path matching the sequence's continuation is gathered into place right
    after the context and every other node is dropped, so accepted tokens are never recomputed.
    Subclasses provide ``_masked_forward``, ``_move`` and ``_truncate``.
    """

    tokens: list[int]
    tree: PendingTree | None = None

    def _masked_forward(self, ids: list[int], positions: list[int], allowed: torch.Tensor, n_out: int) -> torch.Tensor:
        """Feed ``ids`` after the cache with explicit positions and a (len(ids), cache + len(ids)) bool mask."""
        raise NotImplementedError

    def _move(self, sources: list[int], start: int) -> None:
        """Copy the cache entries at ``sources`` to ``start, start + 1, …``."""
        raise NotImplementedError

    def _truncate(self, length: int) -> None:
        """Keep the first ``length`` cache entries."""
        raise NotImplementedError

    def _resolve_tree(self, tokens: Sequence[int]) -> None:
        tree = self.tree
        if tree is None:
            return
        self.tree = None
        base = tree.base
        path: list[int] = []
        if list(tokens[:base]) == self.tokens[:base]:
            path = match_path(tree.tokens, tree.parents, tokens[base:])
        if path:
            self._move([base + i for i in path], base)
        self._truncate(base + len(path))
        self.tokens = self.tokens[:base] + [tree.tokens[i] for i in path]

    @torch.inference_mode()
    @all_or_nothing
    def tree_logits(self, context: Sequence[int], tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Logits (n + 1, V) after the context (row 0) and after each tree node (row i + 1), one forward.

        Unseen context tokens are fed in the same forward, ahead of the nodes.
        """
        self._resolve_tree(context)
        keep = min(common_prefix_len(self.tokens, context), len(context) - 1)
        self._truncate(keep)
        fresh = list(context[keep:])
        self.tokens = list(context)
        self.tree = PendingTree(len(context))
        return self._grow_tree(fresh, keep, tokens, parents, len(tokens) + 1)

    @torch.inference_mode()
    @all_or_nothing
    def tree_extend(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Add nodes to the pending tree (a new one hangs from ``self.tokens``); logits (len(tokens), V).

        ``parents`` index the whole tree (earlier nodes included), −1 = the root.
        """
        if self.tree is None:
            self.tree = PendingTree(len(self.tokens))
        return self._grow_tree([], len(self.tokens), tokens, parents, len(tokens))

    def _grow_tree(self, fresh: list[int], cached: int, tokens: Sequence[int], parents: Sequence[int],
                   n_out: int) -> torch.Tensor:
        tree = self.tree
        assert tree is not None, "a tree is pending while it grows"
        new_from = len(tree.tokens)
        tree.tokens.extend(tokens)
        tree.parents.extend(parents)
        check_tree(tree.tokens, tree.parents)
        allowed = tree_attention_mask(tree.parents, cached, len(fresh), new_from)
        positions = list(range(cached, cached + len(fresh))) + tree_positions(tree.parents, tree.base)[new_from:]
        return self._masked_forward(fresh + list(tokens), positions, allowed, n_out)


@dataclass
class PendingTree:
    base: int  # context length the tree hangs from
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)


class RowBuffer:
    """A growable (length, *shape) tensor whose rows are appended, cut back and moved like a KV cache's.

    Used for the target's final hidden states (white-box drafters read them) and for a draft
    head's own keys and values. Capacity doubles, so appending a round's rows costs O(rows).
    """

    def __init__(self) -> None:
        self.data: torch.Tensor | None = None
        self.length = 0

    def append(self, rows: torch.Tensor) -> None:
        end = self.length + rows.shape[0]
        if self.data is None or end > self.data.shape[0]:
            grown = torch.empty((max(2 * end, 64), *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
            if self.data is not None:
                grown[: self.length] = self.data[: self.length]
            self.data = grown
        self.data[self.length : end] = rows
        self.length = end

    def truncate(self, length: int) -> None:
        self.length = max(0, min(self.length, length))

    def move(self, sources: list[int], start: int) -> None:
        """Rows ``sources`` copied to ``start, start + 1, …`` (gathered first: they may overlap)."""
        if self.data is not None and sources:
            index = torch.tensor(sources, dtype=torch.long, device=self.data.device)
            self.data[start : start + len(sources)] = self.data.index_select(0, index)

    def view(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows ``start:stop`` (a view: copy it before the buffer changes)."""
        stop = self.length if stop is None else min(stop, self.length)
        if self.data is None:
            return torch.empty(0)
        return self.data[start:stop]


def layer_rows(hidden_states: Sequence[torch.Tensor], layers: tuple[int, ...], row: int,
               n: int | None = None) -> torch.Tensor:
    """Batch row ``row``'s hidden states of ``layers`` side by side, float32 (T, len(layers) × H).
    transformers ties ``hidden_states[-1]`` to the final norm's output (the LM head's input)."""
    picked = [hidden_states[i][row, :n] for i in layers]
    return (picked[0] if len(picked) == 1 else torch.cat(picked, -1)).float()


class HiddenStatesMixin(TreeCacheMixin):
    """A token-following cache that can record the model's hidden states at every cached position
    (``hidden_layers``: transformers' indices, −1 the final one, side by side in that order), in step
    with the cache: what white-box drafters read."""

    hidden_layers: tuple[int, ...]  # () records nothing
    hidden: RowBuffer

    @torch.inference_mode()
    @all_or_nothing
    def hidden_states(self, tokens: Sequence[int], start: int, stop: int) -> torch.Tensor:
        """Copy of the recorded hidden states at positions ``start:stop`` of ``tokens`` (needs ``hidden_layers``).

        Row j is the state after reading ``tokens[start + j]`` — the one whose LM-head output
        predicted ``tokens[start + j + 1]``. A pending draft tree is first resolved against
        ``tokens`` (its accepted path gathered into place, as the next sync would).
        """
        if not self.hidden_layers:
            raise DraftwiseError("hidden states were not recorded: set hidden_layers before the forward passes")
        self._resolve_tree(tokens)
        if stop > len(self.tokens) or self.tokens[:stop] != list(tokens[:stop]) or stop > self.hidden.length:
            raise DraftwiseError(f"the target has no hidden states for positions {start}:{stop} of this sequence")
        return self.hidden.view(start, stop).clone()


class CachedLM(HiddenStatesMixin):
    """A causal LM whose KV cache follows a token sequence (batch size 1).

    With ``hidden_layers`` set, every forward also records those hidden states (the last one is the
    input of its LM head) at each position it feeds, kept in step with the cache: that is what
    white-box drafters read, at no extra forward (``output_hidden_states`` only keeps references
    to tensors the forward computes anyway).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.calls = 0
        self.hidden_layers: tuple[int, ...] = ()
        self.reset()

    # Read at first use: a batch copies every drafter per query, and a drafter on a bank never
    # uses its own (walking the model's modules for its device was ≈ 80 µs a copy).
    @functools.cached_property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @functools.cached_property
    def vocab_size(self) -> int:
        return output_size(self.model)

    @functools.cached_property
    def vocab(self) -> VocabMap | None:
        return vocab_map_of(self.model)

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return input_ids(self.vocab, ids, self.device)[None]  # (1, T)

    def _logits(self, out: Any, n_out: int) -> torch.Tensor:
        logits = out.logits[0, -n_out:].float()
        return logits if self.vocab is None else self.vocab.target_logits(logits)

    @functools.cached_property
    def cache_keyword(self) -> str:
        return cache_keyword(self.model)

    def reset(self) -> None:
        self._cache: Any = None  # made at first use: a batch makes every drafter's copy per query, most never run
        self.tokens: list[int] = []  # the tokens whose keys and values are in the cache
        self.tree = None
        self.hidden = RowBuffer()  # (len(cache), len(hidden_layers) × H), when recorded

    @functools.cached_property
    def exact(self) -> bool:
        """The model runs an exact numerics: a padded cache, and an explicit mask with every forward."""
        return computes_exactly(self.model)

    @property
    def cache(self) -> Any:
        if self._cache is None:
            if self.exact:
                self._cache = PaddedCache(decoder_layers(self.model))
            else:
                from transformers import DynamicCache  # transformers takes seconds to import: only when a model runs

                self._cache = DynamicCache(config=self.model.config)
        return self._cache

    @torch.inference_mode()
    @all_or_nothing
    def logits(self, tokens: Sequence[int], n_out: int = 1) -> torch.Tensor:
        """Float32 logits (n_out, V) predicting the tokens after each of the last ``n_out`` positions.

        Syncs the cache to ``tokens``: keeps the common prefix, crops the rest, feeds the unseen
        tokens (at least ``n_out`` of them, so their logits exist).
        """
        self._resolve_tree(tokens)
        keep = min(common_prefix_len(self.tokens, tokens), len(tokens) - n_out)
        if keep < len(self.tokens):
            self.cache.crop(keep - len(self.tokens))
            self.hidden.truncate(keep)
        fresh = list(tokens[keep:])
        self.tokens = list(tokens)
        return self._forward(fresh, n_out)

    @torch.inference_mode()
    @all_or_nothing
    def extend(self, new_tokens: Sequence[int], n_out: int = 1) -> torch.Tensor:
        """Like :meth:`logits` for ``self.tokens + new_tokens`` when the cache is known to be in sync."""
        if self.tree is not None:
            return self.logits(self.tokens + list(new_tokens), n_out)
        self.tokens.extend(new_tokens)
        return self._forward(list(new_tokens), n_out)

    def _forward(self, fresh: list[int], n_out: int) -> torch.Tensor:
        cached = len(self.tokens) - len(fresh)
        # one forward: a round, or transformers' own numerics (a long prompt as transformers runs it)
        if not self.exact or len(fresh) - n_out <= PROMPT_BLOCK:
            return self._chain_forward(fresh, cached, n_out)
        done, progress = 0, PrefillProgress(len(fresh))
        for stop in prompt_blocks(len(fresh) - n_out):
            self._chain_forward(fresh[done:stop], cached + done, 1)
            done = stop
            progress(done)
        return self._chain_forward(fresh[done:], cached + done, n_out)

    def _chain_forward(self, fresh: list[int], cached: int, n_out: int) -> torch.Tensor:
        mask = {"attention_mask": chain_mask(cached, len(fresh), self.device)} if self.exact else {}
        out = self.model(input_ids=self._ids(fresh), use_cache=True, logits_to_keep=n_out,
                         **{self.cache_keyword: self.cache}, **self._hidden_request(), **mask)
        self.calls += 1
        self._record_hidden(out)
        return self._logits(out, n_out)

    def _hidden_request(self) -> dict[str, bool]:
        return {"output_hidden_states": True} if self.hidden_layers else {}

    def _record_hidden(self, out: Any) -> None:
        if self.hidden_layers:
            self.hidden.append(layer_rows(out.hidden_states, self.hidden_layers, 0))

    def _masked_forward(self, ids: list[int], positions: list[int], allowed: torch.Tensor, n_out: int) -> torch.Tensor:
        dtype = next(self.model.parameters()).dtype
        out = self.model(
            input_ids=self._ids(ids),
            position_ids=torch.tensor([positions], dtype=torch.long, device=self.device),
            attention_mask=self._widened(additive_mask(allowed, dtype, self.device)),
            use_cache=True, logits_to_keep=n_out, **{self.cache_keyword: self.cache}, **self._hidden_request(),
        )
        self.calls += 1
        self._record_hidden(out)
        return self._logits(out, n_out)

    def _widened(self, mask: torch.Tensor) -> torch.Tensor:
        return pad_mask(mask) if self.exact else mask

    def _move(self, sources: list[int], start: int) -> None:
        index = torch.tensor(sources, dtype=torch.long, device=self.device)
        layers: list[Any] = list(self.cache.layers)  # attention layers: keys and values (B, heads, T, d)
        for layer in layers:
            # gather first: sources and destinations may overlap
            layer.keys[..., start : start + len(sources), :] = layer.keys.index_select(-2, index)
            layer.values[..., start : start + len(sources), :] = layer.values.index_select(-2, index)
        self.hidden.move(sources, start)

    def _truncate(self, length: int) -> None:
        excess = self.cache.get_seq_length() - length
        if excess > 0:
            self.cache.crop(-excess)
        self.hidden.truncate(length)
