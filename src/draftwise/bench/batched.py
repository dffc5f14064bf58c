"""``draftwise bench --batch-size B[,B…]``: throughput of batched rounds against batched plain decoding.

Prompts are interleaved by domain (each batch of B holds up to B domains: MetaSD's heterogeneous
batches) and run through :meth:`~draftwise.api.Generator.generate_batch` with continuous batching
(a finished query's row goes to the next prompt). The unit is a whole pass over the prompts: one
row per (B, method, repeat) with output tokens, wall time and tokens/s; speedups are against
``ar`` (draftwise's batched plain decoding) at the same B in the same process, warm-up excluded.
Within a B every method runs once per repeat before any runs again (a drifting machine shifts all
methods of a repeat alike).

Methods: ``ar``; ``hf-ar`` (transformers' batched ``generate`` on left-padded batches of B);
``default``; ``fixed:NAME[@L]`` (one drafter; ``fixed:*`` each; per-query lanes, so the engine's
load cap and padded-width cut apply); ``length:K`` (the length drafter at K tokens every round,
nothing cut: BanditSpec's fixed length); ``banditspec-length`` (one draft length 0..L per round
for the whole batch, UCBSpec with the round's throughput as reward); any other policy or preset
(each query its own learner).
Greedy outputs are compared with ``ar``'s; a difference where the target's two best logits tie
within 1e-4 is counted apart (batching changes float rounding), any other is a mismatch.
Sampled runs (``--temperature`` > 0) give every query its own seed (the single-query bench's
``row_seed``: run seed, prompt id, repeat), so a method's outputs are reproducible; they are
compared with ``ar``'s only for information (``differs``): under coupled sampling a method draws
the same noise as ``ar``, so its outputs equal ``ar``'s unless batching's rounding moves a draw.
Whether sampling keeps the target's distribution is a test's matter (tests/test_lossless_sampling.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftwise.api import DEFAULT_POLICY, Generator
from draftwise.bench.methods import Workbench, eos_ids, fixed_spec
from draftwise.bench.report import environment
from draftwise.bench.runner import (
    SEED_RULE,
    encode_prompts,
    load_workbench,
    make_out_folder,
    read_rows,
    resolve_prompts,
    row_seed,
)
from draftwise.drafters.suffix import forget_stored_answers
from draftwise.errors import DraftwiseError
from draftwise.request import Request

log = logging.getLogger(__name__)

RESULTS = "batch-results.jsonl"
SUMMARY = "batch-summary"
TIE = 1e-4


@dataclass
class BatchRun:
    token_ids: list[list[int]]
    wall_s: float
    stats: dict[str, Any]


@dataclass(frozen=True)
class BatchDecode:
    """How one pass decodes: the bench's settings, and for sampled passes one seed a query."""

    settings: Request
    seeds: Sequence[int] = ()

    @property
    def max_new_tokens(self) -> int:
        return self.settings.max_new_tokens

    @property
    def temperature(self) -> float:
        return self.settings.temperature

    def query(self, index: int) -> Request:
        """The request of the query at ``index`` (greedy: the length alone)."""
        if self.temperature == 0:
            return Request(self.max_new_tokens)
        return replace(self.settings, seed=self.seeds[index])


Runner = Callable[[Sequence[list[int]], int, BatchDecode], BatchRun]  # (prompts, batch size, decoding)


def interleave_domains(prompts: Sequence[Any]) -> list[int]:
    """Prompt indices ordered round-robin over domains, so consecutive prompts differ in domain.

    >>> from types import SimpleNamespace as P
    >>> interleave_domains([P(domain=d) for d in "aabbc"])
    [0, 2, 4, 1, 3]
    """
    by_domain: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        by_domain.setdefault(p.domain, []).append(i)
    queues = list(by_domain.values())
    out: list[int] = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def engine_runner(generator: Any, decide: str = "query", adapt: bool = True) -> Runner:
    """``adapt=False``: the engine's own load-aware adjustments of per-query drafts (the length cap
    and the padded-width cut) are off, so every round drafts what the policy chose — a *fixed*
    length really is one (BanditSpec's baseline)."""
    def run(prompts: Sequence[list[int]], batch: int, decode: BatchDecode) -> BatchRun:
        forget_stored_answers(generator.drafters)  # every run starts cold: no answers from earlier runs
        start = time.perf_counter()
        session = generator.batch_session(batch, decide)
        if not adapt:
            session.engine.cut_width = False
            session.engine.cap_acceptance = 0.0
        handles = [session.add(p, decode.query(i)) for i, p in enumerate(prompts)]
        session.run()
        wall = time.perf_counter() - start
        results = [h.result for h in handles]
        if any(r.stats.stopped_by == "interrupted" for r in results):
            raise KeyboardInterrupt
        timing = session.engine.timing
        pulls: dict[str, int] = {}
        for r in results:
            for arm, n in r.stats.pulls.items():
                pulls[arm] = pulls.get(arm, 0) + n
        rounds = sum(r.stats.rounds for r in results)
        new = sum(r.stats.new_tokens for r in results)
        stats = {
            "batched_rounds": timing.rounds, "query_rounds": rounds, "mat": new / rounds if rounds else 0.0,
            "drafted": sum(r.stats.drafted for r in results), "accepted": sum(r.stats.accepted for r in results),
            "forward_s": timing.forward_s, "draft_s": timing.draft_s, "rounds_s": timing.rounds_s,
            "bookkeeping_s": timing.bookkeeping_s, "policy_s": timing.policy_s, "sample_s": timing.sample_s,
            "width_cuts": timing.width_cuts,
            "capped_rounds": timing.capped_rounds,
            "gated_rounds": timing.gated_rounds,
            "kv_bytes": session.engine.target.kv_bytes(),
            "pulls": pulls,
        }
        return BatchRun([r.token_ids for r in results], wall, stats)

    return run


def hf_runner(model: Any, pad_id: int) -> Runner:
    """transformers' batched ``generate`` on left-padded batches of B prompts (sampled: torch's global
    generator seeded with the batch's first query's seed, as transformers samples from it)."""
    eos = eos_ids(model)

    def run(prompts: Sequence[list[int]], batch: int, decode: BatchDecode) -> BatchRun:
        out_ids: list[list[int]] = []
        start = time.perf_counter()
        for lo in range(0, len(prompts), batch):
            group = prompts[lo : lo + batch]
            width = max(len(p) for p in group)
            ids = torch.full((len(group), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(group), width), dtype=torch.long)
            for row, p in enumerate(group):
                ids[row, width - len(p) :] = torch.tensor(p)
                mask[row, width - len(p) :] = 1
            kwargs: dict[str, Any] = {"do_sample": decode.temperature > 0}
            if decode.temperature > 0:
                kwargs.update(temperature=decode.temperature, top_k=decode.settings.top_k or 0,
                              top_p=decode.settings.top_p or 1.0)
                torch.manual_seed(decode.seeds[lo])
            with torch.inference_mode():
                out = model.generate(ids.to(model.device), attention_mask=mask.to(model.device),
                                     max_new_tokens=decode.max_new_tokens, pad_token_id=pad_id, **kwargs)
            for row in range(len(group)):
                new = out[row, width:].tolist()
                cut = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
                out_ids.append(new[:cut])
        return BatchRun(out_ids, time.perf_counter() - start, {})

    return run


def build_runner(bench: Workbench, spec: str, length_drafter: str) -> Runner:
    def make(policy: str, names: Sequence[str] | None = None, **kw: Any) -> Any:
        kw.setdefault("draft_len", bench.draft_len)
        return Generator(bench.model, bench.tokenizer, bench.fresh_pool(names), policy=policy, seed=bench.seed,
                         sampling=bench.sampling, **kw)

    head, _, arg = spec.partition(":")
    if spec == "ar":
        return engine_runner(Generator(bench.model, bench.tokenizer, [], policy="fixed", seed=bench.seed,
                                       sampling=bench.sampling))
    if spec == "hf-ar":
        pad = getattr(bench.tokenizer, "pad_token_id", None)
        return hf_runner(bench.model, int(pad if pad is not None else next(iter(eos_ids(bench.model)), 0)))
    if spec == "default":
        return engine_runner(make(DEFAULT_POLICY))
    if head == "fixed":
        name, length = fixed_spec(arg, bench.drafter_names)
        return engine_runner(make("fixed", [name], draft_len=length or bench.draft_len))
    if head == "length":
        if not arg.isdigit() or int(arg) < 1:
            raise DraftwiseError(f"method {spec}: length:K needs a draft length K ≥ 1")
        return engine_runner(make("fixed", [length_drafter], draft_len=int(arg)), adapt=False)
    if spec.startswith("banditspec-length"):
        return engine_runner(make(spec, [length_drafter], arm_drafter=length_drafter), decide="batch")
    return engine_runner(make(spec))


def run_batched(config: Any, sizes: Sequence[int], length_drafter: str = "pld") -> dict[str, Any]:
    """Run (or resume) every B × method × repeat into ``config.out``; returns the summary."""
    out = Path(config.out)
    prompts = resolve_prompts(config)
    bench = load_workbench(config)
    if length_drafter not in bench.drafter_names:
        raise DraftwiseError(f"--length-drafter {length_drafter!r} is not in the pool: "
                             f"{', '.join(bench.drafter_names)}")
    methods = ["ar"]
    for spec in config.methods:  # fixed:* = one method per drafter of the pool
        expanded = [f"fixed:{name}" for name in bench.drafter_names] if spec == "fixed:*" else [spec]
        methods += [m for m in expanded if m not in methods]
    runners = {m: build_runner(bench, m, length_drafter) for m in methods}  # bad specs fail before any run
    order = interleave_domains(prompts)
    prompts = [prompts[i] for i in order]
    ids = encode_prompts(bench, prompts, config.max_new_tokens)
    make_out_folder(out)
    sampled = config.temperature > 0
    seeding = f"batched: one seed a query, {SEED_RULE}" if sampled else "batched, greedy: no seeds drawn"
    env = environment(config, methods, prompts, None, seeding, bench.drafter_names, bench.model)
    env["batch_sizes"] = list(sizes)
    env["length_drafter"] = length_drafter
    (out / "batch-env.json").write_text(json.dumps(env, indent=2, default=str))
    done = {row["key"] for row in read_rows(out / RESULTS)} if (out / RESULTS).exists() else set()
    reference: dict[int, list[list[int]]] = {}
    with open(out / RESULTS, "a", encoding="utf-8") as handle:
        for size in sizes:
            warmed: set[str] = set()
            # repeats outermost: every method runs once before any runs again, so a machine whose
            # speed drifts over minutes (shared CPUs) shifts every method alike, not one
            for repeat in range(config.repeats):
                seeds = [row_seed(config.seed, p.id, repeat) for p in prompts] if sampled else []
                decode = BatchDecode(config.request(), seeds)
                for method in methods:
                    key = f"B={size}|{method}|{repeat}"
                    if key in done:
                        continue
                    if method not in warmed and config.warmup_tokens > 0:  # untimed: caches, allocator, lazy imports
                        warm = replace(decode, settings=replace(decode.settings, max_new_tokens=min(
                            config.warmup_tokens, config.max_new_tokens)))
                        runners[method](ids[: min(size, len(ids))], size, warm)
                        warmed.add(method)
                    run = runners[method](ids, size, decode)
                    row = {"key": key, "batch_size": size, "method": method, "repeat": repeat,
                           "new_tokens": sum(map(len, run.token_ids)), "wall_s": run.wall_s,
                           "tokens_per_s": sum(map(len, run.token_ids)) / run.wall_s,
                           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                           "outputs": [hash_ids(t) for t in run.token_ids], **run.stats}
                    if method == "ar":
                        reference[size] = run.token_ids
                    elif size in reference and sampled:  # information only: see the module's docstring
                        row["differs"] = sum(a != b for a, b in zip(reference[size], run.token_ids))
                    elif size in reference:
                        row.update(compare(bench.model, ids, reference[size], run.token_ids, config.max_new_tokens))
                    handle.write(json.dumps(row) + "\n")
                    handle.flush()
                    log.info("B=%d %s repeat %d: %.1f tokens/s", size, method, repeat, row["tokens_per_s"])
    summary = summarize_batched(read_rows(out / RESULTS))
    write_summary(out, summary)
    return summary


def hash_ids(ids: Sequence[int]) -> str:
    return hashlib.sha1(json.dumps(list(ids)).encode()).hexdigest()[:12]


@torch.inference_mode()
def compare(model: Any, prompts: Sequence[list[int]], reference: Sequence[list[int]], got: Sequence[list[int]],
            max_new: int) -> dict[str, int]:
    """Mismatches against ``ar``'s outputs; a first difference at a near-tie of the target's two best
    logits (recomputed unbatched) is counted as a tie, not a mismatch."""
    ties = mismatches = 0
    for prompt, want, have in zip(prompts, reference, got):
        if want == have:
            continue
        first = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
        if first < min(len(want), len(have)):
            logits = model(torch.tensor([prompt + want[:first]], device=model.device)).logits[0, -1].float()
            top = logits.topk(2).values
            if float(top[0] - top[1]) < TIE:
                ties += 1
                continue
        mismatches += 1
    return {"ties": ties, "mismatches": mismatches}


def summarize_batched(rows: Sequence[dict]) -> dict[str, Any]:
    """Per B and method: tokens/s mean ± std over repeats, speedup over ar at the same B."""
    out: dict[str, Any] = {}
    for size in sorted({r["batch_size"] for r in rows}):
        at = [r for r in rows if r["batch_size"] == size]
        ar = [r["tokens_per_s"] for r in at if r["method"] == "ar"]
        base = float(np.mean(ar)) if ar else float("nan")
        table = {}
        for method in dict.fromkeys(r["method"] for r in at):
            mine = [r for r in at if r["method"] == method]
            tps = [r["tokens_per_s"] for r in mine]
            book = [r["bookkeeping_s"] / r["wall_s"] for r in mine if "bookkeeping_s" in r]
            # rows of older benches have neither: their bookkeeping includes both
            learner = [r["policy_s"] / r["wall_s"] for r in mine if "policy_s" in r]
            sampling = [r["sample_s"] / r["wall_s"] for r in mine if r.get("sample_s")]
            table[method] = {
                "tokens_per_s": round(float(np.mean(tps)), 2), "std": round(float(np.std(tps)), 2),
                "speedup": round(float(np.mean(tps)) / base, 3), "repeats": len(mine),
                "mat": round(float(np.mean([r.get("mat", 1.0) for r in mine])), 3),
                "mismatches": sum(r.get("mismatches", 0) for r in mine), "ties": sum(r.get("ties", 0) for r in mine),
                "differs": sum(r["differs"] for r in mine) if any("differs" in r for r in mine) else None,
                "bookkeeping_share": round(float(np.mean(book)), 4) if book else None,
                "policy_share": round(float(np.mean(learner)), 4) if learner else None,
                "sample_share": round(float(np.mean(sampling)), 4) if sampling else None,
                "kv_mb": round(max(r.get("kv_bytes", 0) for r in mine) / 2**20, 1),
                "peak_rss_mb": round(max(r["peak_rss_mb"] for r in mine), 1),
                "pulls": mine[-1].get("pulls", {}),
            }
        add_best_length(table, at)
        out[str(size)] = table
    return out


def add_best_length(table: dict[str, dict[str, Any]], rows: Sequence[dict]) -> None:
    """BanditSpec §6.2's yardstick, where ``length:K`` methods ran: the best fixed length in
    hindsight (the one with the highest mean tokens/s over the repeats) and, for every other method,
    its tokens/s ÷ that length's in the same repeat (paired: a machine's drift falls on both), mean
    and per repeat. One length fixed after the fact, not the best of each repeat, which would
    favour the fixed lengths by the maximum of their noise."""
    lengths = [m for m in table if m.startswith("length:")]
    if not lengths:
        return
    best = max(lengths, key=lambda m: table[m]["tokens_per_s"])
    best_by_repeat = {r["repeat"]: r["tokens_per_s"] for r in rows if r["method"] == best}
    for method, entry in table.items():
        if method == "ar" or method.startswith("length:"):
            continue
        ratios = [r["tokens_per_s"] / best_by_repeat[r["repeat"]] for r in rows
                  if r["method"] == method and r["repeat"] in best_by_repeat]
        if ratios:
            entry["vs_best_length"] = {"length": best, "ratio": round(float(np.mean(ratios)), 3),
                                       "per_repeat": [round(x, 3) for x in ratios]}


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    (out / f"{SUMMARY}.json").write_text(json.dumps(summary, indent=2))
    lines = ["| B | method | tokens/s (± std) | × ar | ÷ best length | MAT | mismatches (ties) | policy | sampling "
             "| bookkeeping | KV MB |", "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for size, table in summary.items():
        for method, v in table.items():
            book = "" if v["bookkeeping_share"] is None else f"{100 * v['bookkeeping_share']:.2f} %"
            learner = "" if v.get("policy_share") is None else f"{100 * v['policy_share']:.2f} %"
            drawn = "" if v.get("sample_share") is None else f"{100 * v['sample_share']:.2f} %"
            best = v.get("vs_best_length")
            vs = "" if best is None else f"{best['ratio']:.3f} ({best['length']})"
            checked = (f"{v['mismatches']} ({v['ties']})" if v.get("differs") is None
                       else f"sampled: {v['differs']} differ")
            lines.append(f"| {size} | {method} | {v['tokens_per_s']:.1f} ± {v['std']:.1f} | {v['speedup']:.3f} | "
                         f"{vs} | {v['mat']:.2f} | {checked} | {learner} | {drawn} | {book} | "
                         f"{v['kv_mb']} |")
    (out / f"{SUMMARY}.md").write_text("\n".join(lines) + "\n")
    try:
        plot_throughput(out / "batch-throughput.png", summary)
    except ImportError:
        log.warning("matplotlib is not installed: no plot")


def plot_throughput(path: Path, summary: dict[str, Any]) -> None:
    import matplotlib  # optional (the plot extra): its callers check that it imports

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [int(s) for s in summary]
    methods = list(dict.fromkeys(m for table in summary.values() for m in table))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in methods:
        xs = [s for s in sizes if method in summary[str(s)]]
        ax.errorbar(xs, [summary[str(s)][method]["tokens_per_s"] for s in xs],
                    yerr=[summary[str(s)][method]["std"] for s in xs], marker="o", capsize=3, label=method)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Batched rounds: throughput against batch size")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
