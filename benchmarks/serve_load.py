"""`draftwise serve` under load: throughput, latency and time to first token at several concurrency
levels, for the default policy, no speculation and a fixed setting, through the official openai client.

Each setting runs its own server process on 127.0.0.1 (a free port), all of them up at once and
warmed up; then, level by level and repeat by repeat, each setting in turn (the order rotating)
keeps that many streamed chat requests in flight until ``--requests`` have finished, so a drifting
machine slows every setting of a level alike (run one after the other, a level once moved 7 %
between two runs of one setting). No prompt is sent twice to one server (the suffix drafter would
find its earlier answer): every level and repeat has its own prompts (the domains taken in turn),
and every setting gets the same prompts in the same order; every answer is greedy and checked
equal to the first setting's answer to the same prompt. Besides each run's row, each level's
throughput and p99 latency are given as ratios to the baseline setting's in the same repeat (mean
± std over the repeats).

    python benchmarks/serve_load.py                                        # smollm2, zoo:test prompts
    python benchmarks/serve_load.py --levels 1,4,8,16 --settings "default=;none=--policy fixed --arms none" \
        --data zoo:test,self_instruct --requests 32 --repeats 2
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/common.py, also when loaded by path
from common import rotated

from draftwise.bench.batched import interleave_domains
from draftwise.bench.datasets import PromptRequest, load_prompt_sources

SETTINGS = "default=;none=--policy fixed --arms none;suffix@8=--policy fixed --arms suffix@8"


@dataclass
class Reply:
    text: str
    seconds: float
    first_token_s: float
    tokens: int


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(target: str, extra: str, threads: int, max_batch: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [sys.executable, "-m", "draftwise.cli", "serve", "--target", target, "--port", str(port),
               "--threads", str(threads), "--max-batch", str(max_batch), *shlex.split(extra)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return server, url
        except OSError:
            time.sleep(0.5)
        if server.poll() is not None:
            raise SystemExit(f"the server for {extra!r} exited at start ({server.returncode})")
    server.kill()
    raise SystemExit(f"the server for {extra!r} did not answer /health within 300 s")


async def one_request(client: object, model: str, prompt: str, max_tokens: int) -> Reply:
    start = time.perf_counter()
    first, tokens = 0.0, 0
    parts: list[str] = []
    stream = await client.chat.completions.create(  # type: ignore[attr-defined]
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if not parts:
                first = time.perf_counter() - start
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return Reply("".join(parts), time.perf_counter() - start, first, tokens)


async def level_run(url: str, prompts: list[str], level: int,
                    max_tokens: int) -> tuple[float, list[Reply], list[str]]:
    """One request per prompt, ``level`` at a time (each client sends its next when one ends)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    queue = list(reversed(prompts))
    replies: list[Reply] = []
    asked: list[str] = []

    async def worker() -> None:
        while queue:
            prompt = queue.pop()
            replies.append(await one_request(client, model, prompt, max_tokens))
            asked.append(prompt)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(level)))
    seconds = time.perf_counter() - start
    await client.close()
    return seconds, replies, asked


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


@dataclass
class Row:
    level: int
    label: str
    repeat: int
    rate: float
    p50: float
    p99: float
    first_token: float
    mismatches: int


def ratios(rows: list[Row], level: int, label: str, reference: str) -> str:
    """Throughput and p99 latency of ``label`` at ``level`` over the reference's in the same repeat."""
    pairs = [(r, ref) for r in rows if r.level == level and r.label == label
             for ref in rows if ref.level == level and ref.label == reference and ref.repeat == r.repeat]

    def spread(values: list[float]) -> str:
        return f"{statistics.fmean(values):.3f}" + (f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else "")

    return f"{spread([r.rate / ref.rate for r, ref in pairs])} | {spread([r.p99 / ref.p99 for r, ref in pairs])}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--data", default="zoo:test",
                        help="prompt sets of draftwise bench (named, or files), comma-separated")
    parser.add_argument("--per-domain", type=int, default=30, help="prompts per domain (default 30)")
    parser.add_argument("--levels", default="1,4,8,16,32", help="concurrent requests, comma-separated")
    parser.add_argument("--settings", default=SETTINGS, help="LABEL=SERVE OPTIONS;... (the first is the reference)")
    parser.add_argument("--requests", type=int, default=32, help="requests per level (at least the level)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every level and setting, on new prompts")
    parser.add_argument("--warmup", type=int, default=4, help="requests before the timed levels")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--baseline", default="", help="the setting the ratios are taken to (default: none, if given)")
    args = parser.parse_args()
    loaded = load_prompt_sources(args.data.split(","), PromptRequest(per_domain=args.per_domain))
    prompts = [loaded[i].text for i in interleave_domains(loaded)]  # every level a mix of the domains
    levels = [int(n) for n in args.levels.split(",")]
    batches: dict[tuple[int, int], list[str]] = {}  # (level, repeat) → its own prompts, after the warm-up's
    start = args.warmup
    for level in levels:
        for repeat in range(args.repeats):
            count = max(args.requests, level)
            batches[level, repeat] = prompts[start : start + count]
            start += count
    if start > len(prompts):
        raise SystemExit(f"{start} distinct prompts needed, {args.data} gives {len(prompts)}: raise --per-domain")
    settings = [item.split("=", 1) for item in args.settings.split(";")]
    reference: dict[str, str] = {}
    rows: list[Row] = []
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for label, extra in settings:
            servers[label] = start_server(args.target, extra, args.threads, max(levels))
            asyncio.run(level_run(servers[label][1], prompts[: args.warmup], 2, args.max_tokens))  # untimed
        turn = 0
        for level in levels:
            for repeat in range(args.repeats):
                for label, _ in rotated(settings, turn):
                    seconds, replies, asked = asyncio.run(level_run(servers[label][1], batches[level, repeat], level,
                                                                    args.max_tokens))
                    mismatches = sum(reference.setdefault(prompt, reply.text) != reply.text
                                     for prompt, reply in zip(asked, replies))
                    latency = [r.seconds for r in replies]
                    rows.append(Row(level, label, repeat, sum(r.tokens for r in replies) / seconds,
                                    statistics.median(latency), percentile(latency, 0.99),
                                    statistics.median(r.first_token_s for r in replies), mismatches))
                turn += 1
    finally:
        for server, _ in servers.values():
            server.terminate()
            server.wait(timeout=60)
    print(f"{args.target}, {args.data}, {args.max_tokens} tokens, {args.threads} thread(s), "
          f"{args.requests} requests a level, {args.repeats} repeat(s)")
    print("| concurrency | setting | repeat | tokens/s | p50 latency s | p99 latency s | first token p50 s "
          "| mismatches |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    order = [label for label, _ in settings]
    for r in sorted(rows, key=lambda r: (r.level, r.repeat, order.index(r.label))):
        print(f"| {r.level} | {r.label} | {r.repeat + 1} | {r.rate:.1f} | {r.p50:.2f} | {r.p99:.2f} | "
              f"{r.first_token:.2f} | {r.mismatches} |")
    print()
    baseline = args.baseline or ("none" if "none" in order else order[0])
    print(f"| concurrency | setting | tokens/s × {baseline} | p99 latency × {baseline} |")
    print("|---:|---|---:|---:|")
    for level in levels:
        for label in order:
            if label != baseline:
                print(f"| {level} | {label} | {ratios(rows, level, label, baseline)} |")


if __name__ == "__main__":
    main()
