"""Run every prompt × method × repeat and append one row per run to ``results.jsonl``.

Steps:
  1. resolve the prompts (files or the zoo's dev split) and the method list (groups expanded);
  2. read the rows already in ``results.jsonl`` (a torn last line from an interruption is cut
     off) and plan only the missing (prompt, method, repeat) keys — resuming never loses or
     duplicates a row;
  3. run the plan in shards of prompts — in this process, in ``workers`` spawned processes, or as
     Ray tasks — each shard loading the models itself, warming every method up untimed and
     timing its own ``ar`` baseline on its own prompts;
  4. the parent alone appends rows (one writer: no interleaved lines) and drives the progress bar.

Rows are raw records; every summary is derived from them (:mod:`draftwise.bench.report`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import multiprocessing as mp
import os
import queue as queue_module
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers.utils import logging as hf_logging

from draftwise.api import Generator
from draftwise.bench.config import LEGACY_SETTINGS, RUN_DEFINING, BenchConfig
from draftwise.bench.datasets import (
    Prompt,
    PromptRequest,
    load_prompt_sources,
)
from draftwise.bench.methods import (
    INTERRUPTED,
    Workbench,
    build_method,
    check_method,
    expand_methods,
    is_derived,
)
from draftwise.bench.report import environment
from draftwise.bench.router_training import bench_router
from draftwise.drafters import build_drafters
from draftwise.drafters.suffix import forget_stored_answers
from draftwise.errors import DraftwiseError
from draftwise.models.loading import LoadOptions, context_limit, freeze_loaded_objects, load_target
from draftwise.request import SEED_LIMIT
from draftwise.zoo.load import zoo_domain_of

log = logging.getLogger(__name__)

RESULTS = "results.jsonl"
ENV = "env.json"
@dataclass(frozen=True)
class Job:
    prompt: int  # index into the shard's prompt list
    method: str
    repeat: int


@dataclass
class Shard:
    """Everything a worker needs; picklable (it travels to spawned processes and Ray tasks)."""

    config: BenchConfig
    prompts: list[Prompt]
    ids: list[list[int]]
    jobs: list[Job]
    router: Any = None
    worker: int = 0


def row_key(prompt_id: str, method: str, repeat: int) -> str:
    return f"{prompt_id}|{method}|{repeat}"


def row_seed(base: int, prompt_id: str, repeat: int) -> int:
    """Seed of one generation: fixed by the run seed, the prompt id and the repeat (never by order)."""
    return (base * 1_000_003 + zlib.crc32(prompt_id.encode("utf-8")) + 7919 * repeat) % 2**31


SEED_RULE = "(seed * 1000003 + crc32(prompt_id) + 7919 * repeat) mod 2**31"


# ----------------------------------------------------------------------------- results file


def read_rows(path: Path, repair: bool = False) -> list[dict]:
    """Rows of ``results.jsonl``, each key once; a torn last line (no newline) is dropped.

    With ``repair`` the torn tail is cut from the file so appends start on a fresh line.
    A malformed line elsewhere is corruption, not an interruption: it raises with its number.
    """
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    if complete < len(data):
        log.warning("%s: dropping a torn last line (%d bytes) left by an interruption", path, len(data) - complete)
        if repair:
            with open(path, "r+b") as handle:
                handle.truncate(complete)
    rows: dict[str, dict] = {}
    cut_short = 0
    for number, line in enumerate(data[:complete].decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if row.get("stopped_by") == INTERRUPTED:  # written by versions that kept Ctrl-C'd runs: redo them
                cut_short += 1
                continue
            rows.setdefault(row["key"], row)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DraftwiseError(
                f"{path}, line {number}: not a result row; move the file away or use a new --out") from None
    if cut_short:
        log.warning("%s: ignoring %d run(s) cut short by Ctrl-C; they run again", path, cut_short)
    return list(rows.values())


class RowWriter:
    """Appends rows, one line each, flushed and synced so an interruption loses at most the last."""

    def __init__(self, path: Path) -> None:
        self.handle = open(path, "a", encoding="utf-8")  # noqa: SIM115  (held open across writes; close() closes it)

    def write(self, row: dict) -> None:
        self.handle.write(json.dumps(row) + "\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()


# ----------------------------------------------------------------------------- planning


def resolve_prompts(config: BenchConfig) -> list[Prompt]:
    """The run's prompts: every ``--data`` source in order (files and named sets), else the zoo dev split."""
    request = PromptRequest(config.turns, config.per_domain, config.zoo_corpus, config.seed)
    return load_prompt_sources(config.data, request)


def plan_jobs(prompts: Sequence[Prompt], methods: Sequence[str], repeats: int, done: set[str]) -> list[Job]:
    """Missing runs, interleaved (repeat → prompt → method) so machine load hits every method alike."""
    return [
        Job(i, method, repeat)
        for repeat in range(repeats)
        for i, prompt in enumerate(prompts)
        for method in methods
        if not is_derived(method) and row_key(prompt.id, method, repeat) not in done
    ]


def shard_jobs(jobs: Sequence[Job], n_shards: int) -> list[list[Job]]:
    """Prompts go round-robin to shards (a prompt's runs stay together: its ``ar`` time is local)."""
    shards: list[list[Job]] = [[] for _ in range(n_shards)]
    for job in jobs:
        shards[job.prompt % n_shards].append(job)
    return [s for s in shards if s]


def check_resume(out: Path, config: BenchConfig) -> None:
    """A folder already holding results must come from the same run-defining settings."""
    env_path = out / ENV
    if not (out / RESULTS).exists() or not env_path.exists():
        return
    try:
        previous = json.loads(env_path.read_text())["config"]
    except (ValueError, KeyError):
        return
    current = asdict(config)
    previous = {**LEGACY_SETTINGS, **previous}
    diffs = [f"{k}: {previous.get(k)!r} there, {jsonable(current[k])!r} now" for k in RUN_DEFINING
             if jsonable(previous.get(k)) != jsonable(current[k])]
    if diffs:
        raise DraftwiseError(f"{out} holds results of a different run ({'; '.join(diffs)}); use another --out "
                             "or the same settings to resume")


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


# ----------------------------------------------------------------------------- models


def load_workbench(config: BenchConfig, router: Any = None) -> Workbench:
    options = LoadOptions(device=config.device, dtype=config.dtype, numerics=config.numerics)
    model, tokenizer, _ = load_target(config.target, options)
    pool = build_drafters(list(config.drafters), model, tokenizer, options)
    bench = Workbench(model, tokenizer, pool, config.draft_len, config.seed, drafter_domains(pool), router,
                      config.sampling, config.target)
    freeze_loaded_objects()  # no full garbage collection walks the models mid-run
    return bench


def drafter_domains(pool: Sequence[Any]) -> dict[str, tuple[str, ...]]:
    """Zoo drafters know their training domains (the router maps a domain to its specialist)."""
    out: dict[str, tuple[str, ...]] = {}
    for d in pool:
        source = getattr(d, "source", "")
        if source.startswith("zoo:"):
            with contextlib.suppress(DraftwiseError):  # a zoo drafter the manifest does not know: no domains
                out[d.name] = tuple(zoo_domain_of(source))
    return out


def encode_prompts(bench: Workbench, prompts: Sequence[Prompt], max_new_tokens: int) -> list[list[int]]:
    """Token ids of every prompt, through the target's tokenizer (and chat template), fitted to its context."""
    encoder = Generator(bench.model, bench.tokenizer, [], policy="fixed")
    limit = context_limit(bench.model)
    out = []
    for p in prompts:
        ids = encoder.encode(p.text)
        if limit is not None and len(ids) + max_new_tokens > limit:
            room = limit - max_new_tokens
            if room < 1:
                raise DraftwiseError(
                    f"max_new_tokens {max_new_tokens} leaves no room in the target's context of {limit}")
            log.info("prompt %s truncated to its last %d tokens", p.id, room)
            ids = ids[-room:]  # the same truncated ids go to every method, peers included
        out.append(ids)
    return out


# ----------------------------------------------------------------------------- shards


def run_shard(shard: Shard, bench: Workbench | None = None) -> Iterator[dict]:
    """Rows of one shard's jobs: methods built once and warmed up untimed before their first timed run."""
    config = shard.config
    bench = bench or load_workbench(config, shard.router)
    settings = config.request()
    warmup = replace(settings, max_new_tokens=max(1, min(config.warmup_tokens, config.max_new_tokens)))
    methods: dict[str, Any] = {}
    repeat = shard.jobs[0].repeat if shard.jobs else 0
    for job in shard.jobs:
        if job.repeat != repeat:  # a repeat runs the same prompts again: it starts cold as the first did
            repeat = job.repeat
            for method in methods.values():
                start_cold(method)
        if job.method not in methods:
            methods[job.method] = build_method(bench, job.method)
            if config.warmup_tokens > 0:
                first = shard.jobs[0].prompt
                methods[job.method].run(shard.ids[first], shard.prompts[first].text, config.seed, warmup)
                start_cold(methods[job.method])
        prompt = shard.prompts[job.prompt]
        seed = row_seed(config.seed, prompt.id, job.repeat)
        out = methods[job.method].run(shard.ids[job.prompt], prompt.text, seed, settings)
        yield make_row(prompt, job, seed, shard.worker, out)


def start_cold(method: Any) -> None:
    """Drop the responses a method's suffix drafters stored: a timed run must not draft from the
    answer a warm-up or an earlier repeat gave to the same prompt (the store keeps answers to
    other prompts of the run, as a server's would)."""
    generators = [getattr(method, "generator", None), *getattr(method, "generators", {}).values()]
    for generator in generators:
        forget_stored_answers(getattr(generator, "drafters", ()))


def make_row(prompt: Prompt, job: Job, seed: int, worker: int, out: Any) -> dict:
    return {
        "key": row_key(prompt.id, job.method, job.repeat),
        "prompt_id": prompt.id,
        "domain": prompt.domain,
        "method": job.method,
        "repeat": job.repeat,
        "seed": seed,
        "worker": worker,
        "wall_s": out.wall_s,
        "new_tokens": len(out.token_ids),
        **{k: v for k, v in out.stats.items() if k != "new_tokens"},
        "token_ids": out.token_ids,
        "trace": out.trace,
    }


def _process_main(shard: Shard, results: Any) -> None:
    """Entry point of a spawned worker: rows go back through the queue, errors as one message."""
    torch.set_num_threads(shard.config.threads)
    _quiet_transformers()
    try:
        for row in run_shard(shard):
            results.put(("row", row))
        results.put(("done", shard.worker))
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the terminal's group: the parent stops too
        results.put(("interrupted", shard.worker))
    except DraftwiseError as exc:
        results.put(("error", str(exc)))
    except BaseException as exc:  # report any crash to the parent, then exit
        results.put(("error", f"worker {shard.worker} crashed: {type(exc).__name__}: {exc}"))


def _quiet_transformers() -> None:
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def rows_in_processes(shards: Sequence[Shard]) -> Iterator[dict]:
    ctx = mp.get_context("spawn")  # fork after torch has started threads can deadlock
    results = ctx.Queue()
    procs = [ctx.Process(target=_process_main, args=(s, results), daemon=True) for s in shards]
    for p in procs:
        p.start()
    running = len(procs)
    try:
        while running:
            try:
                kind, payload = results.get(timeout=2.0)
            except queue_module.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise DraftwiseError(
                        f"a bench worker died (exit code {dead[0].exitcode}); rerun to resume") from None
                continue
            if kind == "row":
                yield payload
            elif kind == "done":
                running -= 1
            elif kind == "interrupted":
                raise KeyboardInterrupt
            else:
                raise DraftwiseError(payload)
    except KeyboardInterrupt:
        yield from _finished_rows(results)  # rows the workers finished before the Ctrl-C are kept
        raise
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=5)


def _finished_rows(results: Any, wait_s: float = 0.5) -> Iterator[dict]:
    """Rows already on their way from the workers (each one a finished run)."""
    while True:
        try:
            kind, payload = results.get(timeout=wait_s)
        except (queue_module.Empty, OSError, EOFError):
            return
        if kind == "row":
            yield payload


def rows_on_ray(shards: Sequence[Shard], address: str) -> Iterator[dict]:
    try:  # Ray is optional (the ray extra)
        import ray
    except ImportError:
        raise DraftwiseError("--ray needs Ray: pip install 'draftwise[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(num_cpus=shards[0].config.threads)(_ray_task)
    pending = [task.remote(s) for s in shards]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        kind, payload = ray.get(ready[0])
        if kind == "error":
            raise DraftwiseError(payload)
        yield from payload


def _ray_task(shard: Shard) -> tuple[str, Any]:
    torch.set_num_threads(shard.config.threads)
    _quiet_transformers()
    try:
        return "rows", list(run_shard(shard))
    except DraftwiseError as exc:
        return "error", str(exc)


# ----------------------------------------------------------------------------- the whole run


@dataclass
class RunResult:
    rows: list[dict]
    prompts: list[Prompt]
    methods: list[str]
    new_rows: int
    env: dict[str, Any] = field(default_factory=dict)


def run_bench(config: BenchConfig, bench: Workbench | None = None) -> RunResult:
    """Run (or resume) a benchmark into ``config.out``; returns every row of the current plan."""
    validate(config)
    for spec in config.methods:
        check_method(spec)  # unknown names and missing extras fail before any model loads
    out = Path(config.out)
    check_resume(out, config)
    prompts = resolve_prompts(config)
    router, router_info = (None, None)
    if "router" in config.methods:
        router, router_info = bench_router(config)
    bench = bench or load_workbench(config, router)
    bench.router = router
    methods = expand_methods(config.methods, bench.drafter_names, bench.lm_names)
    for spec in methods:
        if not is_derived(spec):
            build_method(bench, spec)  # bad options, unknown drafters: one clear error now, not in a worker
    ids = encode_prompts(bench, prompts, config.max_new_tokens)
    env = environment(config, methods, prompts, router_info, SEED_RULE, bench.drafter_names, bench.model)
    # Created only now: bad input found above leaves no empty folder behind (and never touches one
    # that already held results).
    make_out_folder(out)
    (out / ENV).write_text(json.dumps(env, indent=2, default=str))

    done = {row["key"] for row in read_rows(out / RESULTS, repair=True)}
    jobs = plan_jobs(prompts, methods, config.repeats, done)
    log.info("%d prompts × %d methods × %d repeats: %d runs to do, %d already in %s", len(prompts), len(methods),
             config.repeats, len(jobs), len(done), out / RESULTS)
    new_rows = _execute(config, prompts, ids, jobs, router, bench, out / RESULTS)
    keys = {row_key(p.id, m, r) for p in prompts for m in methods for r in range(config.repeats)}
    rows = [row for row in read_rows(out / RESULTS) if row["key"] in keys]
    return RunResult(rows, prompts, methods, new_rows, env)


def _execute(config: BenchConfig, prompts: list[Prompt], ids: list[list[int]], jobs: list[Job], router: Any,
             bench: Workbench, results_path: Path) -> int:
    if not jobs:
        return 0
    n_shards = config.workers if config.ray is None else max(config.workers, min(len(prompts), 4 * config.workers))
    shards = [Shard(config, prompts, ids, shard, router, worker=i)
              for i, shard in enumerate(shard_jobs(jobs, max(1, n_shards)))]
    if config.ray is not None:
        rows: Iterable[dict] = rows_on_ray(shards, config.ray)
    elif config.workers > 1:
        rows = rows_in_processes(shards)
    else:
        rows = (row for shard in shards for row in run_shard(shard, bench))
    writer = RowWriter(results_path)
    written = 0
    try:
        with tqdm(total=len(jobs), desc="bench", unit="run", disable=not config.progress, dynamic_ncols=True) as bar:
            for row in rows:
                writer.write(row)
                written += 1
                bar.update(1)
                bar.set_postfix_str(f"{row['method']} {row['new_tokens'] / max(row['wall_s'], 1e-9):.0f} tok/s")
    finally:
        writer.close()
    return written


def make_out_folder(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DraftwiseError(f"--out {out}: cannot create the folder ({error.strerror or error})") from None


def validate(config: BenchConfig) -> None:
    """Every option that needs no file or model, checked first (NaN fails every comparison, so
    each check states what is valid)."""
    out = Path(config.out)
    checks = [
        (not out.exists() or out.is_dir(), f"--out {out} is a file; give a folder (new, or one to resume)"),
        (config.max_new_tokens >= 1, f"--max-new-tokens must be ≥ 1, got {config.max_new_tokens}"),
        (math.isfinite(config.temperature) and config.temperature >= 0,
         f"--temperature must be ≥ 0 and finite (0 = greedy), got {config.temperature}"),
        (config.top_p is None or 0 < config.top_p <= 1, f"--top-p must lie in (0, 1], got {config.top_p}"),
        (config.top_k is None or config.top_k >= 1, f"--top-k must be ≥ 1, got {config.top_k}"),
        (0 <= config.seed < SEED_LIMIT, f"--seed must be an integer in [0, 2**64), got {config.seed}"),
        (config.warmup_tokens >= 0, f"--warmup-tokens must be ≥ 0 (0: no warm-up), got {config.warmup_tokens}"),
        (config.repeats >= 1, f"--repeats must be ≥ 1, got {config.repeats}"),
        (config.workers >= 1, f"--workers must be ≥ 1, got {config.workers}"),
        (config.draft_len is None or config.draft_len >= 1, f"--draft-len must be ≥ 1, got {config.draft_len}"),
        (config.per_domain is None or config.per_domain >= 1, f"--per-domain must be ≥ 1, got {config.per_domain}"),
        (bool(config.methods), "--methods is empty"),
        (config.threads >= 1, f"--threads must be ≥ 1, got {config.threads}"),
    ]
    for ok, message in checks:
        if not ok:
            raise DraftwiseError(message)
