"""The lookup drafters' fast paths agree with their plain definitions."""

from __future__ import annotations

import random

from draftwise.drafters.suffix import ROOT_NODE, SuffixTrie


def substring_counts(trie: SuffixTrie) -> dict[tuple[int, ...], int]:
    """Every path of the trie (nodes and the count-1 paths below them) with its count."""
    out, stack = {}, [((), ROOT_NODE)]
    while stack:
        path, loc = stack.pop()
        if path:
            out[path] = trie.count_at(loc)
        stack += [((*path, t), child) for t, child in trie.children(loc)]
    return out


def test_every_substring_is_counted_as_often_as_it_occurs() -> None:
    """The trie's paths are exactly the substrings of at most ``depth`` tokens of what was put in
    (separate sequences, the own stream, and streams growing side by side), each counted as often
    as it occurs — though it makes nodes only for substrings that occurred before."""
    rng = random.Random(3)
    for depth in (2, 3, 6, 24):
        trie = SuffixTrie(depth)
        sequences: list[list[int]] = [[]]  # the own stream first
        growing = [trie.new_stream() for _ in range(3)]
        grown: list[list[int]] = [[] for _ in growing]
        for _ in range(300):
            tokens = [rng.randrange(4) for _ in range(rng.randint(1, 4))]
            where = rng.randrange(5)
            if where == 0:
                trie.extend(tokens)
                sequences[0] += tokens
            elif where == 1:
                trie.add_sequence(tokens * rng.randint(1, 3))
                sequences.append(tokens * (len(trie.streams[-1]) // len(tokens)))
            else:
                trie.grow(growing[where - 2], tokens)
                grown[where - 2] += tokens
        expected: dict[tuple[int, ...], int] = {}
        for seq in sequences + grown:
            for end in range(1, len(seq) + 1):
                for length in range(1, min(depth, end) + 1):
                    key = tuple(seq[end - length : end])
                    expected[key] = expected.get(key, 0) + 1
        assert substring_counts(trie) == expected
        assert len(trie.count) <= len(expected) + 1  # never more nodes than paths (the root aside)


def test_advancing_suffix_nodes_equals_walking_every_suffix() -> None:
    rng = random.Random(0)
    for depth in (2, 5, 24):
        trie = SuffixTrie(depth)
        for _ in range(10):  # earlier responses
            trie.add_sequence([rng.randrange(6) for _ in range(rng.randint(1, 40))])
        stream: list[int] = []
        nodes: list = []
        for _ in range(400):
            token = rng.randrange(6) if rng.random() < 0.8 else rng.randrange(50)  # repeats, and novelties
            stream.append(token)
            trie.extend([token])  # the stream itself joins the trie, as a query's local trie does
            if rng.random() < 0.05:  # a response added meanwhile: matches may lengthen
                trie.add_sequence(stream[-rng.randint(2, 30):] + [rng.randrange(6) for _ in range(5)])
            nodes = trie.lengthen(trie.advance(nodes, token), stream)
            walked = trie.suffix_nodes(stream)
            assert nodes == walked
            n = min(len(trie.active), len(walked))
            assert trie.active[:n] == walked[:n]  # the stream's own nodes


def test_the_followed_child_is_the_most_frequent_first_created_among_equals() -> None:
    """The trie keeps each node's child to follow as counts grow; it is what max() over the
    children in creation order gives."""
    from draftwise.drafters.suffix import NO_CHILD

    rng = random.Random(1)
    trie = SuffixTrie(6)
    for _ in range(30):
        trie.add_sequence([rng.randrange(5) for _ in range(rng.randint(1, 30))])
        for node in range(len(trie.count)):
            if trie.count[node] == 1:
                continue  # seen once: no child nodes, its continuation is read from its stream
            children = trie.children(node)
            expected = max(children, key=lambda item: trie.count[item[1]])[1] if children else NO_CHILD
            assert trie.best[node] == expected


def brute_force_best(tries: list[SuffixTrie], context: list[int], max_len: int, factor: float,
                     min_prob: float) -> list[int]:
    """SuffixDecoding's definition, spelled out: every match length in every trie, highest score."""
    best: tuple[float, list[int]] = (0.0, [])
    for trie in tries:
        for length in range(len(context), 0, -1):
            node = trie._walk(context[-length:])
            if node is None:
                continue
            budget = min(max_len, int(factor * length + 1e-9), trie.depth - length)
            tokens, score = trie.scored_path(node, budget, min_prob)
            if score > best[0]:
                best = (score, tokens)
    return best[1]


def test_suffix_drafter_drafts_the_best_scoring_match_in_either_trie() -> None:
    from draftwise.drafters.base import DraftContext
    from draftwise.drafters.suffix import SuffixDrafter
    from draftwise.verify.chain import Sampling

    rng = random.Random(2)
    ctx = DraftContext(Sampling())
    for depth, factor, min_prob in ((6, 1.0, 0.1), (8, 2.0, 0.3), (24, 1.0, 0.0)):
        drafter = SuffixDrafter(depth=depth, factor=factor, min_prob=min_prob)
        for _ in range(6):
            prompt = [rng.randrange(8) for _ in range(10)]
            tokens = list(prompt)
            drafter.begin_query(prompt)
            for _ in range(60):
                got = drafter.propose(tokens, 5, ctx).tokens
                assert got == brute_force_best([drafter.local, drafter.global_trie], tokens, 5, factor, min_prob)
                tokens += [rng.randrange(8) for _ in range(rng.randint(1, 3))]
            drafter.end_query(tokens, len(prompt))


def test_under_coupled_sampling_the_suffix_draft_branches_where_the_targets_noise_leads() -> None:
    """At a node with several continuations the coupled draft follows the Gumbel-max of their counts
    with the noise the target's own draw uses at that position (a point mass where it has one child)."""
    import math

    from draftwise.drafters.base import DraftContext
    from draftwise.drafters.suffix import SuffixDrafter
    from draftwise.verify.chain import Sampling
    from draftwise.verify.coupling import PositionNoise, gumbel_value

    # "1 2" is followed by 3 three times and by 4 once, then "1 2" again: the draft's first token
    # is a choice between 3 (count 3) and 4 (count 1)
    prompt = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3, 7, 1, 2, 4, 6, 1, 2]
    greedy = DraftContext(Sampling())
    assert SuffixDrafter().propose(prompt, 1, greedy).tokens == [3]
    picked = {}
    for seed in range(40):
        ctx = DraftContext(Sampling(temperature=1.0), noise=PositionNoise(seed, "cpu"))
        first = SuffixDrafter(min_prob=0.0, coupled=True).propose(prompt, 1, ctx).tokens[0]
        scores = {t: math.log(c) + gumbel_value(seed, len(prompt), t) for t, c in ((3, 3), (4, 1))}
        assert first == max(scores, key=scores.__getitem__)
        assert SuffixDrafter(min_prob=0.0).propose(prompt, 1, ctx).tokens == [3]  # off by default
        picked[first] = picked.get(first, 0) + 1
    assert set(picked) == {3, 4}  # the noise does choose, and mostly the frequent one
    assert picked[3] > picked[4]


def test_a_long_repetition_drafts_the_whole_budget() -> None:
    """The deepest match of a repeated passage sits near the trie's depth with ≈ 1 token below it;
    a shorter match of the same passage drafts the full budget, and scoring finds it."""
    from draftwise.drafters.base import DraftContext
    from draftwise.drafters.suffix import SuffixDrafter
    from draftwise.verify.chain import Sampling

    passage = list(range(100, 140))
    drafter = SuffixDrafter(depth=24)
    drafter.begin_query(passage)
    context = passage + passage[:30]  # 30 tokens into the second copy: a 30-token match
    assert drafter.propose(context, 8, DraftContext(Sampling())).tokens == passage[30:38]


def test_pool_copies_draft_from_each_others_growing_responses() -> None:
    """A pool's suffix copies insert their responses into the shared trie as they grow; finishing
    does not insert them twice, and after an eviction rebuild a growing response is re-inserted."""
    from draftwise.drafters.base import DraftContext
    from draftwise.drafters.pool import DrafterPool
    from draftwise.drafters.suffix import SuffixDrafter, SuffixTrie
    from draftwise.verify.chain import Sampling

    ctx = DraftContext(Sampling())
    pool = DrafterPool([SuffixDrafter(depth=8, store_tokens=60)])
    (a,), (b,) = pool.for_request([1, 2, 3]), pool.for_request([4, 5, 6])
    answer = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    a.propose([1, 2, 3, *answer], 4, ctx)  # a's response so far joins the shared trie
    pool.refresh([b])
    assert b.propose([4, 5, 6, 10, 11, 12], 4, ctx).tokens == [13, 14, 15]  # factor 1 × a 3-token match

    pool.finish([1, 2, 3, *answer], 3)
    rebuilt = SuffixTrie(8)
    for response in pool.templates[0].store:
        rebuilt.add_sequence(response)
    rebuilt.add_sequence([10, 11, 12])  # b's response so far is in the shared trie too
    assert substring_counts(pool.templates[0].global_trie) == substring_counts(rebuilt)

    for start in (30, 50, 70, 90, 110):  # more finished responses than the store keeps: a rebuild
        pool.finish([0, *range(start, start + 20)], 1)
    assert pool.templates[0].global_trie is not b.global_trie
    pool.refresh([b])
    b.propose([4, 5, 6, 10, 11, 12, 13], 4, ctx)  # b re-inserts its response into the new trie
    assert pool.templates[0].global_trie.suffix_nodes([10, 11, 12, 13])  # found again


def test_a_full_store_is_rebuilt_once_per_quarter_of_its_budget() -> None:
    """A full store evicts down to ¾ of its budget: the trie is rebuilt once per quarter budget of
    new responses, not after every one (a rebuild of the default store takes ≈ 1.5 s), and it
    always holds exactly the stored responses."""
    from draftwise.drafters.suffix import SuffixDrafter

    drafter = SuffixDrafter(depth=6, store_tokens=100)
    rebuilds, trie = 0, drafter.global_trie
    for i in range(40):  # 400 tokens of responses through a 100-token store
        drafter.end_query([0, *range(10 * i, 10 * i + 10)], 1)
        rebuilds += drafter.global_trie is not trie
        trie = drafter.global_trie
        assert sum(map(len, drafter.store)) <= 100
    assert 0 < rebuilds <= 300 // 25  # at least a quarter budget (25) of new tokens between rebuilds; not 30
    expected = SuffixTrie(6)
    for response in drafter.store:
        expected.add_sequence(response)
    assert substring_counts(drafter.global_trie) == substring_counts(expected)


def test_fast_first_tokens_along_equal_proposing_at_every_position() -> None:
    """The evaluation phase's shortcut for lookups gives what propose(…, 1) gives, store included."""
    from draftwise.drafters.base import DraftContext, Drafter
    from draftwise.drafters.prompt_lookup import PromptLookupDrafter
    from draftwise.drafters.suffix import SuffixDrafter
    from draftwise.verify.chain import Sampling

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
    from draftwise.verify.chain import Sampling

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


def test_forgetting_answers_leaves_only_the_query_itself() -> None:
    """A benchmark's timed run starts without what earlier runs answered to the same prompts."""
    from draftwise.drafters.base import DraftContext
    from draftwise.drafters.suffix import SuffixDrafter
    from draftwise.verify.chain import Sampling

    ctx = DraftContext(Sampling())
    drafter = SuffixDrafter(depth=8)
    prompt, answer = [1, 2, 3], list(range(10, 30))
    drafter.begin_query(prompt)
    drafter.end_query(prompt + answer, len(prompt))
    drafter.begin_query(prompt)
    assert drafter.propose(prompt + answer[:4], 4, ctx).tokens == answer[4:8]  # the stored answer
    drafter.forget_answers()
    drafter.begin_query(prompt)
    assert drafter.propose(prompt + answer[:4], 4, ctx).tokens == [] and not drafter.store


def test_arctic_suffix_without_its_package_is_one_clear_error(monkeypatch) -> None:
    """``arctic-suffix`` needs arctic-inference (built from source): without it, building the drafter
    says so and how to install it, or to use ``suffix`` (its tests run where it is installed:
    tests_vllm/test_arctic_suffix.py)."""
    import sys

    import pytest

    from draftwise.drafters import build_drafters
    from draftwise.drafters.arctic_suffix import arctic_available
    from draftwise.errors import DraftwiseError
    from draftwise.models.loading import LoadOptions

    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import fails
    assert not arctic_available()
    with pytest.raises(DraftwiseError, match=r"arctic-inference.*pip install.*'suffix'"):
        build_drafters(["arctic-suffix"], None, None, LoadOptions())
