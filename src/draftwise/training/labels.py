"""Distillation labels: a target's own greedy answers to the corpus's training instructions.

Answers are generated in batches (left-padded, greedy, KV cache; ≈ 60–160 tokens/s on these two
cores) and appended to one JSONL file per domain, a line per answer, so a run can stop at any
time and the next one resumes where it ended. A line holds the instruction's SHA-256 (the
instruction itself stays in the data folder) and the answer's token ids; ``read_labels`` joins
them back with the corpus.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftwise.training.corpus import Example

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LabelPlan:
    per_domain: int = 600  # training instructions answered per domain
    max_new_tokens: int = 128
    max_prompt_tokens: int = 640  # longer prompts are skipped (they cost the most and teach the least)
    batch_size: int = 16


def instruction_key(instruction: str) -> str:
    return hashlib.sha256(instruction.encode("utf-8")).hexdigest()[:20]


def chat_prompt_ids(tokenizer: Any, instruction: str) -> list[int]:
    messages = [{"role": "user", "content": instruction}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def done_keys(path: Path) -> set[str]:
    if not path.exists():
        return set()
    keys = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            keys.add(json.loads(line)["key"])
        except (ValueError, KeyError):
            continue  # a line torn by an interrupted run is answered again
    return keys


def batches(items: Sequence[tuple[str, list[int]]], size: int) -> Iterator[list[tuple[str, list[int]]]]:
    """Batches of similar prompt length (less padding), in a fixed order."""
    ordered = sorted(items, key=lambda item: len(item[1]))
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


@torch.inference_mode()
def greedy_answers(model: Any, prompts: list[list[int]], max_new_tokens: int, eos: int, pad: int) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # (B, T), left-padded
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=eos, pad_token_id=pad)
    answers = []
    for row in out[:, width:].tolist():
        answer = []
        for token in row:
            answer.append(token)
            if token == eos:
                break
        answers.append(answer)
    return answers


def label_domain(model: Any, tokenizer: Any, examples: Sequence[Example], path: Path, plan: LabelPlan) -> int:
    """Answer up to ``plan.per_domain`` of ``examples`` not yet in ``path``; returns tokens written."""
    done = done_keys(path)
    todo: list[tuple[str, list[int]]] = []
    for example in examples:
        if len(done) + len(todo) >= plan.per_domain:
            break
        key = instruction_key(example.instruction)
        if key in done:
            continue
        ids = chat_prompt_ids(tokenizer, example.instruction)
        if len(ids) <= plan.max_prompt_tokens:
            todo.append((key, ids))
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    written = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    for batch in batches(todo, plan.batch_size):
        start = time.perf_counter()
        answers = greedy_answers(model, [ids for _, ids in batch], plan.max_new_tokens, eos, pad)
        with path.open("a", encoding="utf-8") as handle:
            for (key, _), answer in zip(batch, answers):
                handle.write(json.dumps({"key": key, "answer": answer}) + "\n")
        tokens = sum(len(a) for a in answers)
        written += tokens
        log.info("%s: %d answers, %d tokens, %.0f tokens/s", path.stem, len(batch), tokens,
                 tokens / (time.perf_counter() - start))
    return written


def read_records(path: Path, examples: Sequence[Example]) -> list[tuple[Example, dict]]:
    """Each labelled example with its record, in the file's order (a torn line is skipped)."""
    if not path.exists():
        return []
    by_key = {instruction_key(e.instruction): e for e in examples}
    labelled = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("key") in by_key:
            labelled.append((by_key[record["key"]], record))
    return labelled


def read_labels(path: Path, examples: Sequence[Example]) -> list[tuple[Example, list[int]]]:
    """Each example with the target's greedy answer (token ids)."""
    return [(e, list(r["answer"])) for e, r in read_records(path, examples)]
