"""White-box drafters (EAGLE, Medusa): checkpoints, the engine's hidden-state hand-over, losslessness
(greedy token-exact, sampling chi-square), bandit and HedgeSpec arms, zoo naming, head training."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from test_lossless_greedy import _reference
from test_lossless_sampling import _draws, _model, chi_square_p, exact_joint

from draftwise import Generator
from draftwise.drafters import Draft, build_drafters
from draftwise.drafters.eagle import EagleDrafter, EagleHead, eagle_config
from draftwise.drafters.lm import TreeOptions
from draftwise.drafters.medusa import MedusaDrafter, MedusaHeads, medusa_config
from draftwise.drafters.whitebox import (
    MARKER,
    WhiteBoxDrafter,
    lm_head_fingerprint,
    load_head_drafter,
    read_head_config,
    save_head,
    target_dims,
)
from draftwise.errors import DraftwiseError
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.training.heads import HiddenSet, collect_hidden, eagle_loss, eagle_unrolled, medusa_loss
from draftwise.verify.chain import Sampling

TOL = 1e-4
TREES = {"chain": None, "dynamic": TreeOptions.parse("dynamic", topk=2, budget=6),
         "static": TreeOptions.parse("static", shape="2x2x1"), "sampled": TreeOptions.parse("sampled", shape="2x2x1")}


def _eagle_head(target, seed: int = 0, scale: float = 1.0) -> EagleHead:
    hidden, vocab = target_dims(target)
    torch.manual_seed(seed)
    head = EagleHead(eagle_config(hidden, vocab, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                                  target="test", target_fingerprint=lm_head_fingerprint(target)))
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(scale)
    return head.eval()


def _fused_head(target, seed: int = 2) -> EagleHead:
    """An EAGLE-3-style head reading the target's layer 1 and final layer, fused."""
    hidden, vocab = target_dims(target)
    torch.manual_seed(seed)
    return EagleHead(eagle_config(hidden, vocab, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                                  target_fingerprint=lm_head_fingerprint(target), feature_layers=(1, -1))).eval()


def _medusa_heads(target, seed: int = 0, k: int = 3) -> MedusaHeads:
    hidden, vocab = target_dims(target)
    torch.manual_seed(seed)
    heads = MedusaHeads(medusa_config(hidden, vocab, k, target_fingerprint=lm_head_fingerprint(target)))
    with torch.no_grad():
        for block in heads.blocks:
            block.weight.normal_(std=0.3)
    return heads.eval()


def _train_eagle(target, steps: int = 150) -> tuple[EagleHead, list[list[int]]]:
    """A few quick steps on the target's own greedy continuations (returned too): prompts taken from
    them get drafts that are often accepted."""
    gen = torch.Generator().manual_seed(0)
    vocab = target_dims(target)[1]
    with torch.no_grad():
        prompts = torch.randint(2, vocab, (16, 4), generator=gen)
        text = target.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False, max_new_tokens=28,
                               min_new_tokens=28, pad_token_id=0, eos_token_id=None)
    data = collect_hidden(target, text.flatten().numpy(), 32, 4)
    head = _eagle_head(target)
    head.train()
    embed = target.get_input_embeddings().weight.detach()
    lm = target.get_output_embeddings().weight.detach()
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    for _ in range(steps):
        batch = data.batch(np.arange(len(data)))
        loss = eagle_loss(head, embed, lm, batch, 0.5, 0.1, unroll=2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval(), text.tolist()


@pytest.fixture(scope="module")
def llama(tiny_models):
    model, tokenizer = load_causal_lm(str(tiny_models["llama-target"]), LoadOptions())
    return model, tokenizer


@pytest.fixture(scope="module")
def heads_dir(tmp_path_factory, llama) -> Path:
    """Saved checkpoints: a trained EAGLE head, a random one, Medusa heads."""
    target, _ = llama
    root = tmp_path_factory.mktemp("heads")
    trained, text = _train_eagle(target)
    save_head(trained, trained.config, root / "eagle-trained")
    (root / "text.json").write_text(json.dumps(text))
    save_head(_eagle_head(target, 1), _eagle_head(target, 1).config, root / "eagle-random")
    save_head(_fused_head(target), _fused_head(target).config, root / "eagle-fused")
    medusa = _medusa_heads(target)
    save_head(medusa, medusa.config, root / "medusa")
    return root


# -- checkpoints ---------------------------------------------------------------------------------------------
def test_heads_round_trip_as_hf_style_folders(tmp_path, llama) -> None:
    target, _ = llama
    for module in (_eagle_head(target), _medusa_heads(target)):
        folder = save_head(module, module.config, tmp_path / module.config.kind)
        config = json.loads((folder / "config.json").read_text())
        assert config[MARKER] == module.config.kind and config["target"] is not None
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
            assert all(f.get_tensor(k).dtype == torch.float16 for k in keys)  # shipped in fp16
        assert keys == set(module.state_dict())  # only the head: no embedding, no LM head
        drafter = load_head_drafter(str(folder), target)
        loaded = drafter.head_module().state_dict()
        for key, value in module.state_dict().items():
            assert torch.equal(loaded[key], value.half().float()), key
        assert read_head_config(folder) == module.config
        assert drafter.embed is target.get_input_embeddings()  # shared with the target, not copied
        assert drafter.lm_head is target.get_output_embeddings()


def test_bad_head_checkpoints_are_clear_errors(tmp_path, llama, tiny_models) -> None:
    target, _ = llama
    with pytest.raises(DraftwiseError, match=r"missing config\.json"):
        load_head_drafter(str(tmp_path / "nothing"), target)
    with pytest.raises(DraftwiseError, match="not a draftwise head"):
        load_head_drafter(str(tiny_models["llama-near"]), target)  # an ordinary LM checkpoint
    head = _eagle_head(target)
    save_head(head, head.config, tmp_path / "e")
    with pytest.raises(DraftwiseError, match="'eagle' head, not 'medusa'"):
        build_drafters([f"medusa:head={tmp_path / 'e'}"], target, None, LoadOptions())
    with pytest.raises(DraftwiseError, match="needs head=PATH"):
        build_drafters(["eagle:tree=dynamic"], target, None, LoadOptions())
    with pytest.raises(DraftwiseError, match="unknown option"):
        build_drafters([f"eagle:head={tmp_path / 'e'},wings=2"], target, None, LoadOptions())
    gpt, _ = load_causal_lm(str(tiny_models["llama-othervocab"]), LoadOptions())
    with pytest.raises(DraftwiseError, match="vocabulary"):
        load_head_drafter(str(tmp_path / "e"), gpt)


def test_specs_build_white_box_drafters(heads_dir, llama) -> None:
    target, tokenizer = llama
    pool = build_drafters([f"eagle:head={heads_dir / 'eagle-trained'},tree=dynamic,topk=2,budget=6,name=e",
                           f"medusa:head={heads_dir / 'medusa'},tree=static,shape=3x2x1", "pld"],
                          target, tokenizer, LoadOptions())
    assert isinstance(pool[0], EagleDrafter) and pool[0].name == "e" and pool[0].tree.kind == "dynamic"
    assert isinstance(pool[1], MedusaDrafter) and pool[1].name == "medusa" and pool[1].tree.shape == (3, 2, 1)


# -- the engine hands over exactly the target's hidden states -------------------------------------------------
class Recorder(WhiteBoxDrafter):
    """Wraps a white-box drafter and keeps, at every proposal, the context and the hidden rows it holds."""

    def __init__(self, inner: WhiteBoxDrafter) -> None:
        self.inner = inner
        self.name = "recorder"
        self.tree = inner.tree
        self.seen_at_propose: list[tuple[list[int], torch.Tensor]] = []

    def begin_query(self, prompt) -> None:
        self.inner.begin_query(prompt)

    def observe_target(self, tokens, hidden, start) -> None:
        self.inner.observe_target(tokens, hidden, start)

    def propose(self, context, max_len, ctx, stop=None) -> Draft:
        self.seen_at_propose.append((list(context), self.inner.seen.view(0, len(context) - 1).clone()))
        return self.inner.propose(context, max_len, ctx, stop)

    def next_logits(self, context, n_out):
        return self.inner.next_logits(context, n_out)


@pytest.mark.parametrize("tree", ["chain", "dynamic"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafter_gets_the_hidden_state_of_exactly_the_last_verified_position(heads_dir, llama, tree,
                                                                             temperature) -> None:
    target, _ = llama
    recorder = Recorder(load_head_drafter(str(heads_dir / "eagle-trained"), target, tree=TREES[tree]))
    gen = Generator(target, None, [recorder], policy="fixed:0", draft_len=4)
    for seed, prompt in enumerate([[5, 6, 7, 8, 9], [3, 4, 10]]):
        gen.generate(prompt, max_new_tokens=24, temperature=temperature, seed=seed)
    assert len(recorder.seen_at_propose) > 6
    for context, rows in recorder.seen_at_propose:
        assert rows.shape[0] == len(context) - 1  # every position but the last (the target's own token)
        with torch.no_grad():
            fresh = target(torch.tensor([context[:-1]]), output_hidden_states=True).hidden_states[-1][0]
        assert torch.allclose(rows, fresh, atol=TOL), (context, (rows - fresh).abs().max())
        assert torch.allclose(target.get_output_embeddings()(rows[-1]),  # it is the LM head's input
                              target(torch.tensor([context[:-1]])).logits[0, -1], atol=TOL)


def test_a_fused_head_gets_its_layers_side_by_side_next_to_a_final_layer_reader(heads_dir, llama) -> None:
    target, _ = llama
    fused = Recorder(load_head_drafter(str(heads_dir / "eagle-fused"), target))
    fused.feature_layers = fused.inner.feature_layers
    plain = load_head_drafter(str(heads_dir / "eagle-trained"), target)
    assert fused.feature_layers == (1, -1) and plain.feature_layers == (-1,)
    gen = Generator(target, None, [plain, fused], policy="ucb", draft_len=3)
    gen.generate([5, 6, 7, 8, 9], max_new_tokens=30, seed=0)
    assert len(fused.seen_at_propose) > 2
    for context, rows in fused.seen_at_propose:
        with torch.no_grad():
            states = target(torch.tensor([context[:-1]]), output_hidden_states=True).hidden_states
        assert torch.allclose(rows, torch.cat([states[1][0], states[-1][0]], -1), atol=TOL)


def test_first_round_drafts_from_the_prompt_without_recomputing_it(heads_dir, llama) -> None:
    target, _ = llama
    drafter = load_head_drafter(str(heads_dir / "eagle-trained"), target)
    gen = Generator(target, None, [drafter], policy="fixed:0", draft_len=4)
    calls = gen.target.calls
    result = gen.generate([5, 6, 7, 8, 9, 10, 11], max_new_tokens=20)
    assert result.trace[0].drafted > 0  # the head drafts in round 1
    assert gen.target.calls - calls == result.stats.rounds + 1  # + the prompt's prefill, split off round 1


# -- losslessness -------------------------------------------------------------------------------------------------
CASES = [("eagle-trained", "chain"), ("eagle-trained", "dynamic"), ("eagle-trained", "static"),
         ("eagle-random", "chain"), ("eagle-fused", "chain"), ("eagle-fused", "dynamic"),
         ("medusa", "chain"), ("medusa", "static"), ("medusa", "dynamic")]


@pytest.mark.parametrize("head,tree", CASES)
def test_greedy_is_token_exact(heads_dir, llama, head, tree) -> None:
    target, _ = llama
    drafter = load_head_drafter(str(heads_dir / head), target, tree=TREES[tree])
    rng = random.Random(f"{head}-{tree}")
    text = json.loads((heads_dir / "text.json").read_text())  # what the trained head learned on
    accepted = 0
    for case in range(8):
        gen = Generator(target, None, [drafter], policy="fixed:0", draft_len=rng.randint(1, 5))
        length = rng.randint(1, 8)
        prompt = text[case][:length] if case % 4 < 2 else [rng.randrange(2, 50) for _ in range(length)]
        max_new = rng.randint(1, 40)
        eos = 0 if case % 2 else None
        out = gen.generate(prompt, max_new_tokens=max_new, ignore_eos=eos is None)
        assert out.token_ids == _reference(target, prompt, max_new, eos), (head, tree, prompt)
        accepted += out.stats.accepted
    if head == "eagle-trained":
        assert accepted > 10  # the trained head's drafts are really accepted (exercises the accept path)


def test_auto_dtype_multiplies_single_rows_in_float16_and_stays_exact(heads_dir, llama, monkeypatch) -> None:
    import draftwise.models.drafter_bank as bank
    from draftwise.drafters.whitebox import RowDtypeLinear

    target, _ = llama
    exact = load_head_drafter(str(heads_dir / "eagle-trained"), target)  # the suite pins float32
    monkeypatch.setattr(bank, "DEFAULT_HEAD_DTYPE", "auto")
    fast = load_head_drafter(str(heads_dir / "eagle-trained"), target)
    assert isinstance(fast.head.q_proj, RowDtypeLinear) and fast.head.q_proj.row_weight.dtype == torch.float16
    assert fast.row_weight is not None and fast.row_weight.dtype == torch.float16
    mine, theirs = fast.head_module().state_dict(), exact.head_module().state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    rows = torch.randn(3, target.config.hidden_size)
    assert torch.equal(fast.head.fc(torch.cat([rows, rows], -1)), exact.head.fc(torch.cat([rows, rows], -1)))
    one = torch.cat([rows[:1], rows[:1]], -1)
    assert torch.allclose(fast.head.fc(one), exact.head.fc(one), atol=2e-2, rtol=1e-2)
    assert not torch.equal(fast.head_logits(rows[0]), exact.head_logits(rows[0]))  # really another path
    assert torch.allclose(fast.head_logits(rows[0]), exact.head_logits(rows[0]), atol=5e-2, rtol=1e-2)
    text = json.loads((heads_dir / "text.json").read_text())
    accepted = 0
    for case in range(4):
        prompt = text[case][:3]
        out = Generator(target, None, [fast], policy="fixed:0", draft_len=4).generate(prompt, max_new_tokens=24,
                                                                                       ignore_eos=True)
        assert out.token_ids == _reference(target, prompt, 24, None)
        accepted += out.stats.accepted
    assert accepted > 10


@pytest.fixture(scope="module")
def small_target():
    return _model(3, 2)


@pytest.mark.parametrize("kind,tree", [("eagle", "chain"), ("eagle", "sampled"), ("eagle", "dynamic"),
                                       ("medusa", "chain"), ("medusa", "sampled")])
def test_sampling_follows_the_target(small_target, kind, tree) -> None:
    sampling = Sampling(temperature=1.0)
    if kind == "eagle":
        drafter = EagleDrafter(_eagle_head(small_target, 2, scale=3.0), small_target, name="e", tree=TREES[tree])
    else:
        drafter = MedusaDrafter(_medusa_heads(small_target, 2), small_target, name="m", tree=TREES[tree])
    gen = Generator(small_target, None, [drafter], policy="fixed:0", draft_len=3)
    counts = _draws(gen, sampling)
    p_value = chi_square_p(counts, exact_joint(small_target, sampling))
    assert p_value > 1e-3, f"{kind}/{tree}: p = {p_value:.2e}"


# -- arms of bandits and of HedgeSpec ---------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["ucb", "hedgespec"])
def test_white_box_drafters_as_arms(heads_dir, llama, tiny_models, policy) -> None:
    target, tokenizer = llama
    specs = [f"eagle:head={heads_dir / 'eagle-trained'}", f"medusa:head={heads_dir / 'medusa'},tree=static,shape=2x1",
             str(tiny_models["llama-near"]), "pld"]
    gen = Generator(target, tokenizer, build_drafters(specs, target, tokenizer, LoadOptions()), policy=policy)
    for prompt in ([5, 6, 7, 8, 9], [12, 3, 4, 5]):
        out = gen.generate(prompt, max_new_tokens=30)
        assert out.token_ids == _reference(target, prompt, 30, 0)
    assert sum(out.stats.pulls.values()) == out.stats.rounds
    if policy == "hedgespec":  # every arm, white-box ones included, is scored on every verified position
        for record in out.trace:
            if record.counterfactual is None:
                continue
            assert all(len(c) == record.emitted for c in record.counterfactual)
            assert all(0.0 <= v <= 1.0 for c in record.counterfactual for v in c)


def test_counterfactual_of_a_white_box_arm_matches_its_draft(heads_dir, llama) -> None:
    """Greedy: the evaluation phase's score at a round's first position is whether the head's own first
    draft token (when it was the played arm) was accepted."""
    target, _ = llama
    eagle = load_head_drafter(str(heads_dir / "eagle-trained"), target)
    medusa = load_head_drafter(str(heads_dir / "medusa"), target)
    gen = Generator(target, None, [eagle, medusa], policy="hedgespec:warmup=0")
    out = gen.generate([5, 6, 7, 8, 9], max_new_tokens=40)
    checked = 0
    for record in out.trace:
        if record.counterfactual is None or record.drafted == 0:
            continue
        first_accepted = 1.0 if record.accepted > 0 else 0.0
        assert record.counterfactual[record.arm][0] == first_accepted
        checked += 1
    assert checked > 3


# -- zoo names ---------------------------------------------------------------------------------------------------
def test_zoo_heads_are_named_but_not_in_zoo_all(tmp_path) -> None:
    from draftwise.zoo.load import expand_zoo_names, resolve_zoo_name, zoo_drafter_names, zoo_head_names

    for name in ("target", "code", "eagle-code", "medusa", "smollm2-eagle"):
        (tmp_path / name).mkdir()
    manifest = {"models": [
        {"name": "target", "role": "target", "domains": ["code"], "params": 1},
        {"name": "code", "role": "drafter", "domains": ["code"], "params": 1},
        {"name": "eagle-code", "role": "head", "kind": "eagle", "domains": ["code"], "params": 1},
        {"name": "medusa", "role": "head", "kind": "medusa", "domains": ["code"], "params": 1},
        {"name": "smollm2-eagle", "role": "head", "kind": "eagle", "domains": ["code"], "params": 1,
         "target": "smollm2", "target_vocab": 49152}]}
    (tmp_path / "zoo.json").write_text(json.dumps(manifest))
    assert zoo_drafter_names(tmp_path) == ["code"]
    assert zoo_head_names(tmp_path) == ["eagle-code", "medusa"]  # the toy target's heads
    assert zoo_head_names(tmp_path, target="smollm2") == ["smollm2-eagle"]
    assert zoo_head_names(tmp_path, target=None) == ["eagle-code", "medusa", "smollm2-eagle"]
    assert expand_zoo_names(["zoo:all"], tmp_path) == ["zoo:code"]
    assert resolve_zoo_name("zoo:eagle-code", tmp_path) == str(tmp_path / "eagle-code")


# -- training -----------------------------------------------------------------------------------------------------
def test_training_writes_every_head_and_resumes(tmp_path, llama) -> None:
    from draftwise.training.heads import install_heads, run_heads

    target, _ = llama
    rng = np.random.default_rng(0)
    streams = lambda: {d: rng.integers(2, 50, 400) for d in ("code", "math", "sql", "translation", "summarization",
                                                                "qa", "general")}
    out = run_heads(target, "tiny-target", streams, tmp_path / "run", "tiny")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["eagle-code", "eagle-generalist", "eagle-math", "eagle-qa", "eagle-sql", "eagle-summarization",
                     "eagle-translation", "medusa"]
    summary = json.loads((tmp_path / "run" / "heads.json").read_text())
    assert summary["heads"]["eagle-generalist"]["step"] == 8
    assert read_head_config(out / "eagle-code").domains == ("code",)
    before = (out / "medusa" / "model.safetensors").read_bytes()
    run_heads(target, "tiny-target", lambda: pytest.fail("resumed run must not re-read data"), tmp_path / "run", "tiny")
    assert (out / "medusa" / "model.safetensors").read_bytes() == before
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    (zoo / "zoo.json").write_text(json.dumps({"models": []}))
    entries = install_heads(out, zoo)
    assert {e["role"] for e in entries} == {"head"} and len(entries) == 8
    load_head_drafter(str(zoo / "eagle-math"), target)


class ShiftedHidden(torch.nn.Module):
    """A stand-in for Medusa heads: head j returns the target's own hidden state ``shift + j`` steps ahead."""

    def __init__(self, hidden: torch.Tensor, k: int, shift: int) -> None:
        super().__init__()
        self.hidden, self.k, self.shift = hidden, k, shift

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = []
        for j in range(self.k):
            ahead = self.shift + j
            out.append(torch.cat([self.hidden[:, ahead:], self.hidden[:, -1:].expand(-1, ahead, -1)], 1))
        return torch.stack(out)


def test_medusa_loss_scores_head_j_against_the_target_j_steps_ahead(llama) -> None:
    target, _ = llama
    data = collect_hidden(target, np.random.default_rng(1).integers(2, 50, 96), 32, 8)
    batch = HiddenSet(data.tokens, data.hidden.float(), data.top_ids, data.top_logprobs.float())
    lm = target.get_output_embeddings().weight.detach()
    losses = {shift: float(medusa_loss(ShiftedHidden(batch.hidden, 2, shift), lm, batch)) for shift in (0, 1, 2)}
    assert losses[1] < losses[0] and losses[1] < losses[2], losses  # head 1 on h_i ↔ the target at i + 1


def test_unrolled_training_steps_are_the_drafting_steps(llama) -> None:
    """Step s of the unrolled loss computes what the drafter computes at its s-th draft step when the
    drafted tokens are the text's (same pairs, positions and attention)."""
    target, _ = llama
    head = _eagle_head(target, 5)
    tokens = torch.randint(2, 50, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hidden = target(tokens, output_hidden_states=True).hidden_states[-1]
        steps = eagle_unrolled(head, hidden[:, :-1], tokens, target.get_input_embeddings().weight, 3)
    drafter = EagleDrafter(head, target, name="e")
    text = tokens[0].tolist()
    for m in (0, 4, 8):
        context = text[: m + 2]  # true pairs 0…m
        drafter.begin_query(context)
        drafter.observe_target(context, hidden[0, : m + 1], 0)
        with torch.no_grad():
            feature = drafter._sync(context, 1)[-1]
            assert torch.allclose(feature, steps[0][0, m], atol=TOL)
            for s in (2, 3):  # the drafted token is the text's x_{m+s}, at position m + s − 1
                feature = drafter._feed(feature[None], [text[m + s]], [m + s - 1], None)[0]
                assert torch.allclose(feature, steps[s - 1][0, m], atol=TOL), (m, s)


@pytest.mark.parametrize("policy", ["ucb:prompt_prior=2", "hedgespec:prompt_prior=2"])
def test_prompt_prior_scores_white_box_drafters(heads_dir, llama, policy) -> None:
    """The prompt is prefilled before round 1, so heads can be scored on it like LM drafters."""
    target, _ = llama
    text = json.loads((heads_dir / "text.json").read_text())
    pool = [load_head_drafter(str(heads_dir / "eagle-trained"), target),
            load_head_drafter(str(heads_dir / "medusa"), target)]
    gen = Generator(target, None, pool, policy=policy)
    prompt = text[0][:12]
    out = gen.generate(prompt, max_new_tokens=20)
    assert out.token_ids == _reference(target, prompt, 20, 0)
