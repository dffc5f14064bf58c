"""`draftwise serve` under load: throughput, latency and time to first token at several concurrency
levels, for the default policy, no speculation and a fixed setting, through the official openai client.

Each setting runs its own server process on 127.0.0.1 (a free port), is warmed up, then at each
level keeps that many streamed chat requests in flight until ``--requests`` have finished. No
prompt is sent twice to one server (the suffix drafter would find its earlier answer), and every
setting gets the same prompts in the same order; every answer is greedy and checked equal to the
first setting's answer to the same prompt.

    python benchmarks/serve_load.py                                        # smollm2, zoo:test prompts
    python benchmarks/serve_load.py --levels 1,8,32 --settings "default=;none=--policy fixed --arms none"
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
    first, parts, tokens = 0.0, [], 0
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--data", default="zoo:test", help="a prompt set of draftwise bench (named, or a file)")
    parser.add_argument("--per-domain", type=int, default=30, help="prompts per domain (default 30)")
    parser.add_argument("--levels", default="1,4,8,16,32", help="concurrent requests, comma-separated")
    parser.add_argument("--settings", default=SETTINGS, help="LABEL=SERVE OPTIONS;... (the first is the reference)")
    parser.add_argument("--requests", type=int, default=32, help="requests per level (at least the level)")
    parser.add_argument("--warmup", type=int, default=4, help="requests before the timed levels")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    prompts = [p.text for p in load_prompt_sources([args.data], PromptRequest(per_domain=args.per_domain))]
    levels = [int(n) for n in args.levels.split(",")]
    batches, start = [], args.warmup  # each level's own prompts, after the warm-up's
    for level in levels:
        count = max(args.requests, level)
        batches.append(prompts[start : start + count])
        start += count
    if start > len(prompts):
        raise SystemExit(f"{start} distinct prompts needed, {args.data} gives {len(prompts)}: raise --per-domain")
    settings = [item.split("=", 1) for item in args.settings.split(";")]
    reference: dict[str, str] = {}
    rows = []
    for label, extra in settings:
        server, url = start_server(args.target, extra, args.threads, max(levels))
        try:
            asyncio.run(level_run(url, prompts[: args.warmup], 2, args.max_tokens))  # untimed
            for level, batch in zip(levels, batches):
                seconds, replies, asked = asyncio.run(level_run(url, batch, level, args.max_tokens))
                mismatches = 0
                for prompt, reply in zip(asked, replies):
                    if reference.setdefault(prompt, reply.text) != reply.text:
                        mismatches += 1
                latency = [r.seconds for r in replies]
                rows.append((level, label, sum(r.tokens for r in replies) / seconds, statistics.median(latency),
                             percentile(latency, 0.99), statistics.median(r.first_token_s for r in replies),
                             mismatches))
        finally:
            server.terminate()
            server.wait(timeout=60)
    print(f"{args.target}, {args.data}, {args.max_tokens} tokens, {args.threads} thread(s)")
    print("| concurrency | setting | tokens/s | p50 latency s | p99 latency s | first token p50 s | mismatches |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for level, label, rate, p50, p99, ttft, mismatches in sorted(rows, key=lambda r: (r[0], r[1] != settings[0][0])):
        print(f"| {level} | {label} | {rate:.1f} | {p50:.2f} | {p99:.2f} | {ttft:.2f} | {mismatches} |")


if __name__ == "__main__":
    main()
