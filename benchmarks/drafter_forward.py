"""Cost of one drafter forward: the lean LlamaBank path vs transformers' forward, for the zoo's
drafter shape (1 × 128, vocab 8192). Per drafted token (one drafter, one token after a 100-token
context) and per evaluation (four drafters catching up on 3 tokens: batched vs one by one).
Medians over repeats, warm-up excluded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

REPEATS = 200  # timed calls per figure


def _median_ms(fn, repeats: int) -> float:
    fn(0)  # warm-up
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftwise.models.cached_lm import CachedLM
    from draftwise.models.drafter_bank import BankLM, LlamaBank

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=128, intermediate_size=344, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)
    models = [LlamaForCausalLM(config).eval() for _ in range(4)]
    context = torch.randint(0, 8192, (100,), generator=torch.Generator().manual_seed(1)).tolist()
    bank = LlamaBank(models)
    lean, reference = BankLM(bank, 0, models[0]), CachedLM(models[0])
    lean.logits(context, 1)
    reference.logits(context, 1)
    figures = {
        "per_token_ms_bank": _median_ms(lambda i: lean.extend([5 + i % 50], 1), args.repeats),
        "per_token_ms_transformers": _median_ms(lambda i: reference.extend([5 + i % 50], 1), args.repeats),
    }
    singles = [CachedLM(m) for m in models]
    bank.sync_all(context, 1)
    for lm in singles:
        lm.logits(context, 1)
    grown = list(context)

    def batched(i: int) -> None:
        grown.extend([7, 8, 9])
        bank.sync_all(grown, 3)

    grown_single = list(context)

    def one_by_one(i: int) -> None:
        grown_single.extend([7, 8, 9])
        for lm in singles:
            lm.logits(grown_single, 3)

    repeats = min(args.repeats, 100)  # contexts grow by 3 tokens per call
    figures["eval_4_drafters_ms_batched"] = _median_ms(batched, repeats)
    figures["eval_4_drafters_ms_one_by_one"] = _median_ms(one_by_one, repeats)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
