"""Draft trees: the mask lets each node see exactly the context and its ancestors, one forward gives
every node the logits of its root-to-node chain, the cache keeps exactly the accepted path, and
generation with trees is lossless (token-exact under greedy, in distribution under sampling)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from test_lossless_greedy import _reference
from test_lossless_sampling import PROMPT, VOCAB, _draws, _model, chi_square_p, exact_joint
from transformers import AutoModelForCausalLM

from draftwise import Generator
from draftwise.drafters import Draft, Drafter, LMDrafter, SuffixDrafter, TreeOptions, build_drafters
from draftwise.errors import DraftwiseError
from draftwise.models.cached_lm import CachedLM
from draftwise.models.drafter_bank import BankLM, LlamaBank
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.verify.chain import Sampling
from draftwise.verify.tree import (
    ancestor_matrix,
    fit_tree,
    level_acceptance,
    path_to,
    rejection_chain,
    tree_attention_mask,
    tree_depths,
    tree_positions,
    verify_tree_greedy,
    verify_tree_sampling,
)

TOL = 1e-4


def random_tree(rng: random.Random, n: int, vocab: int) -> tuple[list[int], list[int]]:
    parents = [rng.randrange(-1, i) for i in range(n)]
    return [rng.randrange(vocab) for _ in range(n)], parents


@torch.inference_mode()
def _fresh(model, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens])).logits[0, -1].float()


def _counting(forward, fed: list[int]):
    """``forward``, recording in ``fed`` how many fresh tokens each call feeds."""

    def counted(fresh, n_out):
        fed.append(len(fresh))
        return forward(fresh, n_out)

    return counted


def _lms(tiny_models, name: str) -> list:
    model, _ = load_causal_lm(str(tiny_models[name]), LoadOptions())
    lms = [CachedLM(model)]
    if name.startswith("llama"):
        lms.append(BankLM(LlamaBank([model], head_dtype="float32"), 0, model))  # the lean path grows trees too
    return lms


# -- shape and mask ------------------------------------------------------------------------------
def test_mask_sees_exactly_context_and_ancestors() -> None:
    rng = random.Random(0)
    for _ in range(50):
        n, cached, fresh = rng.randint(1, 12), rng.randint(0, 5), rng.randint(0, 4)
        _, parents = random_tree(rng, n, 10)
        new_from = rng.randint(0, n - 1) if fresh == 0 else 0
        mask = tree_attention_mask(parents, cached, fresh, new_from)
        context = cached + fresh
        assert mask.shape == (fresh + n - new_from, context + n)
        for row in range(fresh):  # fresh context tokens: causal, never a tree node
            assert mask[row].tolist() == [k <= cached + row for k in range(context + n)]
        for row, node in enumerate(range(new_from, n), start=fresh):
            seen = {context + a for a in path_to(node, parents)}
            assert mask[row].tolist() == [k < context or k in seen for k in range(context + n)]
    assert tree_depths([-1, 0, 1, -1, 3]) == [1, 2, 3, 1, 2]
    assert tree_positions([-1, 0, 1, -1, 3], 7) == [7, 8, 9, 7, 8]
    assert ancestor_matrix([-1, 0, 0]).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]


@pytest.mark.parametrize("name", ["llama-target", "gpt2-target"])
def test_one_forward_gives_each_node_its_chain_logits(tiny_models, name: str) -> None:
    rng = random.Random(1)
    for lm in _lms(tiny_models, name):
        context = [rng.randrange(2, 40) for _ in range(5)]
        for _ in range(12):
            tokens, parents = random_tree(rng, rng.randint(1, 10), 40)
            calls = lm.calls
            out = lm.tree_logits(context, tokens, parents)
            assert lm.calls == calls + 1  # one forward for the unseen context and the whole tree
            assert torch.allclose(out[0], _fresh(lm.model, context), atol=TOL)
            for i in range(len(tokens)):
                chain = context + [tokens[j] for j in path_to(i, parents)]
                assert torch.allclose(out[i + 1], _fresh(lm.model, chain), atol=TOL), (type(lm).__name__, i)
            node = rng.randrange(-1, len(tokens))
            context = context + [tokens[j] for j in path_to(node, parents)] + [rng.randrange(2, 40)]


@pytest.mark.parametrize("name", ["llama-target", "gpt2-target"])
def test_cache_keeps_exactly_the_accepted_path(tiny_models, name: str) -> None:
    rng = random.Random(2)
    for lm in _lms(tiny_models, name):
        context = [rng.randrange(2, 40) for _ in range(4)]
        for step in range(15):
            tokens, parents = random_tree(rng, rng.randint(1, 9), 40)
            lm.tree_logits(context, tokens, parents)
            node = rng.randrange(-1, len(tokens))
            path = [tokens[j] for j in path_to(node, parents)]
            context = context + path + [rng.randrange(2, 40)]
            calls_before = lm.calls
            fed: list[int] = []
            forward = lm._forward if isinstance(lm, CachedLM) else None
            if forward is not None:
                lm._forward = _counting(forward, fed)
            cached = lm.logits(context, 1)[0]
            if forward is not None:
                del lm._forward
                assert fed == [1]  # only the target's new token: the accepted path was kept, not re-fed
            assert lm.calls == calls_before + 1
            assert lm.tokens == context
            assert torch.allclose(cached, _fresh(lm.model, context), atol=TOL)
            if isinstance(lm, CachedLM):
                assert lm.cache.get_seq_length() == len(context)
            if step % 4 == 3:  # a drafter's tree that is extended level by level, then resolved
                root = lm.tree_extend([5, 6], [-1, -1])
                assert torch.allclose(root[1], _fresh(lm.model, context + [6]), atol=TOL)
                deeper = lm.tree_extend([7], [1])
                assert torch.allclose(deeper[0], _fresh(lm.model, context + [6, 7]), atol=TOL)
                context = context + [6, 7, 8]
                assert torch.allclose(lm.logits(context, 1)[0], _fresh(lm.model, context), atol=TOL)


# -- verification maths --------------------------------------------------------------------------
def test_greedy_tree_verdict() -> None:
    # root children 3 (node 0) and 4 (node 1); node 1 has children 5 (node 2) and 6 (node 3)
    tokens, parents = [3, 4, 5, 6], [-1, -1, 1, 1]
    logits = torch.full((5, 10), -1.0)
    for row, best in enumerate([4, 0, 9, 7, 7]):
        logits[row, best] = 1.0
    verdict = verify_tree_greedy(tokens, parents, logits)
    assert verdict.path == [1] and verdict.next_token == 9 and verdict.rows == [0, 2]
    assert verdict.accept_probs == [1.0, 0.0]
    logits[2, 6] = 2.0
    verdict = verify_tree_greedy(tokens, parents, logits)
    assert verdict.path == [1, 3] and verdict.next_token == 7 and verdict.accept_probs == [1.0, 1.0]


def test_point_mass_level_acceptance_is_the_childrens_target_mass() -> None:
    """HedgeSpec Theorem 2: for point-mass children, P(some child accepted) = Σ p(child)."""
    p = torch.softmax(torch.randn(12, generator=torch.Generator().manual_seed(0)), -1)
    accepts, residuals = rejection_chain(p, [0, 1, 2], [None, None, None], [4, 7, 1])
    assert abs(level_acceptance(accepts) - float(p[[4, 7, 1]].sum())) < 1e-6
    assert float(residuals[-1][[4, 7, 1]].sum()) == 0.0


@pytest.mark.parametrize("broken", [False, True])
def test_tree_sampling_draws_from_the_target_at_one_level(monkeypatch, broken: bool) -> None:
    """Monte-Carlo check of the verifier alone: the first emitted token follows p, for point-mass
    children (with a duplicate) and for children drawn without replacement from q. Negative
    control: a verifier that forgets to update the residual after a rejection fails the test."""
    if broken:
        import draftwise.verify.tree as tree

        honest = tree.rejection_chain

        def forgetful(p, kids, q, tokens):
            accepts, residuals = honest(p, kids, q, tokens)
            return accepts, [p] * len(residuals)

        monkeypatch.setattr(tree, "rejection_chain", forgetful)
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(6, generator=gen) * 1.5, -1)
    target = p.expand(4, 6)
    for kind in ("point", "q"):
        counts = np.zeros(6)
        for _ in range(6000):
            if kind == "point":
                tokens, probs = [2, 2, 5], None
            else:
                first = int(torch.multinomial(q, 1, generator=gen))
                q2 = q.clone()
                q2[first] = 0
                q2 /= q2.sum()
                tokens, probs = [first, int(torch.multinomial(q2, 1, generator=gen))], torch.stack([q, q2])
            verdict = verify_tree_sampling(tokens, [-1] * len(tokens), probs, target[: len(tokens) + 1], gen)
            counts[tokens[verdict.path[0]] if verdict.path else verdict.next_token] += 1
        p_value = chi_square_p(counts, p.numpy())
        assert (p_value < 1e-3) if broken else (p_value > 1e-3), (kind, p_value)


def test_fit_tree_cuts_depth_and_rejects_bad_parents() -> None:
    draft = Draft([1, 2, 3, 4], None, [-1, 0, 1, -1])
    cut = fit_tree(draft, 2)
    assert cut.tokens == [1, 2, 4] and cut.parents == [-1, 0, -1]
    with pytest.raises(DraftwiseError):
        fit_tree(Draft([1, 2], None, [1, -1]), 3)  # a parent after its child
    with pytest.raises(DraftwiseError):
        TreeOptions.parse("bushy")


# -- generation: greedy ----------------------------------------------------------------------------
class PeekingTree(Drafter):
    """A point-mass tree of random shape: at each node one child is (often) the target's argmax, the
    other children are random. Peeks at the target through its own cache."""

    name = "peek"

    def __init__(self, model, seed: int) -> None:
        self.lm = CachedLM(model)
        self.rng = random.Random(seed)

    def propose(self, context, max_len, ctx, stop=None):
        tokens: list[int] = []
        parents: list[int] = []
        frontier = [(-1, list(context))]
        for _ in range(max_len):
            level = []
            for parent, seq in frontier:
                best = int(self.lm.logits(seq, 1)[0].argmax())
                kids = [self.rng.randrange(self.lm.vocab_size) for _ in range(self.rng.randint(0, 2))]
                if self.rng.random() < 0.7:
                    kids.insert(self.rng.randint(0, len(kids)), best)
                for tok in kids:
                    tokens.append(tok)
                    parents.append(parent)
                    level.append((len(tokens) - 1, seq + [tok]))
            frontier = level[:3]
        return Draft(tokens, None, parents)


TREE_SPECS = ["tree=dynamic,topk=3,budget=10", "tree=static,shape=3x2x1x1", "tree=sampled,shape=2x2x2,budget=9",
              "tree=dynamic,topk=2,budget=6,depth=3"]


@pytest.mark.parametrize("target,drafter", [("llama-target", "llama-near"), ("llama-target", "llama-twin"),
                                            ("gpt2-target", "gpt2-near")])
def test_greedy_trees_match_transformers(tiny_models, target: str, drafter: str) -> None:
    options = LoadOptions()
    model, tokenizer = load_causal_lm(str(tiny_models[target]), options)
    reference = AutoModelForCausalLM.from_pretrained(tiny_models[target]).eval()
    specs = [f"lm:model={tiny_models[drafter]},name=t{i},{spec}" for i, spec in enumerate(TREE_SPECS)]
    pool = build_drafters(specs + [str(tiny_models[drafter]), "pld", "suffix:branches=3,min_prob=0.0,name=sfx"],
                          model, tokenizer, options)
    pool.append(PeekingTree(model, 0))
    gens = [Generator(model, tokenizer, pool, policy=policy, draft_len=5) for policy in ("round-robin", "random")]
    rng = random.Random(target + drafter)
    vocab = gens[0].target.vocab_size
    trees = []
    for case in range(24):
        gen = gens[case % 2]
        for arm in gen.arms:
            object.__setattr__(arm, "draft_len", rng.randint(1, 6))
        prompt = [rng.randrange(2, vocab) for _ in range(rng.randint(1, 16))]
        if case % 3 == 0:  # repetitive prompts give the suffix trie branches to follow
            prompt = [rng.randrange(2, 8) for _ in range(rng.randint(8, 24))]
        max_new = rng.randint(1, 40)
        eos = rng.choice([None, 0, *prompt[:3]])  # likely continuations: EOS inside the tree
        gen.eos_ids = frozenset() if eos is None else frozenset({eos})
        result = gen.generate(prompt, max_new_tokens=max_new, seed=case)
        assert result.token_ids == _reference(reference, prompt, max_new, eos), f"case {case}"
        for record in result.trace:
            assert record.accepted <= record.max_draft and record.emitted <= record.accepted + 1
        trees += [r for r in result.trace if r.arm_name.startswith("t") and r.drafted]
    assert trees and any(r.drafted > r.max_draft for r in trees)  # real trees were verified
    if drafter == "llama-twin":  # an identical drafter's top child is the target's argmax
        assert all(r.accepted >= 1 for r in trees)


# -- generation: sampling --------------------------------------------------------------------------
class RandomTree(Drafter):
    """A point-mass tree of uniformly random tokens (duplicate siblings included)."""

    name = "random-tree"

    def propose(self, context, max_len, ctx, stop=None):
        n = int(torch.randint(1, 7, (1,), generator=ctx.generator))
        parents = [int(torch.randint(-1, i, (1,), generator=ctx.generator)) if i else -1 for i in range(n)]
        return Draft(torch.randint(VOCAB, (n,), generator=ctx.generator).tolist(), None, parents)


SAMPLING_DRAFTERS = {
    "lm-sampled": lambda: LMDrafter(_model(11, 1), name="lm", tree=TreeOptions.parse("sampled", shape="3x2")),
    "lm-dynamic": lambda: LMDrafter(_model(11, 1), name="lm", tree=TreeOptions.parse("dynamic", topk=2, budget=5)),
    "random-tree": lambda: RandomTree(),
    "suffix-tree": lambda: SuffixDrafter(min_prob=0.0, factor=4.0, branches=3),
}


@pytest.fixture(scope="module")
def sampling_target():
    return _model(3, 2)


@pytest.mark.parametrize("scheme", ["coupled", "rejection"])
@pytest.mark.parametrize("kind", sorted(SAMPLING_DRAFTERS))
def test_sampled_trees_follow_the_target(sampling_target, kind: str, scheme: str) -> None:
    sampling = Sampling(temperature=1.0) if kind != "lm-dynamic" else Sampling(temperature=0.8, top_k=4)
    gen = Generator(sampling_target, None, [SAMPLING_DRAFTERS[kind]()], policy="fixed:0", draft_len=3,
                    sampling=scheme)
    counts = _draws(gen, sampling)
    p_value = chi_square_p(counts, exact_joint(sampling_target, sampling))
    assert p_value > 1e-3, f"{kind}: p = {p_value:.2e}"


@torch.inference_mode()
def test_tree_feedback_is_the_target_mass_of_the_children(sampling_target) -> None:
    """A point-mass tree's first-level acceptance probability is Σ p(children of the root)
    (rejection sampling's; coupled sampling records whether the target's draw was a child)."""
    from draftwise.verify.chain import warp

    gen = Generator(sampling_target, None, [RandomTree()], policy="fixed:0", draft_len=3, sampling="rejection")
    result = gen.generate(PROMPT, max_new_tokens=1 + 3, temperature=1.0, seed=5, ignore_eos=True)
    first = result.trace[0]
    draft = RandomTree().propose(PROMPT, 3, _replay_ctx(5))
    p = warp(sampling_target(torch.tensor([PROMPT])).logits[0, -1:].float(), Sampling(1.0))[0]
    kids = sorted({t for t, parent in zip(draft.tokens, draft.parents) if parent == -1})
    assert first.drafted == len(draft.tokens)
    assert abs(first.accept_probs[0] - float(p[kids].sum())) < 1e-5


def _replay_ctx(seed: int):
    from draftwise.drafters import DraftContext

    return DraftContext(Sampling(1.0), torch.Generator().manual_seed(seed))


# -- full-information feedback ----------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_evaluation_phase_scores_a_tree_by_its_first_level(tiny_models, temperature: float) -> None:
    """HedgeSpec over a tree drafter and its chain twin (same model). Under greedy the tree's
    counterfactual (the target's argmax among the drafter's top-k) is never below the chain's
    (argmax = top-1), and the output is still the target's; under sampling both are probabilities."""
    options = LoadOptions()
    model, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), options)
    path = tiny_models["llama-near"]
    pool = build_drafters([f"lm:model={path},name=tree,tree=dynamic,topk=4,budget=8", f"lm:model={path},name=chain"],
                          model, tokenizer, options)
    gen = Generator(model, tokenizer, pool, policy="hedgespec", draft_len=3)
    prompt = [5, 6, 7, 8, 9, 10]
    result = gen.generate(prompt, max_new_tokens=24, temperature=temperature, seed=0, ignore_eos=True)
    if temperature == 0.0:
        reference = AutoModelForCausalLM.from_pretrained(tiny_models["llama-target"]).eval()
        assert result.token_ids == _reference(reference, prompt, 24, None)
    rounds = [r for r in result.trace if r.counterfactual is not None]
    assert rounds
    for record in rounds:
        tree, chain = (np.asarray(row) for row in record.counterfactual)
        if temperature == 0.0:
            assert np.all(tree >= chain)
        assert np.all((tree >= 0) & (tree <= 1 + 1e-6))
