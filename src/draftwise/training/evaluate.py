"""Greedy acceptance of every zoo drafter on every domain's held-out split (HedgeSpec Table 1 shape).

Exact without running the engine. For greedy decoding with draft length k:

1. The target greedily decodes each dev prompt once (KV-cached ``generate``); call the result
   t_1 … t_L (it ends with EOS unless it hit the token limit).
2. A drafter drafting greedily from a verified prefix equal to t_1 … t_c proposes
   d_1 = argmax q(· | prompt, t_1 … t_c); while its drafts match, its context *is* the target's
   sequence, so d_i is its teacher-forced argmax at position c + i. Hence one forward pass of
   the drafter over prompt + t_1 … t_L gives ``match[j]`` = (teacher-forced argmax == t_j) and
   the whole round structure follows from ``match`` alone (:func:`greedy_rounds`).
3. Each round accepts the longest matching run (at most k), then the target adds one token.

MAT (mean accepted tokens) = tokens produced / rounds; acceptance rate = accepted draft tokens
/ drafted tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from draftwise.models.cached_lm import common_prefix_len, layer_rows
from draftwise.models.vocab_map import vocab_map_of
from draftwise.training.corpus import DOMAINS, SPECIALIST_DOMAINS, Example, read_split
from draftwise.training.tokenizer import encode_prompts
from draftwise.verify.draft import DraftContext
from draftwise.zoo.load import TARGET_NAME, zoo_entries

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundStats:
    tokens: int  # tokens produced (accepted drafts + target tokens)
    rounds: int
    accepted: int  # accepted draft tokens
    drafted: int  # proposed draft tokens
    opened: int = 0  # rounds that drafted at least one token
    first: int = 0  # of those, rounds whose first drafted token was accepted

    def __add__(self, other: RoundStats) -> RoundStats:
        return RoundStats(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values())))

    @property
    def mat(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def first_acceptance(self) -> float:
        return self.first / self.opened if self.opened else 0.0


def greedy_rounds(match: Sequence[bool], k: int) -> RoundStats:
    """Rounds of greedy speculative decoding given which teacher-forced drafts match.

    Each round drafts min(k, remaining) tokens, accepts the longest run of matches, and the
    target adds one token unless the accepted run already finished the sequence.

    Worked example, k = 2, six target tokens, the drafter right on t1 t2 t4 t5 t6::

        c=0: drafts 2, both match → accepts t1 t2, the target adds t3    (c = 3)
        c=3: drafts 2, both match → accepts t4 t5, the target adds t6    (c = 6, done)

    >>> greedy_rounds([True, True, False, True, True, True], k=2)
    RoundStats(tokens=6, rounds=2, accepted=4, drafted=4, opened=2, first=2)
    >>> greedy_rounds([False, False, False], k=5)  # no luck: one token per round
    RoundStats(tokens=3, rounds=3, accepted=0, drafted=6, opened=3, first=0)
    """
    total = len(match)
    produced = rounds = accepted = drafted = opened = first = 0
    while produced < total:
        budget = min(k, total - produced)
        run = 0
        while run < budget and match[produced + run]:
            run += 1
        rounds += 1
        drafted += budget
        accepted += run
        opened += budget > 0
        first += run > 0
        produced += run + (1 if produced + run < total else 0)  # + the target's own token
    return RoundStats(tokens=total, rounds=rounds, accepted=accepted, drafted=drafted, opened=opened, first=first)


@torch.no_grad()
def target_continuations(
    target: Any, prompts: Sequence[list[int]], max_new_tokens: int, eos: int, pad: int
) -> list[list[int]]:
    """The target's greedy continuation of each prompt (KV-cached), EOS included when reached."""
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = target.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=eos, pad_token_id=pad,
        )
        new = out[0, len(prompt) :].tolist()
        if eos in new:
            new = new[: new.index(eos) + 1]
        outputs.append(new)
    return outputs


@torch.no_grad()
def teacher_forced_matches(drafter: PreTrainedModel, prompt: list[int], continuation: list[int]) -> list[bool]:
    """match[j]: the drafter's argmax after prompt + continuation[:j] equals continuation[j]."""
    vocab = vocab_map_of(drafter)  # a drafter over a vocabulary subset reads and writes through its map
    ids = vocab.draft_ids(prompt + continuation)[None] if vocab is not None else torch.tensor([prompt + continuation])
    logits = drafter(input_ids=ids).logits[0]  # (T, V)
    logits = vocab.target_logits(logits) if vocab is not None else logits
    predicted = logits[len(prompt) - 1 : len(prompt) - 1 + len(continuation)].argmax(-1)
    return (predicted == torch.tensor(continuation)).tolist()


def drafter_stats(
    drafter: PreTrainedModel, prompts: Sequence[list[int]], continuations: Sequence[list[int]], k: int
) -> RoundStats:
    stats = RoundStats(0, 0, 0, 0)
    for prompt, continuation in zip(prompts, continuations):
        if continuation:
            stats = stats + greedy_rounds(teacher_forced_matches(drafter, prompt, continuation), k)
    return stats


class HeadReplay:
    """A white-box head along prompt + continuation, handed the target's hidden states as the engine
    hands them (from one target forward over the whole sequence), drafting from any position."""

    @torch.inference_mode()
    def __init__(self, head: Any, target: PreTrainedModel, prompt: Sequence[int], continuation: Sequence[int]) -> None:
        self.head, self.prompt_len = head, len(prompt)
        self.sequence = list(prompt) + list(continuation)
        states = target(input_ids=torch.tensor([self.sequence]), output_hidden_states=True).hidden_states
        self.hidden = layer_rows(states, head.feature_layers, 0)
        self.sent = 0  # positions whose hidden states the head holds
        head.begin_query(prompt)

    @torch.inference_mode()
    def draft(self, t: int, k: int) -> list[int]:
        """The head's chain of up to ``k`` tokens after the prompt and the continuation's first ``t``
        (``t`` never decreases between calls, as in decoding)."""
        context = self.sequence[: self.prompt_len + t]
        self.head.observe_target(context, self.hidden[self.sent : len(context) - 1], self.sent)
        self.sent = len(context) - 1
        return self.head.propose(context, k, DraftContext()).tokens


def head_stats(head: Any, target: PreTrainedModel, prompts: Sequence[list[int]], continuations: Sequence[list[int]],
               k: int) -> RoundStats:
    """The same greedy rounds for a white-box head, which drafts from the target's hidden states
    (:class:`HeadReplay`): at each round's start the head drafts its own chain of ``k`` tokens."""
    stats = RoundStats(0, 0, 0, 0)
    for prompt, continuation in zip(prompts, continuations):
        replay = HeadReplay(head, target, prompt, continuation)
        t = 0
        while t < len(continuation):
            draft = replay.draft(t, min(k, len(continuation) - t - 1))
            accepted = common_prefix_len(draft, continuation[t:])
            stats = stats + RoundStats(accepted + 1, 1, accepted, len(draft), int(bool(draft)), int(accepted > 0))
            t += accepted + 1
    return stats


def load_fp32(path: str) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def evaluate_zoo(
    build: Path,
    split: str = "dev",
    n_prompts: int = 24,
    max_new_tokens: int = 96,
    draft_length: int = 5,
    models: Path | None = None,
    domains: Sequence[str] = DOMAINS,
    progress: bool = False,
) -> dict:
    """Acceptance rate and MAT of every zoo drafter on every domain's held-out split.

    Returns ``{"config": …, "cells": {drafter: {domain: {mat, acceptance, tokens, rounds, …}}}}``.
    """
    entries = zoo_entries(models)
    target_entry = next(e for e in entries if e.name == TARGET_NAME)
    tokenizer: Any = AutoTokenizer.from_pretrained(target_entry.path)
    target = load_fp32(target_entry.path)
    drafters = {e.name: load_fp32(e.path) for e in entries if e.role == "drafter"}
    cells: dict[str, dict[str, dict]] = {name: {} for name in drafters}
    seconds: dict[str, float] = {}
    for domain in tqdm(domains, desc="eval domains", disable=not progress):
        examples: list[Example] = read_split(build / "corpus" / split / f"{domain}.jsonl")[:n_prompts]
        prompts = encode_prompts(tokenizer, examples)
        started = time.perf_counter()
        continuations = target_continuations(
            target, prompts, max_new_tokens, tokenizer.eos_token_id, tokenizer.pad_token_id
        )
        seconds[domain] = time.perf_counter() - started
        for name, drafter in drafters.items():
            stats = drafter_stats(drafter, prompts, continuations, draft_length)
            cells[name][domain] = {**asdict(stats), "mat": stats.mat, "acceptance": stats.acceptance}
        log.info("eval %s: %d prompts, target decode %.0fs", domain, len(prompts), seconds[domain])
    config = {"split": split, "n_prompts": n_prompts, "max_new_tokens": max_new_tokens,
              "draft_length": draft_length, "decoding": "greedy", "domains": list(domains)}
    return {"config": config, "cells": cells, "target_decode_seconds": seconds}


def specialist_bar(result: dict, ratio: float = 1.25) -> dict[str, dict]:
    """Per specialist: in-domain MAT, mean out-of-domain MAT, the generalist's in-domain MAT, pass."""
    cells = result["cells"]
    domains = result["config"]["domains"]
    checks = {}
    for name in (d for d in SPECIALIST_DOMAINS if d in cells and d in domains):
        in_domain = cells[name][name]["mat"]
        others = [cells[name][d]["mat"] for d in domains if d != name]
        out_mean = sum(others) / len(others) if others else 0.0
        generalist = cells.get("generalist", {}).get(name, {}).get("mat", 0.0)
        checks[name] = {
            "in_domain": in_domain,
            "out_of_domain_mean": out_mean,
            "ratio": in_domain / out_mean if out_mean else float("inf"),
            "generalist_in_domain": generalist,
            "passes": in_domain >= ratio * out_mean and in_domain > generalist,
        }
    return checks


def format_table(result: dict) -> str:
    """A Markdown table: rows are drafters, columns domains, cells ``MAT (acceptance %)``."""
    domains = result["config"]["domains"]
    cells = result["cells"]
    lines = [
        "| drafter | " + " | ".join(domains) + " |",
        "|---|" + "---|" * len(domains),
    ]
    for name, row in cells.items():
        values = []
        for d in domains:
            cell = row[d]
            text = f"{cell['mat']:.2f} ({100 * cell['acceptance']:.0f}%)"
            values.append(f"**{text}**" if d == name else text)
        lines.append(f"| {name} | " + " | ".join(values) + " |")
    bar = specialist_bar(result)
    if bar:
        lines += ["", "| specialist | in-domain MAT | mean out-of-domain MAT | ratio | generalist in-domain | bar |",
                  "|---|---|---|---|---|---|"]
        for name, c in bar.items():
            lines.append(
                f"| {name} | {c['in_domain']:.2f} | {c['out_of_domain_mean']:.2f} | {c['ratio']:.2f} | "
                f"{c['generalist_in_domain']:.2f} | {'pass' if c['passes'] else 'FAIL'} |"
            )
    return "\n".join(lines)
