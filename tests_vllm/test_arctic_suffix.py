"""``arctic-suffix``: the suffix method on Arctic Inference's C++ tries (in this venv, built as
docs/vllm.md "Set up" says). Logic only: no engine."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("arctic_inference.suffix_decoding", reason="needs arctic-inference (docs/vllm.md, 'Set up')")

from draftwise.drafters import DraftContext, SuffixDrafter, build_drafters
from draftwise.drafters.arctic_suffix import ArcticSuffixDrafter
from draftwise.drafters.pool import DrafterPool
from draftwise.drafters.suffix import forget_stored_answers
from draftwise.errors import DraftwiseError
from draftwise.models.loading import LoadOptions

CTX = DraftContext()


def phrases(rng: random.Random, n: int) -> list[int]:
    table = [[rng.randrange(40) for _ in range(rng.randrange(3, 8))] for _ in range(12)]
    out: list[int] = []
    while len(out) < n:
        out += rng.choice(table)
    return out[:n]


def test_built_from_its_spec_with_options() -> None:
    (drafter,) = build_drafters(["arctic-suffix:depth=16,min_prob=0.2"], None, None, LoadOptions())
    assert isinstance(drafter, ArcticSuffixDrafter)
    assert (drafter.depth, drafter.min_prob, drafter.name) == (16, 0.2, "arctic-suffix")
    with pytest.raises(DraftwiseError, match="depth ≥ 2"):
        ArcticSuffixDrafter(depth=1)


def test_drafts_what_the_python_suffix_drafter_drafts() -> None:
    """The same method: on repetitive text, along a whole answer, the two agree on nearly every
    proposal (tie-breaks between equal-scoring matches may differ)."""
    rng = random.Random(0)
    pools = DrafterPool([SuffixDrafter()]), DrafterPool([ArcticSuffixDrafter()])  # both: responses join live
    agree = total = 0
    for _ in range(6):
        tokens = phrases(rng, 220)
        prompt_len = 60
        ours, theirs = (pool.for_request(tokens[:prompt_len]) for pool in pools)
        for n in range(prompt_len, len(tokens), 3):
            a = ours[0].propose(tokens[:n], 8, CTX).tokens
            b = theirs[0].propose(tokens[:n], 8, CTX).tokens
            agree += a == b
            total += 1
        for pool, copies in zip(pools, (ours, theirs), strict=True):
            pool.finish(tokens, prompt_len, copies)
    assert agree >= 0.9 * total, f"{agree} of {total} proposals equal"


def test_copies_share_responses_live_and_after_they_finish() -> None:
    """A pool's copies hold one request each in one cache: a response drafts for another request
    while it grows, and after it ends; ending a query stops its request."""
    pool = DrafterPool([ArcticSuffixDrafter()])
    answer = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    first = pool.for_request([1, 2, 3])
    first[0].propose([1, 2, 3, *answer], 4, CTX)  # its response so far joins the shared trie
    second = pool.for_request([5, 6])
    assert second[0].propose([5, 6, 7, 8, 9, 10, 11], 4, CTX).tokens == [12, 13, 14, 15]
    cache = first[0].cache
    assert len(cache.active_requests) == 2
    pool.finish([1, 2, 3, *answer, 17, 18], 3, first)
    assert len(cache.active_requests) == 1  # the first request stopped; its response stays
    third = pool.for_request([4])
    assert third[0].propose([4, 15, 16], 2, CTX).tokens == [17, 18]  # its last tokens joined at the end


def test_forgetting_answers_and_recovering() -> None:
    drafter = ArcticSuffixDrafter()
    drafter.begin_query([1])
    drafter.end_query([1, 2, 3, 4, 5, 6], 1)
    drafter.begin_query([9])
    assert drafter.propose([9, 2, 3], 3, CTX).tokens == [4, 5]  # a match of 2 drafts at most 2 (factor 1)
    forget_stored_answers([drafter])
    assert drafter.propose([9, 2, 3], 3, CTX).tokens == []  # the cached response is gone
    drafter.recover()  # an interrupted query: its request stops, the next proposal starts one
    assert not drafter.cache.active_requests
    assert drafter.propose([2, 3, 2, 3], 2, CTX).tokens == [2, 3]  # its own context, re-read
    assert len(drafter.cache.active_requests) == 1


def test_a_draft_stops_at_the_end_of_sequence() -> None:
    drafter = ArcticSuffixDrafter()
    drafter.begin_query([1, 2, 3, 0, 4, 1, 2])
    assert drafter.propose([1, 2, 3, 0, 4, 1, 2], 4, DraftContext(eos_ids=frozenset({0}))).tokens == [3, 0]


def test_lossless_in_draftwise_engine_one_query_and_a_batch() -> None:
    """In draftwise's own engine (one query at a time, and batched rounds whose lanes are pool
    copies): greedy outputs equal plain decoding's, and the drafter drafts."""
    from draftwise import Generator

    prompts = ["Repeat after me: one two three four, one two three four, one two three four.",
               "Write a Python function that returns the square of a number.",
               "Translate to German: Good morning, how are you today?"]
    plain = Generator.from_pretrained("zoo:target", [], policy="fixed")
    expected = [plain.generate(p, max_new_tokens=40).token_ids for p in prompts]
    gen = Generator.from_pretrained("zoo:target", ["arctic-suffix"], policy="fixed", arms="arctic-suffix@8")
    singles = [gen.generate(p, max_new_tokens=40) for p in prompts]
    assert [r.token_ids for r in singles] == expected
    assert sum(r.stats.accepted for r in singles) > 0
    batch = gen.generate_batch(prompts, max_new_tokens=40)
    assert [r.token_ids for r in batch] == expected
    assert not gen.drafters[0].cache.active_requests  # every query's request stopped
