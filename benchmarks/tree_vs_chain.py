"""Chain vs tree drafts of one drafter (LM or white-box head): MAT, tokens/s, speedup; one process.

Each configuration is the same drafter model with different draft shapes (``chain`` and draft
trees, ``draftwise.drafters.lm.TreeOptions``), played with ``fixed:0`` so only the shape differs.
Configurations are interleaved prompt by prompt so machine load hits them alike; one warm-up
query per configuration is excluded. Greedy by default; outputs are cross-checked to be equal.

Without --target/--drafter: tiny random models (a Llama target and a noisy copy of it as the
drafter, so acceptance is neither 0 nor 1). With the zoo: --target zoo:target --drafter zoo:NAME.
``--spec`` (repeatable) compares other drafters in the same process, white-box heads included: a
drafter spec without tree options, the shapes are appended (``--spec eagle:head=zoo:eagle-code``).
``--build DIR --domains code,sql`` takes the zoo build's held-out dev prompts instead of random
ones. A ``plain`` configuration (the target alone) is timed beside them: each configuration's
``speedup`` is its tokens/s over plain decoding's, measured in the same process.

    python benchmarks/tree_vs_chain.py --target zoo:target --build BUILD --domains code,sql \
        --spec lm:model=zoo:generalist --spec eagle:head=zoo:eagle-generalist --prompts 4

Defaults (one comment each):
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

THREADS = 1  # the CPU is shared: one thread avoids thrash on tiny models
PROMPTS = 6  # timed prompts per configuration
PROMPT_LEN = 32  # tokens per random prompt
MAX_NEW = 64  # new tokens per prompt
DRAFT_LEN = 4  # the arm's draft length: the chain's length, the trees' max depth
SHAPES = ["chain", "dynamic,topk=2,budget=8", "dynamic,topk=4,budget=16", "static,shape=2x2x1x1"]  # compared shapes


def build_random_models(root: Path, noise: float = 0.05) -> tuple[str, str]:
    """Target 2 × 128 (vocab 2048) and a drafter = the target with noise on every weight."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                         initializer_range=0.3, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(config).eval()
    drafter = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * p.std().clamp(min=1e-3))
    target.save_pretrained(root / "target")
    drafter.save_pretrained(root / "drafter")
    return str(root / "target"), str(root / "drafter")


def drafter_spec(path: str, shape: str) -> str:
    return f"lm:model={path},name=d" if shape == "chain" else f"lm:model={path},name=d,tree={shape}"


def spec_with_shape(spec: str, shape: str) -> str:
    """A ``--spec`` drafter with one draft shape appended (the name is fixed: ``d``)."""
    return f"{spec},name=d" if shape == "chain" else f"{spec},name=d,tree={shape}"


def spec_label(spec: str) -> str:
    """``eagle:head=zoo:eagle-code`` → ``eagle-code``; ``lm:model=zoo:generalist`` → ``generalist``."""
    value = spec.split("=", 1)[1] if "=" in spec else spec
    value = value.split(",", 1)[0]
    return value.split(":", 1)[1] if value.startswith("zoo:") else Path(value).name


def dev_prompts(build: Path, domains: list[str], per_domain: int, tokenizer) -> list[list[int]]:
    """The first ``per_domain`` dev prompts of each domain, interleaved domain by domain."""
    from draftwise.training.corpus import read_split
    from draftwise.training.tokenizer import encode_prompts

    by_domain = [encode_prompts(tokenizer, read_split(build / "corpus" / "dev" / f"{d}.jsonl")[:per_domain])
                 for d in domains]
    return [p for group in zip(*by_domain) for p in group]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target model (path, hub id, zoo:target); default: tiny random")
    parser.add_argument("--drafter", help="drafter model (path, zoo:NAME); default: a noisy copy of the target")
    parser.add_argument("--spec", action="append", default=[],
                        help="a drafter spec without tree options, e.g. eagle:head=zoo:eagle-code (repeatable; "
                             "replaces --drafter)")
    parser.add_argument("--build", help="zoo build folder: use its dev prompts (with --domains) instead of random ones")
    parser.add_argument("--domains", default="code,sql", help="with --build: the domains whose dev prompts to use")
    parser.add_argument("--shapes", nargs="+", default=SHAPES,
                        help="'chain' or tree options, e.g. dynamic,topk=4,budget=16")
    parser.add_argument("--prompts", type=int, default=PROMPTS)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW)
    parser.add_argument("--draft-len", type=int, default=DRAFT_LEN)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--out", help="also write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from draftwise import Generator
    from draftwise.drafters import build_drafters
    from draftwise.models.loading import LoadOptions, load_causal_lm

    hf_logging.disable_progress_bar()
    tmp = tempfile.TemporaryDirectory()
    if args.target is None:
        target_path, drafter_path = build_random_models(Path(tmp.name))
    else:
        target_path, drafter_path = args.target, args.drafter or args.target
    options = LoadOptions()
    model, tokenizer = load_causal_lm(target_path, options)
    gens = {"plain": Generator(model, tokenizer, [], policy="ucb")}  # the target alone: the speedup's base
    for spec in args.spec or [None]:
        for shape in args.shapes:  # one target model, one drafter model per configuration
            full = drafter_spec(drafter_path, shape) if spec is None else spec_with_shape(spec, shape)
            pool = build_drafters([full], model, tokenizer, options)
            key = shape if len(args.spec) < 2 else f"{spec_label(spec)} {shape}"
            gens[key] = Generator(model, tokenizer, pool, policy="fixed:0", draft_len=args.draft_len)
    if args.build:
        domains = args.domains.split(",")
        per_domain = -(-(args.prompts + 1) // len(domains))  # + 1: the warm-up query
        prompts = dev_prompts(Path(args.build), domains, per_domain, tokenizer)[: args.prompts + 1]
    else:
        vocab = gens["plain"].target.vocab_size
        rng = random.Random(0)
        prompts = [[rng.randrange(vocab) for _ in range(PROMPT_LEN)] for _ in range(args.prompts + 1)]
    rows: dict[str, dict[str, list[float]]] = {k: {"tokens": [], "rounds": [], "wall": [], "drafted": []} for k in gens}
    outputs: dict[str, list[list[int]]] = {k: [] for k in gens}
    for q, prompt in enumerate(prompts):
        for key, gen in gens.items():
            start = time.perf_counter()
            result = gen.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  seed=q, ignore_eos=True)
            wall = time.perf_counter() - start
            if q == 0:
                continue  # warm-up
            row = rows[key]
            row["tokens"].append(result.stats.new_tokens)
            row["rounds"].append(result.stats.rounds)
            row["wall"].append(wall)
            row["drafted"].append(result.stats.drafted)
            outputs[key].append(result.token_ids)
    figures = {}
    plain_rate = sum(rows["plain"]["tokens"]) / sum(rows["plain"]["wall"])
    for key, row in rows.items():
        rate = sum(row["tokens"]) / sum(row["wall"])
        figures[key] = {
            "mat": sum(row["tokens"]) / sum(row["rounds"]),
            "tokens_per_s": rate,
            "speedup": rate / plain_rate,
            "nodes_per_round": sum(row["drafted"]) / sum(row["rounds"]),
            "median_query_s": statistics.median(row["wall"]),
        }
    same = len({json.dumps(o) for o in outputs.values()}) == 1
    drafter = args.spec if args.spec else (args.drafter or "noisy copy")
    report = {"target": target_path if args.target else "random 2x128", "drafter": drafter,
              "prompts_from": f"{args.build} dev: {args.domains}" if args.build else f"random, {PROMPT_LEN} tokens",
              "draft_len": args.draft_len, "max_new_tokens": args.max_new_tokens, "prompts": args.prompts,
              "temperature": args.temperature, "threads": args.threads, "outputs_equal": same, "shapes": figures}
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
