"""The target's view of training text, in bulk: features and soft labels for drafter training.

Drafters learn from what the target computes while it reads text: its hidden states (an EAGLE
head's input and, in EAGLE-3's fusion, the low, middle and high layers' too) and its next-token
distribution (kept as its top-k log-probabilities). The target reads each sequence once, in one
batched prefill; nothing is generated, so millions of tokens take minutes rather than hours.

Sources, each a folder of chunks per domain:

- ``corpus``: the train split's instructions with their reference responses, in the target's chat
  template (never the dev or test splits);
- ``answers``: the same instructions with the target's own greedy answers
  (:mod:`draftwise.training.labels`): the text drafters meet when the target writes.

The target computes as generation runs it by default, with the same 4-bit weights; the bulk pass
multiplies them, dequantized to bfloat16, as dense products (3× faster than the row-exact kernel
on a 2,048-row prefill, equal to it up to bfloat16 rounding: features need no token-exactness).

A chunk is a folder of ``.npy`` arrays (memory-mapped when read) written atomically, so a run stops
at any time and the next resumes after its last whole chunk::

    SOURCE/DOMAIN/00000/tokens.npy        (N,) int32, the sequences one after another
    SOURCE/DOMAIN/00000/starts.npy        (S + 1,) int64, where each sequence starts (and the end)
    SOURCE/DOMAIN/00000/prompt_lens.npy   (S,) int32, each sequence's chat prompt (the rest is response)
    SOURCE/DOMAIN/00000/features.npy      (N, L, H) float16: the hidden states of ``layers`` after each token
    SOURCE/DOMAIN/00000/top_ids.npy       (N, k) int32: the target's k likeliest next tokens
    SOURCE/DOMAIN/00000/top_logprobs.npy  (N, k) float16
    SOURCE/DOMAIN/00000/keys.json         the sequences' instruction keys (what is done)
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from draftwise.errors import DraftwiseError
from draftwise.models.numerics import GROUP, dequantize_int4, quantize_int4, replace_linears

log = logging.getLogger(__name__)

ARRAYS = ("tokens", "starts", "prompt_lens", "features", "top_ids", "top_logprobs")


@dataclass(frozen=True)
class SignalPlan:
    # hidden-state indices kept (transformers' numbering: i = after decoder layer i; the last is the
    # final norm's output, the LM head's input); None: :func:`default_layers`
    layers: tuple[int, ...] | None = None
    top_k: int = 16
    batch_tokens: int = 2048  # tokens per prefill batch (padding included)
    max_tokens: int = 768  # a longer sequence is cut to its first max_tokens
    chunk_tokens: int = 65_536


def default_layers(n_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layers, then the final one: (3, 15, 27, −1) for 30 layers."""
    return (*sorted({max(1, n_layers // 10), max(1, n_layers // 2), max(1, n_layers - 3)}), -1)


class DenseInt4Linear(nn.Module):
    """The 4-bit weights of :class:`~draftwise.models.numerics.Int4Linear`, dequantized to bfloat16 and
    multiplied as one dense product (bulk prefill: many rows, no exactness needed)."""

    dense: torch.Tensor

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        weight = weight.detach().float()
        if weight.shape[1] % GROUP:
            raise DraftwiseError(f"int4 weights need inputs a multiple of {GROUP} wide, got {weight.shape[1]}")
        dense = dequantize_int4(*quantize_int4(weight)).to(torch.bfloat16)
        self.register_buffer("dense", dense, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = (x.to(torch.bfloat16) @ self.dense.T).to(x.dtype)
        return out if self.bias is None else out + self.bias


def bulk_target(target_name: str) -> tuple[Any, Any, str]:
    """(model, tokenizer, numerics name): the target with the weights its default numerics computes with,
    as dense products over many rows: an int4 target's 4-bit weights dequantized
    (:class:`DenseInt4Linear`), a bfloat16 one in bfloat16, any other in float32."""
    from draftwise.models.loading import LoadOptions, checkpoint_precision, load_causal_lm, resolve_model_path
    from draftwise.models.numerics import resolve_numerics

    path = resolve_model_path(target_name)
    numerics = resolve_numerics(LoadOptions().numerics, "cpu", checkpoint_precision(path)).name
    dtype = "bfloat16" if numerics == "bfloat16" else "float32"
    model, tokenizer = load_causal_lm(target_name, LoadOptions(dtype=dtype), path)
    if numerics == "int4":
        replace_linears(model, DenseInt4Linear)
    return model.eval(), tokenizer, numerics


# -- sequences -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChatText:
    key: str
    tokens: list[int]
    prompt_len: int


def corpus_sequences(tokenizer: Any, examples: Iterable[Any]) -> Iterator[ChatText]:
    """Each train example as the target's chat: the instruction as the user's turn, the reference
    response as the assistant's."""
    from draftwise.training.labels import chat_prompt_ids, instruction_key

    eos = int(tokenizer.eos_token_id)
    for example in examples:
        prompt = chat_prompt_ids(tokenizer, example.instruction)
        response = tokenizer(example.response, add_special_tokens=False)["input_ids"]
        yield ChatText(instruction_key(example.instruction), prompt + list(response) + [eos], len(prompt))


def answer_sequences(tokenizer: Any, labelled: Iterable[tuple[Any, list[int]]]) -> Iterator[ChatText]:
    """Each labelled instruction with the target's own greedy answer."""
    from draftwise.training.labels import chat_prompt_ids, instruction_key

    for example, answer in labelled:
        prompt = chat_prompt_ids(tokenizer, example.instruction)
        yield ChatText(instruction_key(example.instruction), prompt + list(answer), len(prompt))


# -- the pass --------------------------------------------------------------------------------------------
def done_keys(folder: Path) -> set[str]:
    keys: set[str] = set()
    for chunk in sorted(folder.glob("[0-9]*")):
        keys.update(json.loads((chunk / "keys.json").read_text()))
    return keys


def chunk_tokens(folder: Path) -> int:
    return sum(int(np.load(c / "starts.npy")[-1]) for c in folder.glob("[0-9]*"))


def length_batches(items: Sequence[ChatText], batch_tokens: int) -> Iterator[list[ChatText]]:
    """Sequences of similar length together (little padding), at most ``batch_tokens`` padded tokens each."""
    ordered = sorted(items, key=lambda s: len(s.tokens))
    batch: list[ChatText] = []
    for item in ordered:
        if batch and len(item.tokens) * (len(batch) + 1) > batch_tokens:
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch


@torch.inference_mode()
def read_batch(target: Any, batch: list[ChatText], plan: SignalPlan) -> list[dict[str, Any]]:
    """The target on a right-padded batch (causal: padding after a sequence never reaches it)."""
    width = max(len(s.tokens) for s in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    for i, s in enumerate(batch):
        ids[i, : len(s.tokens)] = torch.tensor(s.tokens)
    out = target(input_ids=ids, output_hidden_states=True)
    layers = plan.layers or (-1,)
    features = torch.stack([out.hidden_states[i] for i in layers], 2).half()  # (B, T, L, H)
    top = torch.log_softmax(out.logits.float(), -1).topk(plan.top_k, dim=-1)
    rows = []
    for i, s in enumerate(batch):
        n = len(s.tokens)
        rows.append({"tokens": np.asarray(s.tokens, np.int32), "features": features[i, :n].numpy(),
                     "top_ids": top.indices[i, :n].numpy().astype(np.int32),
                     "top_logprobs": top.values[i, :n].half().numpy(), "prompt_len": s.prompt_len, "key": s.key})
    return rows


def write_chunk(folder: Path, rows: list[dict[str, Any]]) -> Path:
    index = len(list(folder.glob("[0-9]*")))
    final = folder / f"{index:05d}"
    tmp = folder / f"tmp-{index:05d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    lengths = [len(r["tokens"]) for r in rows]
    np.save(tmp / "tokens.npy", np.concatenate([r["tokens"] for r in rows]))
    np.save(tmp / "starts.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    np.save(tmp / "prompt_lens.npy", np.asarray([r["prompt_len"] for r in rows], np.int32))
    for name in ("features", "top_ids", "top_logprobs"):
        np.save(tmp / f"{name}.npy", np.concatenate([r[name] for r in rows]))
    (tmp / "keys.json").write_text(json.dumps([r["key"] for r in rows]))
    tmp.rename(final)
    return final


def read_sequences(target: Any, sequences: Iterable[ChatText], folder: Path, plan: SignalPlan,
                   token_budget: int) -> int:
    """Read the sequences not yet in ``folder`` until it holds ``token_budget`` tokens; returns tokens added."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("tmp-*"):
        shutil.rmtree(stale)
    done, have = done_keys(folder), chunk_tokens(folder)
    added = pending_tokens = 0
    pending: list[ChatText] = []

    def flush(items: list[ChatText]) -> int:
        started = time.perf_counter()
        rows = [r for batch in length_batches(items, plan.batch_tokens) for r in read_batch(target, batch, plan)]
        write_chunk(folder, rows)
        n = sum(len(r["tokens"]) for r in rows)
        log.info("%s: %d sequences, %d tokens, %.0f tokens/s", folder, len(rows), n,
                 n / (time.perf_counter() - started))
        return n

    for sequence in sequences:
        if have + added + pending_tokens >= token_budget:
            break
        if sequence.key in done:
            continue
        pending.append(ChatText(sequence.key, sequence.tokens[: plan.max_tokens], sequence.prompt_len))
        pending_tokens += len(pending[-1].tokens)
        if pending_tokens >= plan.chunk_tokens:
            added += flush(pending)
            pending, pending_tokens = [], 0
    if pending:
        added += flush(pending)
    return added


def write_plan(root: Path, plan: SignalPlan, target_name: str, numerics: str) -> None:
    """Record what the chunks under ``root`` hold; a different plan there is refused."""
    path = root / "signal.json"
    wanted = {"plan": asdict(plan), "target": target_name, "numerics": numerics}
    if path.exists():
        held = json.loads(path.read_text())
        if json.loads(json.dumps(wanted)) != held:
            raise DraftwiseError(f"{root} holds signal of another plan or target ({held}); use another folder")
        return
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(wanted, indent=2) + "\n")


def run_signal(target_name: str, corpus: Any, answers: Path | None, out: Path, per_domain_tokens: int,
               plan: SignalPlan | None = None, rounds: int = 4) -> dict[str, dict[str, int]]:
    """Read every domain's train split into chunks under ``out``, up to ``per_domain_tokens`` per
    domain in ``rounds`` passes over the domains (a run stopped early leaves them balanced), and with
    ``answers`` every one of the target's answers to it (the drafters learn from those). Returns
    tokens held per source and domain."""
    from draftwise.training.labels import read_labels

    target, tokenizer, numerics = bulk_target(target_name)
    plan = plan or SignalPlan()
    if plan.layers is None:
        plan = replace(plan, layers=default_layers(int(target.config.num_hidden_layers)))
    write_plan(out, plan, target_name, numerics)
    sources: dict[str, tuple[Callable[[str], Iterator[ChatText]], int]] = {
        "corpus": (lambda d: corpus_sequences(tokenizer, corpus.train[d]), per_domain_tokens)}
    if answers is not None:
        sources["answers"] = (lambda d: answer_sequences(tokenizer, read_labels(answers / f"{d}.jsonl",
                                                                                corpus.train[d])), sys.maxsize)
    for r in range(1, rounds + 1):
        for name, (make, budget) in sources.items():
            for domain in corpus.train:
                read_sequences(target, make(domain), out / name / domain, plan, budget * r // rounds)
    return {name: {d: chunk_tokens(out / name / d) for d in corpus.train} for name in sources}
