"""Where a speculative method's time goes inside vLLM, and what perfect choices would be worth.

Run with the vLLM virtualenv, from the repository root (greedy only; one process, interleaved as
``vllm_throughput.py --interleaved``)::

    .venv-vllm/bin/python benchmarks/vllm_ceiling.py --concurrency 1 --prompts 32 --out runs/ceiling-c1.json

Every method runs the same prompts chunk by chunk, the order rotating per chunk. Per method: output
tokens/s (× ``none``), the target's steps (``execute_model`` calls), tokens per step, wall ms per
step, and the proposer's ms per step (``propose_draft_token_ids``: vLLM's call of the proposer,
the proposer itself included). Two clairvoyant proposers know the target's greedy answer (run
first, with ``none``) and bound what any choice could gain:

* ``trim`` — the proposer's default suffix drafter (``arctic-suffix`` where it is installed, else
  ``suffix``) at the full length (``fixed`` policy, no load cap), each
  draft cut to exactly the prefix the target will accept (nothing when that is empty): the ceiling
  of every stopping or draft-length rule over these drafts.
* ``pick`` — per step, the longer accepted prefix of two drafts: the suffix drafter's, cut as in
  ``trim``, and the default pool's LM drafter's (the zoo's generalist for SmolLM2), drafted only as
  far as the target accepts it: the ceiling of every choice between them, drafting time included.
* ``perfect`` — the target's own next K tokens: the ceiling of any drafter at K.

Methods: ``none``, ``suffix:K`` (vLLM's suffix decoding, needs ``arctic-inference``), ``ngram:K``,
``draftwise`` and ``draftwise+LABEL`` with ``--variant LABEL=JSON`` (as in ``vllm_throughput.py``),
``trim``, ``pick``, ``perfect``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_throughput as vt

from draftwise.drafters import ModelDrafter
from draftwise.drafters.stopping import StopRule
from draftwise.vllm.batch_view import caller_view
from draftwise.vllm.options import default_lookups
from draftwise.vllm.proposer import Proposer

ANSWERS: list[list[int]] = []  # prompt + greedy answer, per prompt: what the clairvoyant proposers read
TRIM_CONFIG = {"policy": "fixed", "cap_acceptance": 0, "log_requests": False}


def accepted_prefix(draft: Sequence[int], answer: Sequence[int], at: int) -> int:
    """How many of ``draft``'s tokens the target accepts: its common prefix with ``answer[at:]``.

    >>> accepted_prefix([5, 6, 7], [1, 5, 6, 9], 1)
    2
    """
    k = 0
    while k < len(draft) and at + k < len(answer) and answer[at + k] == draft[k]:
        k += 1
    return k


class _Clairvoyant(Proposer):
    """A proposer that knows each request's greedy answer (found by its tokens so far)."""

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.known: dict[str, list[int] | None] = {}  # request id → its answer

    def answer(self, rid: str, tokens: list[int]) -> list[int] | None:
        answer = self.known.get(rid)
        if answer is None or answer[: len(tokens)] != tokens:
            answer = self.known[rid] = next((a for a in ANSWERS if a[: len(tokens)] == tokens), None)
        return answer

    def rows(self, view: Any, sampled: Sequence[Sequence[int]], num_tokens: Any,
             token_ids: Any) -> list[tuple[int, list[int] | None]]:
        """Per row: its token count and its request's answer (None while prefilling)."""
        out = []
        for row in range(len(sampled)):
            n = int(num_tokens[row])
            rid = view.req_ids[row] if view is not None else str(row)
            out.append((n, self.answer(rid, [int(t) for t in token_ids[row, :n]]) if sampled[row] else None))
        return out


class TrimProposer(_Clairvoyant):
    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list[list[int]]:
        view = caller_view(len(sampled_token_ids))  # vLLM's frame, as Proposer.propose reads it
        drafts = self.core.step(view, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        rows = self.rows(view, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        return [list(d[: accepted_prefix(d, answer, n)]) if answer is not None else []
                for d, (n, answer) in zip(drafts, rows, strict=True)]


class _Accepted(StopRule):
    """Stops a greedy draft at its first token the target would reject (that token is never drafted)."""

    def __init__(self, answer: Sequence[int], at: int) -> None:
        self.name, self.answer, self.at = "accepted", answer, at

    def should_stop(self, probs: Any, step: int) -> bool:
        at = self.at + step
        return at >= len(self.answer) or int(probs.argmax()) != self.answer[at]


class PickProposer(_Clairvoyant):
    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        lm = next((i for i, d in enumerate(self.core.pool.templates) if isinstance(d, ModelDrafter)), None)
        if lm is None:
            raise SystemExit("pick: the proposer's default pool has no LM drafter for this target")
        self.lm = lm  # the pool index of the LM drafter whose drafts compete with the trie's

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list[list[int]]:
        view = caller_view(len(sampled_token_ids))
        drafts = self.core.step(view, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        out: list[list[int]] = []
        for row, (n, answer) in enumerate(self.rows(view, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)):
            if answer is None:
                out.append([])
                continue
            best = list(drafts[row][: accepted_prefix(drafts[row], answer, n)])
            rid = view.req_ids[row] if view is not None else None
            state = self.core.states.get(rid) if rid is not None else None
            if state is not None and len(best) < self.core.draft_len:
                other = self.core._propose(state, self.lm, self.core.draft_len, _Accepted(answer, n)).tokens
                other = other[: accepted_prefix(other, answer, n)]
                best = other if len(other) > len(best) else best
            out.append(best)
        return out


class PerfectProposer(_Clairvoyant):
    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list[list[int]]:
        k = self.core.draft_len
        return [answer[n : n + k] if answer is not None else []
                for n, answer in self.rows(caller_view(len(sampled_token_ids)), sampled_token_ids,
                                           num_tokens_no_spec, token_ids_cpu)]


def spec_for(method: str, k: int, config: str, variants: dict[str, dict]) -> tuple[dict | None, str]:
    oracle = {"trim": "TrimProposer", "pick": "PickProposer", "perfect": "PerfectProposer"}.get(method)
    if oracle:
        # the proposer's default lookup drafter, named `suffix` (arctic-suffix where installed)
        options: dict[str, Any] = dict(TRIM_CONFIG)
        if method in ("trim", "pick"):
            options["arms"] = f"suffix@{k}"
        if method == "trim":  # the lookup alone; `pick` keeps the default pool's LM drafter beside it
            options["drafters"] = list(default_lookups())
        spec = {"method": "custom_class", "model": f"vllm_ceiling.{oracle}", "num_speculative_tokens": k}
        return spec, json.dumps(options)
    return vt.spec_config(method, k, config, variants)


class Meter:
    """Target steps and the proposer's seconds, counted across every engine of this process."""

    def __init__(self) -> None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        self.steps, self.propose_s, self.gc_s, self._gc_start = 0, 0.0, 0.0, 0.0
        gc.callbacks.append(self._collection)
        execute, propose = GPUModelRunner.execute_model, GPUModelRunner.propose_draft_token_ids
        meter = self

        def counted(runner: Any, *args: Any, **kwargs: Any) -> Any:
            meter.steps += 1
            return execute(runner, *args, **kwargs)

        def timed(runner: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return propose(runner, *args, **kwargs)
            finally:
                meter.propose_s += time.perf_counter() - start

        GPUModelRunner.execute_model = counted  # type: ignore[method-assign]
        GPUModelRunner.propose_draft_token_ids = timed  # type: ignore[method-assign]

    def _collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_start

    def read(self) -> tuple[int, float, float]:
        return self.steps, self.propose_s, self.gc_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="none,suffix:8,draftwise,trim,perfect")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens of draftwise, trim and perfect")
    parser.add_argument("--draftwise-config", default='{"log_requests": false}')
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="zoo:target",
                        help="the model vLLM serves: a zoo name, smollm2 (the real target) or a checkpoint folder")
    parser.add_argument("--split", default="dev", choices=("dev", "test"), help="the zoo split prompts come from")
    parser.add_argument("--prompt-file", default="", metavar="JSONL",
                        help="prompts from this file, not the zoo's dev split")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # every engine in this process: one meter
    import vllm_ceiling  # the module vLLM imports the clairvoyant classes from (not __main__)
    from vllm import SamplingParams

    methods = ["none", *[m for m in args.methods.split(",") if m != "none"]]
    methods = [m for m in methods if vt._available(m)]
    c = args.concurrency
    warm, slices = vt.prompt_slices(args.prompts, [c], args.seed, args.prompt_file, args.max_tokens, args.target,
                                    args.split)
    meter = Meter()
    engines = vt.load_engines({m: spec_for(m, args.k, args.draftwise_config, vt.variants(args.variant))
                               for m in methods}, args.target)
    tokenizer = engines["none"].get_tokenizer()
    texts = [vt.chat_text(tokenizer, t) for t in [*warm, *slices[c]]]
    warm_texts, texts = texts[: len(warm)], texts[len(warm) :]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    reference = engines["none"].generate(texts, params, use_tqdm=False)
    vllm_ceiling.ANSWERS[:] = [[*r.prompt_token_ids, *r.outputs[0].token_ids] for r in reference]
    for llm in engines.values():
        llm.generate(warm_texts, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    totals = {m: {"tokens": 0, "seconds": 0.0, "steps": 0, "propose_s": 0.0, "gc_s": 0.0,
                      "equal": True} for m in methods}
    for chunk, i in enumerate(range(0, len(texts), c)):
        for method in vt.rotated(methods, chunk):
            steps, propose_s, gc_s = meter.read()
            start = time.perf_counter()
            done = engines[method].generate(texts[i : i + c], params, use_tqdm=False)
            total = totals[method]
            total["seconds"] += time.perf_counter() - start
            total["steps"] += meter.steps - steps
            total["propose_s"] += meter.propose_s - propose_s
            total["gc_s"] += meter.gc_s - gc_s
            total["tokens"] += sum(len(r.outputs[0].token_ids) for r in done)
            total["equal"] &= all(list(r.outputs[0].token_ids) == list(ref.outputs[0].token_ids)
                                  for r, ref in zip(done, reference[i : i + c], strict=True))
    base = totals["none"]["tokens"] / totals["none"]["seconds"]
    lines = [f"c = {c}, {len(texts)} prompts, {args.max_tokens} tokens", "",
             "| method | tokens/s | × none | steps | tokens/step | ms/step | proposer ms/step | GC ms/step "
             "| greedy = none |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for method, t in totals.items():
        rate = t["tokens"] / t["seconds"]
        t.update(tokens_per_s=rate, ratio=rate / base)
        lines.append(f"| {method} | {rate:.0f} | {rate / base:.2f} | {t['steps']} | {t['tokens'] / t['steps']:.2f} | "
                     f"{1000 * t['seconds'] / t['steps']:.2f} | {1000 * t['propose_s'] / t['steps']:.3f} | "
                     f"{1000 * t['gc_s'] / t['steps']:.3f} | "
                     f"{'yes' if t['equal'] else 'NO'} |")
    table = "\n".join(lines)
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"date": datetime.date.today().isoformat(), "command": sys.argv,
                                          "seed": args.seed, "table": table, "methods": totals}, indent=1))


if __name__ == "__main__":
    main()
