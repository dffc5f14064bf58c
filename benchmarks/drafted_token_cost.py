"""What a drafted token of an LM drafter costs on the drafter bank, with its weights in cache and
with them evicted (as a target forward evicts them between rounds): the floor under the cost per
drafted token that the engine's loop adds its own work to.

    python benchmarks/drafted_token_cost.py --drafter zoo:smollm2-generalist

A chain of ``--length`` drafted tokens (one bank forward of one token each, the argmax taken over
the target's vocabulary as the engine does) after a ``--context``-token context; "cold" chains
first stream a buffer four times the last-level cache through the core. Medians over repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

REPEATS = 60  # chains per figure
EVICT_BYTES = 160 * 2**20  # streamed before a cold chain: several times any L3 here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default="zoo:smollm2-generalist", help="an LM drafter folder or zoo name")
    parser.add_argument("--length", type=int, default=5, help="drafted tokens per chain")
    parser.add_argument("--context", type=int, default=300, help="tokens already in the drafter's cache")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from draftwise.models.drafter_bank import MATMULS, BankLM, LlamaBank
    from draftwise.models.vocab_map import attach_vocab_map, load_vocab_map
    from draftwise.zoo import resolve_zoo_name

    folder = resolve_zoo_name(args.drafter) if args.drafter.startswith("zoo:") else args.drafter
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    attach_vocab_map(model, load_vocab_map(folder))
    bank = LlamaBank([model])
    lm = BankLM(bank, 0, model)
    context = [100 + i % 3000 for i in range(args.context)]
    lm.logits(context, 1)
    buffer = torch.ones(EVICT_BYTES // 4)

    def chain(cold: bool) -> float:
        lm.tokens = list(context)  # drafted tokens of the previous chain are overwritten
        if cold:
            buffer.mul_(1.0)
        start = time.perf_counter()
        token = 5
        for _ in range(args.length):
            token = int(lm.extend([token], 1)[0].argmax())
        return (time.perf_counter() - start) / args.length * 1000

    chain(False)
    result = {}
    for name, cold in (("warm", False), ("cold", True)):
        result[f"{name}_ms_per_token"] = round(statistics.median(chain(cold) for _ in range(args.repeats)), 3)
    layer_bytes = sum(bank.layers[0][n].numel() * bank.layers[0][n].element_size() for n in MATMULS)  # one token reads
    extra = args.length * (result["cold_ms_per_token"] - result["warm_ms_per_token"])  # all on the first token
    result.update(drafter=args.drafter, length=args.length, context=args.context, threads=args.threads,
                  layer_weight_bytes=layer_bytes * len(bank.layers),
                  head_bytes=bank.head.numel() * bank.head.element_size(), cold_chain_extra_ms=round(extra, 3))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
