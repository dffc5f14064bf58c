"""``arctic-suffix``: SuffixDecoding on Arctic Inference's C++ suffix trees.

The same method as :class:`~draftwise.drafters.suffix.SuffixDrafter` (a per-query trie of the
prompt and response, a global trie of responses — earlier ones and those still growing — and
SuffixDecoding's scoring over every match), computed by ``arctic_inference`` (Snowflake's
implementation, the one vLLM's ``suffix`` method uses). Its drafts agree with ``suffix``'s almost
everywhere (inside vLLM at c = 1 on the zoo's dev prompts: 2.63 vs 2.64 tokens per step); what
differs is the upkeep. Every new token extends up to ``depth`` suffixes in two tries, which in
Python costs ≈ 70–100 µs a request and step, and vLLM's proposer pays it for every request every
step: inside vLLM, draftwise's proposer took 0.35 ms a step at c = 1 and ≈ 1.5 ms at c = 16 on the
Python trie, 0.25 and 0.83 ms on this one (vLLM's own ``suffix`` method: 0.08 and 0.40 ms;
``benchmarks/vllm_ceiling.py``, 2026-11-27; BENCHMARKS.md, "vLLM").

Not available: coupled drafting (``suffix:coupled=1``), trees (``branches``), a token budget for
the store (Arctic caches whole responses, ``cached_requests`` of them, oldest evicted first).
Needs ``pip install arctic-inference`` (docs/vllm.md, "Set up", says how it builds).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from draftwise.drafters.base import DRAFTERS, Draft, DraftContext, Drafter
from draftwise.errors import DraftwiseError

INSTALL = ("pip install nanobind==2.9.2 grpcio-tools==1.85.1 && nanobind_DIR=$(python -m nanobind --cmake_dir) "
           "pip install --no-build-isolation --no-deps arctic-inference==0.3.0")


def arctic_available() -> bool:
    """Whether ``arctic_inference``'s suffix trees import here."""
    try:  # arctic-inference is optional (installed beside vLLM)
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError:
        return False
    return True


@DRAFTERS.register("arctic-suffix")
class ArcticSuffixDrafter(Drafter):
    """Suffix-trie drafter on ``arctic_inference.suffix_decoding.SuffixDecodingCache``.

    One cache per drafter built from a spec; :meth:`fresh` copies share it (a batch's or vLLM's
    requests), each with a request id of its own. A query starts a request with its prompt
    (its own trie), its tokens are appended as they are verified (to its own trie and the shared
    one, where other requests see them at once), and :meth:`end_query` stops it: the response
    stays in the shared trie for later requests.
    """

    def __init__(self, *, depth: int = 24, factor: float = 1.0, min_prob: float = 0.1, cached_requests: int = 10_000,
                 name: str = "arctic-suffix") -> None:
        if depth < 2 or factor <= 0 or not 0 <= min_prob <= 1 or cached_requests < 0:
            raise DraftwiseError("arctic-suffix: need depth ≥ 2, factor > 0, 0 ≤ min_prob ≤ 1, cached_requests ≥ 0 "
                                 f"(got depth={depth}, factor={factor}, min_prob={min_prob}, "
                                 f"cached_requests={cached_requests})")
        try:  # optional, as above
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError:
            raise DraftwiseError("drafter arctic-suffix needs the arctic-inference package, which is not installed; "
                                 f"it builds from source: {INSTALL} (or use the drafter 'suffix', the same "
                                 "method in Python)") from None
        self.name = name
        self.depth, self.factor, self.min_prob, self.cached_requests = depth, factor, min_prob, cached_requests
        self.cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=cached_requests)
        self._ids: Iterator[int] = itertools.count()  # request ids, shared by the copies of one cache
        self.request: int | None = None  # this copy's active request in the cache
        self.seen = 0  # tokens of the query the cache holds for it

    def fresh(self) -> ArcticSuffixDrafter:
        """A copy that shares the cache (weights and stores, in the base class's words) but not a request."""
        twin = copy.copy(self)
        twin.request, twin.seen = None, 0
        return twin

    def begin_query(self, prompt: Sequence[int]) -> None:
        self._stop()
        self.request = next(self._ids)
        self.cache.start_request(self.request, list(prompt))
        self.seen = len(prompt)

    def _follow(self, context: Sequence[int]) -> int:
        """Bring the request up to ``context`` (tokens only ever arrive at the end); its id."""
        if self.request is None or len(context) < self.seen:  # not begun, or a context not followed
            self.begin_query(context)
        elif len(context) > self.seen:
            self.cache.add_active_response(self.request, list(context[self.seen :]))
            self.seen = len(context)
        assert self.request is not None
        return self.request

    def propose(self, context: Sequence[int], max_len: int, ctx: DraftContext, stop: Any = None) -> Draft:
        request = self._follow(context)
        if max_len <= 0:
            return Draft([])
        draft = self.cache.speculate(request, list(context[-self.depth :]), max_spec_tokens=max_len,
                                     max_spec_factor=self.factor, min_token_prob=self.min_prob)
        tokens = list(draft.token_ids)[:max_len]
        match = int(draft.match_len) if tokens else 0
        for i, token in enumerate(tokens):
            if token in ctx.eos_ids:
                return Draft(tokens[: i + 1], match=match)
        return Draft(tokens, match=match)

    def end_query(self, tokens: Sequence[int], prompt_len: int) -> None:
        """The response's last tokens join the shared trie, then the request stops (its own trie goes)."""
        if self.request is not None and len(tokens) >= self.seen:
            self._follow(tokens)
        self._stop()

    def recover(self) -> None:
        self._stop()  # the next proposal starts a request from its whole context

    def forget_answers(self) -> None:
        """Drop every earlier response (a benchmark's timed run must not draft from a warm-up's)."""
        for request in list(self.cache.cached_requests):
            if request not in self.cache.active_requests:
                self.cache.evict_cached_response(request)

    def _stop(self) -> None:
        if self.request is not None and self.request in self.cache.active_requests:
            self.cache.stop_request(self.request)
        self.request, self.seen = None, 0

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "depth": self.depth, "factor": self.factor, "min_prob": self.min_prob,
                "cached_requests": self.cached_requests}
