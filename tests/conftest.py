"""Tiny real Hugging Face models (Llama and GPT-2), built from configs and saved to disk once per
session, then loaded through the same path as any checkpoint."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

# Tiny models gain nothing from intra-op threads, and threads thrash when the CPU is shared.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def float32_drafter_heads(monkeypatch):
    """Lean-path drafters compute like transformers (to 1e-6) unless a test asks for bfloat16 heads:
    many tests compare a drafter with a fresh transformers forward, or rely on an identical twin."""
    import draftwise.models.drafter_bank

    monkeypatch.setattr(draftwise.models.drafter_bank, "DEFAULT_HEAD_DTYPE", "float32")


@pytest.fixture(autouse=True)
def grad_mode_is_left_as_found():
    """A test that leaves autograd off (``no_grad`` entered and never left) would fail every later
    training test of its worker process, far from the cause; so would inference mode left on. Restore
    both modes, and name the test in a warning. (The engine itself restores them after an interrupt:
    draftwise.models.grad_modes.)"""
    yield
    leaked = [name for name, on in (("autograd off", not torch.is_grad_enabled()),
                                    ("inference mode on", torch.is_inference_mode_enabled())) if on]
    if leaked:
        import warnings

        from draftwise.models.grad_modes import GradModes

        GradModes(grad=True, inference=False).restore()
        warnings.warn(f"this test left {' and '.join(leaked)} (both restored)", stacklevel=1)


WORDS = [  # the tiny test tokenizer's vocabulary
    "the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far", "and", "then", "stop", "it", "is", "was",
    "big", "small", "red", "blue", "one", "two", "three", "def", "return", "print", "if", "else", "for",
    "in", "x", "y", "z", "=", "(", ")", ":", "+", "-", "*", "/", "0", "1", "2", "3", "4", "5", "6", "7", "8",
    "9", ".", ",", "?", "!",
]
EOS = "</s>"


def build_tokenizer():
    """A word-level tokenizer over a fixed vocabulary, saved like any HF fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([EOS, "<unk>", *WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, unk_token="<unk>", pad_token=EOS)


def _perturbed(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A copy of ``model`` with noise on every weight: a drafter that agrees with it often, not always."""
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp(min=1e-3))
    return twin


def build_models(root: Path) -> dict[str, Path]:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    vocab = len(tokenizer)
    paths: dict[str, Path] = {}

    def save(name: str, model: torch.nn.Module) -> None:
        path = root / name
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.eos_token_id
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[name] = path

    torch.manual_seed(0)
    common = dict(vocab_size=vocab, eos_token_id=0, bos_token_id=None, pad_token_id=0)
    llama = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=256, initializer_range=0.2, **common)
    target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **llama)).eval()
    save("llama-target", target)
    save("llama-twin", _perturbed(target, 0.0, 1))  # identical to the target: everything accepted
    save("llama-near", _perturbed(target, 0.3, 2))  # mostly agrees
    save("llama-small", LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **llama)).eval())  # unrelated
    gpt = dict(n_embd=32, n_head=4, n_positions=256, initializer_range=0.2, **common)
    gpt_target = GPT2LMHeadModel(GPT2Config(n_layer=2, **gpt)).eval()
    save("gpt2-target", gpt_target)
    save("gpt2-near", _perturbed(gpt_target, 0.3, 3))
    other = dict(llama, vocab_size=vocab + 7)
    save("llama-othervocab", LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **other)).eval())
    kept = [i for i in range(vocab) if i % 8 != 5]  # ids ≡ 5 (mod 8) are never proposed
    save("llama-subvocab", _subvocab_twin(target, keep=kept))
    (paths["llama-subvocab"] / "draft_vocab.json").write_text(
        json.dumps({"target_vocab_size": vocab, "target_ids": kept}))
    return paths


def _subvocab_twin(target: torch.nn.Module, keep: list[int]) -> torch.nn.Module:
    """The target speaking only the ids in ``keep`` (plus one id for every other token): it agrees
    with the target wherever the target's choice is among them (a frequency-ranked drafter's shape)."""
    from transformers import LlamaForCausalLM

    config = copy.deepcopy(target.config)
    config.vocab_size = len(keep) + 1
    twin = LlamaForCausalLM(config).eval()
    state = {k: v for k, v in target.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    twin.load_state_dict(state, strict=False)
    rows = torch.tensor(keep)
    with torch.no_grad():
        embed, head = target.model.embed_tokens.weight, target.lm_head.weight
        others = torch.ones(len(embed), dtype=torch.bool)
        others[rows] = False
        twin.model.embed_tokens.weight.copy_(torch.cat([embed[rows], embed[others].mean(0, keepdim=True)]))
        twin.lm_head.weight.copy_(torch.cat([head[rows], head[others].mean(0, keepdim=True)]))
    return twin


def batch_round(rng, vocab: int, rows, refs, seqs, tree: bool, max_draft: int):
    """One round of random drafts for every row of a batched cache and its reference cache alone:
    (the batch's inputs, the logits each reference gives). ``tree``: every row drafts a random tree.
    Each sequence grows by one token and part of its chain draft (a rejection cuts the rest)."""
    inputs, expected = [], []
    for row, ref, seq in zip(rows, refs, seqs):
        seq.append(rng.randrange(vocab))
        draft = [rng.randrange(vocab) for _ in range(rng.randrange(0, max_draft + 1))]
        if tree:  # depth-based positions, the accepted path kept
            parents = [-1] + [rng.randrange(-1, i) for i in range(1, len(draft))] if draft else []
            inputs.append(row.tree_input(seq, draft, parents))
            expected.append(ref.tree_logits(seq, draft, parents))
            continue
        inputs.append(row.chain_input(seq + draft, len(draft) + 1))
        expected.append(ref.logits(seq + draft, len(draft) + 1))
        seq.extend(draft[: rng.randrange(0, len(draft) + 1)])
    return inputs, expected


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_models(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tokenizer()
