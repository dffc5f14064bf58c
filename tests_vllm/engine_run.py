"""Run one vLLM engine on the zoo target and dump its outputs as JSON (used by the vLLM tests).

    python tests_vllm/engine_run.py OUT.json [--spec JSON] [--draftwise JSON] [--jobs JSON]

One engine per process (vLLM starts workers with spawn, and its speculative settings are fixed at
start-up); each job is ``{"name", "prompts", "batch", "max_tokens", "temperature", "seeds"}``.
Prompts run in chunks of ``batch`` through ``LLM.generate``; outputs are token ids per prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def make_llm(spec: dict | None):
    from vllm import LLM

    from draftwise.zoo import resolve_zoo_name

    kwargs = {"speculative_config": spec} if spec else {}
    return LLM(model=str(resolve_zoo_name("zoo:target")), dtype="float32", max_model_len=1024, enforce_eager=True,
               seed=0, gpu_memory_utilization=0.15, **kwargs)


def chat(llm, text: str) -> str:
    return llm.get_tokenizer().apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                   add_generation_prompt=True)


def run_job(llm, job: dict) -> dict:
    from vllm import SamplingParams

    texts = [chat(llm, p) for p in job["prompts"]]
    seeds = job.get("seeds") or [None] * len(texts)
    params = [SamplingParams(temperature=job.get("temperature", 0.0), max_tokens=job["max_tokens"], seed=s)
              for s in seeds]
    out, start = [], time.perf_counter()
    for i in range(0, len(texts), job["batch"]):
        results = llm.generate(texts[i : i + job["batch"]], params[i : i + job["batch"]], use_tqdm=False)
        out += [list(r.outputs[0].token_ids) for r in results]
    return {"tokens": out, "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--spec", default="")
    parser.add_argument("--draftwise", default="", help="value for $DRAFTWISE_VLLM_CONFIG")
    parser.add_argument("--jobs", required=True, help="a JSON file of jobs")
    args = parser.parse_args()
    if args.draftwise:
        os.environ["DRAFTWISE_VLLM_CONFIG"] = args.draftwise
    with open(args.jobs, encoding="utf-8") as handle:
        jobs = json.load(handle)
    llm = make_llm(json.loads(args.spec) if args.spec else None)
    results = {job["name"]: run_job(llm, job) for job in jobs}
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main()
