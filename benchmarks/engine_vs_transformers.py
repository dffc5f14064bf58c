"""Engine overhead against transformers, measured in one process on the same prompts.

  (a) one fixed LM drafter, same draft length: draftwise tokens/s vs transformers assisted generation
      (num_assistant_tokens=k, schedule "constant", confidence threshold 0), greedy, identical outputs;
  (b) no drafter (plain decoding): draftwise vs transformers ``generate`` greedy;
  (c) policy + bookkeeping time as a share of draftwise's wall time.

Runs are interleaved (HF, ours, HF, ours, ...) so machine load hits both alike; warm-up excluded.
Ratios are total tokens / total time per repeat, reported as mean ± std over repeats.

Defaults (one comment each):
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from zoo_shaped import zoo_shaped_models  # benchmarks/zoo_shaped.py

THREADS = 2  # these machines have 2 cores
PROMPTS = 8  # prompts per repeat
PROMPT_LEN = 48  # tokens per prompt (random-weight models) — zoo prompts come from its dev split
MAX_NEW = 96  # new tokens per prompt
DRAFT_LEN = 4  # draft tokens per round, both engines
REPEATS = 3  # timed repeats after one warm-up pass


def _one_drafter(root: Path) -> tuple[str, str]:
    target, (drafter,) = zoo_shaped_models(root, drafters=1)
    return target, drafter


def prompt_ids(args: argparse.Namespace, encode) -> list[list[int]]:
    """Token ids of the prompts: a JSONL file's (through the tokenizer's chat template when it has
    one, as `draftwise generate` does), or random ids for random-weight models."""
    if args.prompts_file:
        rows = [json.loads(line) for line in Path(args.prompts_file).read_text().splitlines() if line.strip()]
        texts = [row.get("prompt") or row["instruction"] for row in rows]
        step = max(1, len(texts) // args.prompts)  # spread over the file (it may be sorted by domain)
        return [encode(t) for t in texts[::step][: args.prompts]]
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(10, 8000, (args.prompt_len,), generator=gen).tolist() for _ in range(args.prompts)]


def hf_generate(model, ids: list[int], max_new: int, assistant=None, k: int = DRAFT_LEN) -> list[int]:
    x = torch.tensor([ids])
    kwargs = dict(attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new)
    if assistant is not None:
        kwargs.update(assistant_model=assistant, num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)
    with torch.inference_mode():
        out = model.generate(x, **kwargs)
    new = out[0, len(ids):].tolist()
    eos = model.generation_config.eos_token_id
    if isinstance(eos, int) and eos in new:
        new = new[: new.index(eos) + 1]
    return new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target checkpoint (default: random zoo-shaped models)")
    parser.add_argument("--drafter", help="drafter checkpoint")
    parser.add_argument("--prompts-file", help="JSONL with a 'prompt' field (needs a tokenizer)")
    parser.add_argument("--prompts", type=int, default=PROMPTS)
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW)
    parser.add_argument("--draft-len", type=int, default=DRAFT_LEN)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from draftwise import Generator
    from draftwise.models.loading import LoadOptions, load_causal_lm

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    tmp = tempfile.TemporaryDirectory()
    target_path, drafter_path = (args.target, args.drafter) if args.target else _one_drafter(Path(tmp.name))
    target, _ = load_causal_lm(target_path, LoadOptions())
    drafter, _ = load_causal_lm(drafter_path, LoadOptions())
    plain = Generator.from_pretrained(target_path, [], policy="fixed:none")
    spec = Generator.from_pretrained(target_path, [drafter_path], policy="fixed:0", draft_len=args.draft_len)
    prompts = prompt_ids(args, plain.encode)

    def ours(gen: Generator, ids: list[int]):
        return gen.generate(ids, max_new_tokens=args.max_new_tokens)

    runs = {
        "hf_plain": lambda ids: hf_generate(target, ids, args.max_new_tokens),
        "dw_plain": lambda ids: ours(plain, ids),
        "hf_assisted": lambda ids: hf_generate(target, ids, args.max_new_tokens, drafter, args.draft_len),
        "dw_fixed": lambda ids: ours(spec, ids),
    }
    for fn in runs.values():  # warm-up, excluded from timing
        fn(prompts[0])
    per_repeat: list[dict[str, dict[str, float]]] = []
    mismatches = 0
    overhead = {"policy_s": 0.0, "other_s": 0.0, "wall_s": 0.0}
    mat = []
    for _ in range(args.repeats):
        totals = {name: {"tokens": 0, "seconds": 0.0} for name in runs}
        for ids in prompts:
            outputs = {}
            for name, fn in runs.items():
                start = time.perf_counter()
                result = fn(ids)
                totals[name]["seconds"] += time.perf_counter() - start
                tokens = result if isinstance(result, list) else result.token_ids
                totals[name]["tokens"] += len(tokens)
                outputs[name] = tokens
                if not isinstance(result, list) and name == "dw_fixed":
                    for key in overhead:
                        overhead[key] += getattr(result.stats, key)
                    mat.append(result.stats.mat)
            mismatches += len({tuple(v) for v in outputs.values()}) - 1
        per_repeat.append(totals)

    def ratio(ours_name: str, theirs: str) -> tuple[float, float]:
        values = [(r[ours_name]["tokens"] / r[ours_name]["seconds"]) / (r[theirs]["tokens"] / r[theirs]["seconds"])
                  for r in per_repeat]
        return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    tps = {name: statistics.mean(r[name]["tokens"] / r[name]["seconds"] for r in per_repeat) for name in runs}
    figures = {
        "assisted_ratio": ratio("dw_fixed", "hf_assisted"),
        "plain_ratio": ratio("dw_plain", "hf_plain"),
        "policy_bookkeeping_share": (overhead["policy_s"] + overhead["other_s"]) / overhead["wall_s"],
        "policy_share": overhead["policy_s"] / overhead["wall_s"],
        "tokens_per_s": tps,
        "mat_fixed": statistics.mean(mat),
        "mismatches": mismatches,
        "config": {k: v for k, v in vars(args).items()},
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
