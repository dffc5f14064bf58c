"""Does training EAGLE's second draft step on its own prediction help? (tiny models, seconds)

    python benchmarks/eagle_unroll.py --steps 300 --unroll 1,2,3

Builds the tests' tiny Llama target (2 × 32, 56 tokens), trains an EAGLE head on 16 of the
target's own greedy continuations with ``eagle_loss(..., unroll=U)`` for each U (same seed, data and
steps), then generates greedily from prefixes of those continuations with a fixed EAGLE arm
(draft length 4) and reports MAT (new tokens / rounds). Every generation is checked token-exact
against transformers' greedy decoding.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import build_models  # the tests' tiny models

from draftwise import Generator
from draftwise.drafters.eagle import EagleDrafter, EagleHead, eagle_config
from draftwise.drafters.whitebox import target_dims
from draftwise.models.loading import LoadOptions, load_causal_lm
from draftwise.training.heads import collect_hidden, eagle_loss

# defaults, one line each
STEPS = 300  # full-batch training steps per head
PROMPTS = 6  # continuations used as prompts (their first 5 tokens)
NEW_TOKENS = 26  # tokens generated per prompt


def continuations(target, n: int = 16, length: int = 28) -> torch.Tensor:
    prompts = torch.randint(2, target_dims(target)[1], (n, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return target.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False, max_new_tokens=length,
                               min_new_tokens=length, pad_token_id=0, eos_token_id=None)


def train(target, text: torch.Tensor, unroll: int, steps: int) -> EagleHead:
    data = collect_hidden(target, text.flatten().numpy(), 32, 4)
    hidden, vocab = target_dims(target)
    torch.manual_seed(0)
    head = EagleHead(eagle_config(hidden, vocab, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32))
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    embed, lm = target.get_input_embeddings().weight.detach(), target.get_output_embeddings().weight.detach()
    for _ in range(steps):
        loss = eagle_loss(head, embed, lm, data.batch(np.arange(len(data))), 0.5, 0.1, unroll=unroll)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--unroll", default="1,2,3")
    args = parser.parse_args()
    torch.set_num_threads(1)
    paths = build_models(Path(tempfile.mkdtemp()))
    target, _ = load_causal_lm(str(paths["llama-target"]), LoadOptions())
    text = continuations(target)
    print("| unroll | new tokens | rounds | MAT | token-exact |\n|---|---|---|---|---|")
    for unroll in (int(u) for u in args.unroll.split(",")):
        gen = Generator(target, None, [EagleDrafter(train(target, text, unroll, args.steps), target, name="e")],
                        policy="fixed:0", draft_len=4)
        tokens = rounds = 0
        exact = True
        for row in text[:PROMPTS].tolist():
            out = gen.generate(row[:5], max_new_tokens=NEW_TOKENS, ignore_eos=True)
            exact &= out.token_ids == row[5 : 5 + NEW_TOKENS]
            tokens, rounds = tokens + out.stats.new_tokens, rounds + out.stats.rounds
        print(f"| {unroll} | {tokens} | {rounds} | {tokens / rounds:.2f} | {exact} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
