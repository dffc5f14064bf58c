"""The lookup drafters' fast paths agree with their plain definitions."""

from __future__ import annotations

import random

from draftwise.drafters.suffix import SuffixTrie


def test_stream_match_equals_walking_every_suffix() -> None:
    rng = random.Random(0)
    for depth in (2, 5, 24):
        trie = SuffixTrie(depth)
        stream: list[int] = []
        for _ in range(400):
            token = rng.randrange(6) if rng.random() < 0.8 else rng.randrange(50)  # repeats, and novelties
            stream.append(token)
            trie.extend([token])
            walked = trie.match(stream, depth - 1)
            streamed = trie.stream_match(depth - 1)
            assert streamed[1] == walked[1] and streamed[0] is walked[0]


def test_match_scanning_down_from_a_bound_equals_the_full_scan() -> None:
    rng = random.Random(1)
    trie = SuffixTrie(8)
    for _ in range(20):  # earlier responses
        trie.add_sequence([rng.randrange(5) for _ in range(rng.randint(1, 40))])
    context: list[int] = []
    previous = 0
    for _ in range(300):
        added = rng.randint(1, 3)
        context += [rng.randrange(6) for _ in range(added)]
        full = trie.match(context, 7)
        bounded = trie.match(context, 7, upper=previous + added)
        assert bounded[1] == full[1] and bounded[0] is full[0]
        previous = full[1]


def test_suffix_drafter_drafts_the_same_with_and_without_the_match_bound() -> None:
    from draftwise.drafters.base import DraftContext
    from draftwise.drafters.suffix import SuffixDrafter
    from draftwise.verify import Sampling

    rng = random.Random(2)
    ctx = DraftContext(Sampling())
    fast, slow = SuffixDrafter(depth=6), SuffixDrafter(depth=6)
    for _ in range(6):
        prompt = [rng.randrange(8) for _ in range(10)]
        tokens = list(prompt)
        for drafter in (fast, slow):
            drafter.begin_query(prompt)
        for _ in range(60):
            slow.global_match = (10**9, 0)  # no usable bound: the full upward scan every time
            assert fast.propose(tokens, 4, ctx).tokens == slow.propose(tokens, 4, ctx).tokens
            tokens += [rng.randrange(8) for _ in range(rng.randint(1, 3))]
        for drafter in (fast, slow):
            drafter.end_query(tokens, len(prompt))


def test_fast_first_tokens_along_equal_proposing_at_every_position() -> None:
    """The evaluation phase's shortcut for lookups gives what propose(…, 1) gives, store included."""
    from draftwise.drafters.base import DraftContext, Drafter
    from draftwise.drafters.prompt_lookup import PromptLookupDrafter
    from draftwise.drafters.suffix import SuffixDrafter
    from draftwise.verify import Sampling

    rng = random.Random(3)
    ctx = DraftContext(Sampling(), eos_ids=frozenset({0}))
    for make in (lambda: PromptLookupDrafter(), lambda: SuffixDrafter(depth=6, min_prob=0.3)):
        fast, slow = make(), make()
        for query in range(5):
            prompt = [rng.randrange(1, 7) for _ in range(12)]
            tokens = list(prompt)
            for drafter in (fast, slow):
                drafter.begin_query(prompt)
            for _ in range(30):
                verified = [rng.randrange(0, 7) for _ in range(rng.randint(1, 4))]
                got = fast.first_tokens_along(tokens, verified, ctx)
                assert got == Drafter.first_tokens_along(slow, tokens, verified, ctx), (type(fast).__name__, query)
                tokens += verified
            for drafter in (fast, slow):
                drafter.end_query(tokens, len(prompt))


def test_pld_skips_single_token_matches_unless_asked() -> None:
    import pytest

    from draftwise.drafters import build_drafters
    from draftwise.drafters.base import DraftContext
    from draftwise.errors import DraftwiseError
    from draftwise.verify import Sampling

    ctx = DraftContext(Sampling())
    one_gram = [7, 1, 2, 9, 3, 7]  # only "7" recurs
    two_gram = [7, 3, 1, 2, 9, 7, 3]  # "7 3" recurs, followed by 1 2 9
    default, original = build_drafters(["pld", "pld:min_ngram=1,name=pld1"], None, None, None)
    assert default.propose(one_gram, 3, ctx).tokens == []
    assert original.propose(one_gram, 3, ctx).tokens == [1, 2, 9]
    assert default.propose(two_gram, 3, ctx).tokens == [1, 2, 9]
    assert default.first_tokens_along(one_gram[:-1], [7, 1], ctx) == [None, None]
    assert original.first_tokens_along(one_gram[:-1], [7, 1], ctx) == [None, 1]
    assert build_drafters(["pld:max_ngram=1"], None, None, None)[0].min_ngram == 1  # follows a lower max
    with pytest.raises(DraftwiseError, match="min_ngram must be between 1 and max_ngram"):
        build_drafters(["pld:min_ngram=4"], None, None, None)
