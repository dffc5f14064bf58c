"""Random-weight models of the zoo's shapes (target 4 × 384, drafters 1 × 128, vocab 8192), for
benchmarks that must run without the trained zoo. No EOS, so every generation has a fixed length."""

from __future__ import annotations

from pathlib import Path

import torch


def zoo_shaped_models(root: Path, drafters: int = 1, seed: int = 0) -> tuple[str, list[str]]:
    """Save a target and ``drafters`` drafters under ``root``; returns their folders."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=8192, max_position_embeddings=1024, tie_word_embeddings=True,
                  eos_token_id=None, bos_token_id=None, pad_token_id=None)
    shapes = {"target": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=6,
                             num_key_value_heads=6)}
    shapes.update({f"drafter{i}": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=4) for i in range(drafters)})
    for name, shape in shapes.items():
        model = LlamaForCausalLM(LlamaConfig(**shape, **common))
        model.generation_config.eos_token_id = None
        model.save_pretrained(root / name)
    return str(root / "target"), [str(root / f"drafter{i}") for i in range(drafters)]
