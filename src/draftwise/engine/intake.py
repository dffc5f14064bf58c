"""A query's way in and out: prompt → checked token ids and settings; the engine's outcome → a result.

One :class:`Intake` per target and tokenizer, shared by the single-query engine and every batch session.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from draftwise.engine.loop import QueryOutcome
from draftwise.engine.query import QuerySettings, StopCheck
from draftwise.errors import DraftwiseError
from draftwise.request import Request, check_prompt_text
from draftwise.trace import GenerationResult, summarize
from draftwise.verify.chain import sampling_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Intake:
    """What turns prompts into queries for one target: its tokenizer (and chat template), context and EOS ids."""

    tokenizer: Any | None
    chat: bool | None  # None: the tokenizer's chat template when it has one
    vocab_size: int | None
    max_context: int | None
    eos_ids: frozenset[int]
    coupled: bool  # sampled tokens are coupled draws (draftwise.verify.coupling)
    seed: int  # a query's seed when it names none

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt (text through the tokenizer, and its chat template when asked)."""
        if isinstance(prompt, str):
            return self._encode_text(prompt)
        if not isinstance(prompt, Iterable):
            raise DraftwiseError(f"the prompt must be text or a list of token ids, got {type(prompt).__name__}")
        ids = [token_id(i, k) for k, i in enumerate(prompt)]
        if not ids:
            raise DraftwiseError("the prompt is empty")
        if (self.vocab_size and max(ids) >= self.vocab_size) or min(ids) < 0:
            raise DraftwiseError(f"prompt token ids must lie in [0, {self.vocab_size})")
        return ids

    def _encode_text(self, prompt: str) -> list[int]:
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

    def prepare(self, prompt: str | Sequence[int], request: Request) -> tuple[list[int], QuerySettings, int]:
        """A query's token ids, its request resolved against this target, and its seed (one clear error)."""
        sampling = sampling_settings(request.temperature, request.top_k, request.top_p)
        ids, cut = self.fit_context(prompt, request.max_new_tokens, request.truncate)
        if request.stop and self.tokenizer is None:
            raise DraftwiseError("stop strings need a tokenizer")
        settings = QuerySettings(
            max_new_tokens=request.max_new_tokens,
            sampling=replace(sampling, coupled=self.coupled),
            eos_ids=frozenset() if request.ignore_eos else self.eos_ids,
            stop_check=stop_checker(self.tokenizer, list(request.stop)) if request.stop else None,
            prompt_cut=cut,
        )
        return ids, settings, self.seed if request.seed is None else request.seed

    def fit_context(self, prompt: str | Sequence[int], max_new_tokens: int,
                    truncate: bool) -> tuple[list[int], int]:
        """The prompt's ids and how many of its tokens were cut to leave room for the answer (only when
        ``truncate``). Text loses the start of its own text, never the chat template or special tokens
        around it, which the answer depends on; token ids lose their first tokens."""
        ids = self.encode(prompt)
        limit = self.max_context
        if limit is None or len(ids) + max_new_tokens <= limit:
            return ids, 0
        room = limit - max_new_tokens
        if not truncate:
            raise DraftwiseError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the target's context "
                f"of {limit} tokens; shorten the prompt, lower max_new_tokens, or truncate the prompt "
                "(--truncate / truncate=True keeps the end of its text)"
            )
        if isinstance(prompt, str):
            kept = self._shorten_text(prompt, ids, room, max_new_tokens)
            what = "from the start of its text (the chat template and special tokens kept)"
        elif room >= 1:
            kept = ids[-room:]
            what = "from its start"
        else:
            raise DraftwiseError(f"max_new_tokens ({max_new_tokens}) leaves no room in the target's context of "
                                 f"{limit} tokens for the prompt; lower max_new_tokens")
        log.warning("prompt truncated to fit the target's context of %d tokens with max_new_tokens %d: %d of its %d "
                    "tokens cut %s", limit, max_new_tokens, len(ids) - len(kept), len(ids), what)
        return kept, len(ids) - len(kept)

    def _shorten_text(self, prompt: str, ids: list[int], room: int, max_new_tokens: int) -> list[int]:
        """Token ids of the end of ``prompt``'s text, wrapped as ``ids`` wrap the whole text, in ``room`` tokens."""
        tokenizer = self.tokenizer
        assert tokenizer is not None  # the text was encoded already
        text_ids = [int(i) for i in tokenizer(prompt, add_special_tokens=False)["input_ids"]]
        frame = max(0, len(ids) - len(text_ids))  # the chat template and special tokens around the text
        keep = min(room - frame, len(text_ids) - 1)
        # A cut text may tokenize a little differently where it now begins: re-encode, and keep less if need be.
        while keep >= 1:
            piece = tokenizer.decode(text_ids[-keep:], clean_up_tokenization_spaces=False).lstrip("\ufffd")
            if not piece.strip():
                break
            kept = self._encode_text(piece)
            if len(kept) <= room:
                return kept
            keep -= len(kept) - room
        raise DraftwiseError(
            f"the prompt cannot be truncated to fit the target's context of {self.max_context} tokens: "
            f"max_new_tokens ({max_new_tokens}) and the {frame} tokens of the chat template and special tokens "
            "leave no room for its text; lower max_new_tokens")

    def result(self, ids: list[int], outcome: QueryOutcome, seed: int, prompt_cut: int = 0) -> GenerationResult:
        """A finished query's tokens, text and statistics (``prompt_cut``: prompt tokens truncation cut)."""
        new_ids = outcome.tokens[len(ids):]
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True) if self.tokenizer is not None else ""
        stats = summarize(outcome.records, len(new_ids), outcome.wall_s, outcome.stopped_by,
                          outcome.extra_target_calls)
        stats.prompt_tokens_cut = prompt_cut
        return GenerationResult(new_ids, text, stats, outcome.records, prompt_ids=ids, seed=seed)


def token_id(value: Any, position: int) -> int:
    """One prompt token id: an integer (a numpy or 0-d torch integer too), never a float or a bool, which
    ``int()`` would silently turn into another token."""
    try:
        if isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool"):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise DraftwiseError(f"prompt token ids must be integers, got {value!r} at position {position}") from None


def failed(message: str) -> GenerationResult:
    """The result of a query that could not run."""
    return GenerationResult([], "", summarize([], 0, 0.0, "error"), [], error=message)


def stop_checker(tokenizer: Any, stops: Sequence[str]) -> StopCheck:
    """A :data:`~draftwise.engine.query.StopCheck` for stop strings: after a round that added ``new`` tokens,
    the length to keep (through the first token completing a stop string), else None.

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


def eos_ids_of(model: Any, tokenizer: Any | None) -> frozenset[int]:
    """End-of-sequence ids as transformers' ``generate`` sees them: generation config first."""
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            return frozenset({value})
        if isinstance(value, (list, tuple)) and value:
            return frozenset(int(v) for v in value)
    return frozenset()
