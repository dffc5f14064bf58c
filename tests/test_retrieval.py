"""Retrieval drafter (``rest``): suffix array, longest match and continuation counts against brute
force; greedy losslessness in the engine; the ``draftwise datastore build`` command."""

from __future__ import annotations

import doctest
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from draftwise import Generator
from draftwise.cli import main
from draftwise.drafters import DraftContext, build_drafters
from draftwise.drafters.retrieval import RetrievalDrafter
from draftwise.errors import DraftwiseError
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.retrieval.datastore import Datastore, concatenate_documents
from draftwise.retrieval.suffix_array import (
    SEPARATOR,
    continuation_tree,
    continuation_windows,
    count_continuations,
    greedy_chain,
    longest_match,
    suffix_array,
    top_continuations,
)


def _random_stream(rng: np.random.Generator, documents: int, alphabet: int, max_len: int) -> np.ndarray:
    docs = [rng.integers(0, alphabet, size=rng.integers(1, max_len + 1)).tolist() for _ in range(documents)]
    return concatenate_documents(docs)[0]


def _occurrences(stream: list[int], pattern: list[int]) -> list[int]:
    return [p for p in range(len(stream) - len(pattern) + 1) if stream[p : p + len(pattern)] == pattern]


def _brute_counts(stream: list[int], starts: list[int], length: int) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for start in starts:
        continuation = stream[start : start + length]
        if SEPARATOR in continuation:
            continuation = continuation[: continuation.index(SEPARATOR)]
        for n in range(1, len(continuation) + 1):
            counts[tuple(continuation[:n])] = counts.get(tuple(continuation[:n]), 0) + 1
    return counts


def _brute_greedy(counts: dict[tuple[int, ...], int], total: int, max_len: int, min_prob: float) -> list[int]:
    chain: tuple[int, ...] = ()
    prob, parent = 1.0, total
    while len(chain) < max_len:
        children = {seq[-1]: c for seq, c in counts.items() if len(seq) == len(chain) + 1 and seq[:-1] == chain}
        if not children:
            break
        token = min(children, key=lambda t: (-children[t], t))
        prob *= children[token] / parent
        if prob < min_prob:
            break
        chain, parent = (*chain, token), children[token]
    return list(chain)


def test_docstring_examples() -> None:
    import draftwise.retrieval.corpora
    import draftwise.retrieval.datastore
    import draftwise.retrieval.suffix_array

    modules = (draftwise.retrieval.suffix_array, draftwise.retrieval.datastore, draftwise.retrieval.corpora)
    results = [doctest.testmod(module) for module in modules]
    assert all(r.failed == 0 for r in results) and sum(r.attempted for r in results) > 10


def test_suffix_array_matches_brute_force_sort() -> None:
    rng = np.random.default_rng(0)
    for trial in range(80):
        n = int(rng.integers(0, 160))
        tokens = rng.integers(-1, int(rng.integers(1, 6)), size=n)
        if trial % 4 == 0 and n:  # periodic streams: long repeats, many doubling rounds
            tokens = np.resize(tokens[: int(rng.integers(1, 4))], n)
        expected = sorted(range(n), key=lambda i: tuple(tokens[i:].tolist()))
        sa = suffix_array(tokens)
        assert sa.dtype == np.int32 and sa.tolist() == expected, tokens.tolist()


def test_longest_match_and_continuation_counts_match_brute_force() -> None:
    rng = np.random.default_rng(1)
    for _ in range(60):
        stream = _random_stream(rng, int(rng.integers(1, 12)), int(rng.integers(2, 5)), 40)
        sa = suffix_array(stream)
        as_list = stream.tolist()
        for _ in range(5):
            context = rng.integers(0, 5, size=int(rng.integers(0, 20))).tolist()
            max_match = int(rng.integers(1, 12))
            found = longest_match(stream, sa, context, max_match)
            for length in range(min(max_match, len(context)), -1, -1):  # brute force: longest first
                occurrences = _occurrences(as_list, context[len(context) - length :]) if length else []
                if occurrences or length == 0:
                    break
            assert found.length == length, (as_list, context, max_match)
            if length:
                assert sorted(sa[found.lo : found.hi].tolist()) == occurrences
            if not length:
                continue
            width = int(rng.integers(1, 8))
            starts = [p + length for p in occurrences]
            exact = count_continuations(stream, sa, found, width, sample=10_000)
            assert exact == _brute_counts(as_list, starts, width)
            sampled = count_continuations(stream, sa, found, width, sample=3)
            assert sum(c for seq, c in sampled.items() if len(seq) == 1) <= min(3, len(starts))
            rows = continuation_windows(stream, sa, found, width, sample=10_000)
            for min_prob in (0.0, 0.3):
                assert greedy_chain(rows, width, min_prob) == _brute_greedy(exact, len(starts), width, min_prob)


def test_top_continuations_form_a_tree_of_the_most_frequent_prefixes() -> None:
    rng = np.random.default_rng(2)
    stream = _random_stream(rng, 30, 3, 30)
    sa = suffix_array(stream)
    found = longest_match(stream, sa, [1], 4)
    counts = count_continuations(stream, sa, found, 6, sample=64)
    for nodes in (1, 5, 16):
        leaves = top_continuations(counts, nodes)
        tokens, parents = continuation_tree(counts, nodes)
        assert len(tokens) == min(nodes, len(counts))
        assert all(parent < node for node, parent in enumerate(parents))
        paths = []
        for node in range(len(tokens)):  # each node's root-to-node path is a counted prefix
            path, at = [], node
            while at >= 0:
                path.insert(0, tokens[at])
                at = parents[at]
            paths.append(tuple(path))
        assert len(set(paths)) == len(paths) and all(path in counts for path in paths)
        assert min(counts[p] for p in paths) >= max((c for p, c in counts.items() if p not in paths), default=0)
        assert {leaf.tokens for leaf in leaves} == {p for p in paths if not any(q[:-1] == p for q in paths)}
        assert all(counts[leaf.tokens] == leaf.count for leaf in leaves)
        assert [leaf.count for leaf in leaves] == sorted((leaf.count for leaf in leaves), reverse=True)
    assert top_continuations(counts, 1)[0].tokens == tuple(greedy_chain(
        continuation_windows(stream, sa, found, 1, sample=64), 1))


def test_datastore_round_trip_is_memory_mapped_and_the_drafter_stops_at_eos(tmp_path: Path) -> None:
    docs = [[5, 6, 7, 8, 9], [5, 6, 7, 3], [2, 5, 6, 7, 8, 4]]
    Datastore.from_documents(docs, {"vocab_size": 10}).save(tmp_path / "store")
    store = Datastore.load(tmp_path / "store")
    assert isinstance(store.tokens.base, np.memmap) and isinstance(store.sa.base, np.memmap)
    assert store.meta["documents"] == 3 and store.meta["tokens"] == 18 and store.tokens.dtype == np.int32
    drafter = RetrievalDrafter(store=str(tmp_path / "store"), min_prob=0.0)
    assert drafter.propose([1, 5, 6], 4, DraftContext()).tokens == [7, 8, 4]  # "7 8" twice; then 9 or 4: smallest
    assert drafter.propose([1, 5, 6], 4, DraftContext(eos_ids=frozenset({8}))).tokens == [7, 8]
    assert drafter.propose([0, 1], 4, DraftContext()).tokens == []  # no match
    assert drafter.propose([5, 6], 0, DraftContext()).tokens == []
    assert drafter.candidates([5, 6], 3, nodes=4) == [((7, 3), 1), ((7, 8, 4), 1)]  # tree 7 → {8 → 4, 3}
    tree = RetrievalDrafter(store=str(tmp_path / "store"), tree=4).propose([5, 6], 3, DraftContext())
    assert (tree.tokens, tree.parents, tree.probs) == ([7, 8, 3, 4], [-1, 0, 0, 1], None)
    tree = RetrievalDrafter(store=str(tmp_path / "store"), tree=9).propose(
        [5, 6], 3, DraftContext(eos_ids=frozenset({8})))
    assert (tree.tokens, tree.parents) == ([7, 8, 3], [-1, 0, 0])
    short = RetrievalDrafter(store=str(tmp_path / "store"), min_match=3)
    assert short.propose([9, 6, 7], 2, DraftContext()).tokens == []
    with pytest.raises(DraftwiseError, match="needs store=DIR"):
        build_drafters(["rest"], None, None, LoadOptions())
    with pytest.raises(DraftwiseError, match="does not exist"):
        build_drafters([f"rest:store={tmp_path / 'nothing'}"], None, None, LoadOptions())
    with pytest.raises(DraftwiseError, match="unknown option 'depth'"):
        build_drafters([f"rest:store={tmp_path / 'store'},depth=3"], None, None, LoadOptions())


def _reference(model, prompt: list[int], max_new: int, eos: int | None) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         eos_token_id=eos, pad_token_id=0, min_new_tokens=0)
    new = out[0, len(prompt):].tolist()
    return new[: new.index(eos) + 1] if eos is not None and eos in new else new


def test_rest_in_the_engine_is_greedy_lossless(tiny_models, tmp_path: Path) -> None:
    options = LoadOptions()
    model, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    reference = AutoModelForCausalLM.from_pretrained(tiny_models["llama-target"]).eval()
    vocab = int(model.get_output_embeddings().weight.shape[0])
    rng = random.Random(3)
    prompts = [[rng.randrange(2, vocab) for _ in range(rng.randint(3, 8))] for _ in range(10)]
    # The datastore: the target's own continuations of some prompts (matches that get accepted),
    # then unrelated random documents (matches that get rejected).
    docs = [p + _reference(reference, p, 24, None) for p in prompts]
    docs += [[rng.randrange(2, vocab) for _ in range(rng.randint(5, 40))] for _ in range(20)]
    Datastore.from_documents(docs, {"vocab_size": vocab}).save(tmp_path / "store")
    spec = f"rest:store={tmp_path / 'store'},min_prob=0"
    generators = [Generator(model, tokenizer, build_drafters(specs, model, tokenizer, options), policy=policy)
                  for specs, policy in (([spec], "fixed:rest"), ([spec, "pld"], "ucb"),
                                        ([f"{spec},tree=6"], "fixed:rest"))]
    accepted = 0
    for case in range(18):
        gen = generators[case % 3]
        for arm in gen.arms:
            object.__setattr__(arm, "draft_len", rng.randint(1, 8))
        if case % 2 == 0:  # a prefix of a stored prompt: the stored continuation is the target's
            source = prompts[rng.randrange(len(prompts))]
            prompt = source[: rng.randint(2, len(source))]
        else:
            prompt = [rng.randrange(2, vocab) for _ in range(rng.randint(1, 12))]
        max_new = rng.randint(1, 32)
        eos = rng.choice([None, 0, *prompt[:2]])
        gen.eos_ids = frozenset() if eos is None else frozenset({eos})
        expected = _reference(reference, prompt, max_new, eos)
        result = gen.generate(prompt, max_new_tokens=max_new, seed=case)
        assert result.token_ids == expected, f"case {case}: prompt={prompt} max_new={max_new} eos={eos}"
        accepted += sum(r.accepted for r in result.trace if r.arm_name.startswith("rest"))
    assert accepted > 10  # the drafter was really exercised
    sampled = generators[2].generate(prompts[0][:4], max_new_tokens=16, temperature=0.8, seed=1)  # point-mass trees
    assert sampled.stats.new_tokens == 16 or sampled.token_ids[-1] in generators[2].eos_ids


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_datastore_build_command(tiny_models, tiny_tokenizer, tmp_path: Path, capsys) -> None:
    lines = ["the cat sat on the mat", "", "def x ( ) : return 1", "the dog ran far and then stop"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    tok = str(tiny_models["llama-target"])
    code, out, err = _run(capsys, "datastore", "build", "--corpus", str(corpus), "--out", str(tmp_path / "ds"),
                          "--tokenizer", tok, "--quiet")
    assert code == 0, err
    assert "use it with: --drafter rest:store=" in out
    store = Datastore.load(tmp_path / "ds")
    expected = concatenate_documents(tiny_tokenizer(lines, add_special_tokens=False)["input_ids"])[0]
    assert store.tokens.tolist() == expected.tolist()
    assert store.meta["documents"] == 3 and store.meta["vocab_size"] == len(tiny_tokenizer)
    assert store.meta["tokenizer"] == tok and store.meta["seed"] == 0
    code, out, _ = _run(capsys, "datastore", "info", str(tmp_path / "ds"))
    assert code == 0 and json.loads(out)["tokens"] == len(expected)

    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text(json.dumps({"instruction": "the cat", "response": "sat on the mat"}) + "\n"
                     + json.dumps({"text": "one two three"}) + "\n")
    code, _, err = _run(capsys, "datastore", "build", "--corpus", str(jsonl), "--out", str(tmp_path / "ds2"),
                        "--tokenizer", tok, "--max-tokens", "5", "--quiet")
    assert code == 0, err
    store = Datastore.load(tmp_path / "ds2")
    assert int((store.tokens != SEPARATOR).sum()) == 5 and store.meta["build"]["max_tokens"] == 5


@pytest.mark.parametrize(
    "content, name, extra, message",
    [
        (None, "missing.txt", [], "corpus file '{dir}/missing.txt' does not exist"),
        ('{"text": "the cat"}\n{"text": "the dog"\n', "c.jsonl", [], "line 2: not valid JSON"),
        ('{"text": "the cat}\n', "c.jsonl", [], "line 1: not valid JSON (Unterminated string starting at column 10); "
                                                 "a JSONL corpus holds one JSON object per line"),
        ('{"text": "the cat"}\n\n{"prompt": "the dog"}\n', "c.jsonl", [], "line 3: expected a 'text' field"),
        ("\n  \n", "c.txt", [], "holds no documents"),
        ("the cat\n", "c.txt", ["--max-tokens", "0"], "--max-tokens must be ≥ 1"),
        ("the cat\n", "c.txt", ["--tokenizer", "/nonexistent/tok"], "tokenizer '/nonexistent/tok' does not exist"),
    ],
)
def test_datastore_build_errors(tiny_models, tmp_path: Path, capsys, content, name, extra, message) -> None:
    corpus = tmp_path / name
    if content is not None:
        corpus.write_text(content)
    argv = ["datastore", "build", "--corpus", str(corpus), "--out", str(tmp_path / "ds"), "--quiet",
            "--tokenizer", str(tiny_models["llama-target"]), *extra]
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and message.format(dir=tmp_path) in err, err
    assert not (tmp_path / "ds").exists()
