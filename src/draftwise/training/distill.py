"""Drafters for a real target, distilled from what the target computes as it reads and writes.

The data (each stage resumable, kept outside the repository):

1. **labels** — the target's own greedy answers to the corpus's training instructions
   (:mod:`draftwise.training.labels`): on-policy text, what drafters meet when the target writes;
2. **signal** — the target reads those answers and the train split's reference responses in bulk
   (:mod:`draftwise.training.signal`): its hidden states and next-token distribution (top-k) at
   every position.

The drafters:

- **LM drafters**, small Llamas over a frequency-ranked subset of the target's vocabulary
  (:mod:`draftwise.models.vocab_map`), embeddings started from the target's own projected onto their
  principal directions. They learn the target's distribution (KL to its top-k, renormalised over
  the subset) at every response position, the prompt as context (DistillSpec's recipe). The
  generalist learns every domain; each specialist starts from it and continues on its own domain.
- **The EAGLE head** (:mod:`draftwise.training.distill_eagle`), EAGLE-3-style: it fuses the
  target's low, middle and high layers and is trained over several draft steps on its own predictions.
"""


from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from draftwise.api import Generator
from draftwise.errors import DraftwiseError
from draftwise.models.loading import LoadOptions, load_target
from draftwise.models.vocab_map import FILE as VOCAB_FILE
from draftwise.models.vocab_map import VocabMap
from draftwise.training.budgets import BUDGETS
from draftwise.training.corpus import DOMAINS, SPECIALIST_DOMAINS, build_corpus, read_corpus, write_corpus
from draftwise.training.distill_eagle import SignalHeadRecipe, train_signal_head
from draftwise.training.heads import soft_targets_loss
from draftwise.training.labels import LabelPlan, chat_prompt_ids, label_domain, read_labels
from draftwise.training.signal import run_signal
from draftwise.training.signal_rows import SignalRows, held_layers, signal_chunks
from draftwise.training.train import ModelShape, TrainConfig, count_params, train_loop
from draftwise.zoo.load import MANIFEST, shipped_models_dir

EAGLE = "eagle"  # the white-box head, trained after the LM drafters on the same signal
DRAFTERS = ("generalist", *SPECIALIST_DOMAINS, EAGLE)  # what a build trains, in order: what ``only`` may name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrafterRecipe:
    shape: ModelShape = ModelShape(layers=1, hidden=256, intermediate=768, heads=4, max_positions=8192)
    kv_heads: int = 4
    vocab: int = 4096  # drafter ids: vocab − 1 listed target tokens + one for the rest
    generalist: TrainConfig = TrainConfig(steps=600, batch=16, seq_len=512, lr=2e-3, warmup=40)
    specialist: TrainConfig = TrainConfig(steps=150, batch=16, seq_len=512, lr=1e-3, warmup=10)
    # which of the signal's sources it learns from: the reference responses (corpus) lowered a warm-started
    # generalist's dev MAT (1.47 → 1.42 after 100 steps), the target's own answers are what it drafts on
    sources: tuple[str, ...] = ("answers",)


def choose_vocabulary(answers: Sequence[Sequence[int]], size: int, always: Sequence[int],
                      then: Sequence[Sequence[int]] = ()) -> list[int]:
    """The ``size`` target ids a drafter may propose: ``always`` first, then by frequency in
    ``answers``, then (when answers use fewer) by frequency in ``then`` (the prompts), then by id."""
    chosen = dict.fromkeys(int(t) for t in always)
    for texts in (answers, then, [range(size + len(chosen))]):
        counts = Counter(token for text in texts for token in text)
        for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            if len(chosen) >= size:
                return list(chosen)
            chosen.setdefault(int(token))
    return list(chosen)


def drafter_config(recipe: DrafterRecipe, target_config: Any) -> LlamaConfig:
    shape = recipe.shape
    return LlamaConfig(
        vocab_size=recipe.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=recipe.kv_heads,
        max_position_embeddings=shape.max_positions,
        rope_theta=float(target_config.rope_parameters["rope_theta"]),  # type: ignore[call-arg]
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        initializer_range=0.02,
    )


def projected_embeddings(target_embed: torch.Tensor, vocab: VocabMap, hidden: int) -> torch.Tensor:
    """(K + 1, hidden) the subset's target embeddings on their top principal directions, scaled to
    the usual initial spread (0.02: the head is tied, larger rows start with huge logits); the row
    for every other token is their mean."""
    rows = target_embed[vocab.to_target].float()  # (K, H_t)
    centred = rows - rows.mean(0)
    _, _, v = torch.linalg.svd(centred, full_matrices=False)
    projected = centred @ v[:hidden].T  # (K, hidden)
    projected = projected / projected.pow(2).mean().sqrt() * 0.02
    return torch.cat([projected, projected.mean(0, keepdim=True)])


def new_drafter(recipe: DrafterRecipe, target: Any, vocab: VocabMap, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(drafter_config(recipe, target.config))
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(
            projected_embeddings(target.get_input_embeddings().weight, vocab, recipe.shape.hidden))
    return model


def signal_lm_loss(model: Any, batch: Any, vocab: VocabMap) -> torch.Tensor:
    """KL to the target's next-token distribution (its top-k, renormalised over the drafter's
    subset) at the batch's learned positions (:class:`~draftwise.training.signal_rows.RowBatch`)."""
    hidden = model.model(input_ids=vocab.to_draft[batch.tokens]).last_hidden_state  # (B, T, H)
    where = batch.learn
    logits = model.lm_head(hidden[where])[:, : vocab.other]  # the drafter never proposes "every other token"
    return soft_targets_loss(logits, vocab.draft_targets(batch.top_ids[where]), batch.top_logprobs[where])


def train_drafter_on_signal(model: Any, rows: Any, vocab: VocabMap, config: TrainConfig, seed: int,
                            checkpoint: Path, label: str) -> dict[str, Any]:
    """Train ``model`` on signal rows (:class:`~draftwise.training.signal_rows.SignalRows`, responses
    only), resuming from ``checkpoint``; returns what the model card reports."""
    state = train_loop(model, len(rows), lambda m, index: signal_lm_loss(m, rows.batch(index), vocab), config, seed,
                       checkpoint, label, progress=False)
    return {"steps": state.step, "tokens_seen": state.tokens, "seconds": round(state.seconds, 1),
            "final_loss": round(state.last_loss, 4), "rows": len(rows), "signal_tokens": rows.tokens()}


def save_drafter(model: Any, vocab: VocabMap, folder: Path, meta: dict[str, Any]) -> None:
    """An ordinary fp16 checkpoint (``config.json`` says float32: CPU inference upcasts) plus its vocabulary."""
    folder.mkdir(parents=True, exist_ok=True)
    model.half().save_pretrained(str(folder))
    model.float()
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = "float32"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / VOCAB_FILE).write_text(vocab.to_json() + "\n")
    (folder / "training.json").write_text(json.dumps({**meta, "params": count_params(model)}, indent=2) + "\n")


# ----------------------------------------------------------------------------- the whole build


def corpus_for(data: Path, out: Path) -> Any:
    """The zoo corpus (the toy zoo's splits and seed: train examples only are labelled), cached in ``out``."""
    folder = out / "corpus"
    if (folder / "train").is_dir():
        return read_corpus(folder)
    budget = BUDGETS.get("full")
    corpus = build_corpus(data, budget.limits, budget.n_dev, budget.n_test, seed=budget.seed)
    write_corpus(corpus, folder)
    return corpus


def check_drafters(names: Sequence[str], option: str = "only") -> tuple[str, ...]:
    """``names`` when each is a drafter a build trains (:data:`DRAFTERS`); one clear error otherwise."""
    for name in names:
        if name not in DRAFTERS:
            raise DraftwiseError(f"{option}: unknown drafter {name!r}; valid: {', '.join(DRAFTERS)} "
                                 "(comma-separated)")
    return tuple(names)


def run_distill(target_name: str, data: Path, out: Path, *, plan: LabelPlan | None = None,
                recipe: DrafterRecipe | None = None, head: SignalHeadRecipe | None = None, labels: Path | None = None,
                signal: Path | None = None, signal_tokens: int = 220_000, until: str = "", install: bool = False,
                only: Sequence[str] = ()) -> list[str]:
    """Labels → signal → vocabulary → generalist → specialists → EAGLE head (→ installed into the
    package's zoo), each stage skipped when its output exists: an interrupted build resumes where it
    stopped. ``signal_tokens``: of each domain's train split (every answer is read); ``only`` trains
    just the drafters it names (specialists need the generalist first)."""
    only = check_drafters(only)  # an unknown name fails before the corpus is written or the target loads
    recipe = recipe or DrafterRecipe()
    plan = plan or LabelPlan()
    head = head or SignalHeadRecipe()
    labels = labels or out / "labels"
    signal = signal or out / "signal"
    corpus = corpus_for(data, out)
    # the target as generation runs it by default (int4 for the GGUF smollm2): its answers are what drafters meet
    target, tokenizer, _ = load_target(target_name, LoadOptions())
    if tokenizer is None:
        raise DraftwiseError(f"distill: target {target_name!r} has no tokenizer (the corpus is text)")
    plain = Generator(target, tokenizer, [], policy="fixed:none")
    for domain in DOMAINS:
        label_domain(plain, corpus.train[domain], labels / f"{domain}.jsonl", plan)
    if until == "labels":
        return []
    run_signal(target_name, corpus, labels, signal, signal_tokens)
    if until == "signal":
        return []
    labelled = [pair for d in DOMAINS for pair in read_labels(labels / f"{d}.jsonl", corpus.train[d])]
    answers = [a for _, a in labelled]
    vocab_path = out / "vocabulary.json"
    if not vocab_path.exists():
        prompts = [chat_prompt_ids(tokenizer, e.instruction) for e, _ in labelled]
        ids = choose_vocabulary(answers, recipe.vocab - 1, always=[tokenizer.eos_token_id], then=prompts)
        vocab_path.write_text(json.dumps(ids) + "\n")
    vocab = VocabMap(json.loads(vocab_path.read_text()), int(target.config.vocab_size))
    coverage = sum(int(vocab.to_draft[t]) != vocab.other for a in answers for t in a) / max(1, sum(map(len, answers)))
    log.info("vocabulary of %d tokens covers %.4f of the answers' tokens", vocab.other, coverage)
    held = held_layers(signal)
    made = []
    for name, domains in [("generalist", DOMAINS), *[(d, (d,)) for d in SPECIALIST_DOMAINS]]:
        model_dir = out / "models" / name
        if only and name not in only:
            continue
        if not (model_dir / "model.safetensors").exists():
            model: Any
            if name == "generalist":
                model = new_drafter(recipe, target, vocab, seed=1)
                config = recipe.generalist
            else:
                model = AutoModelForCausalLM.from_pretrained(str(out / "models" / "generalist"), dtype=torch.float32)
                config = recipe.specialist
            rows = SignalRows(signal_chunks(signal, recipe.sources, domains), config.seq_len, held, (),
                              responses_only=True)
            meta = train_drafter_on_signal(model, rows, vocab, config, seed=2, checkpoint=out / f"{name}.ckpt",
                                           label=name)
            meta.update(domains=list(domains), vocabulary_coverage=round(coverage, 4))
            save_drafter(model, vocab, model_dir, meta)
        made.append(name)
    if not only or EAGLE in only:
        rows = SignalRows(signal_chunks(signal, head.sources, DOMAINS), head.train.seq_len, held,
                          (*head.feature_layers, -1))
        if not (out / "models" / EAGLE / "model.safetensors").exists():
            train_signal_head(target, target_name, rows, vocab, out / EAGLE, out / "models" / EAGLE, head, DOMAINS)
        made.append(EAGLE)
    if install:
        install_drafters(target_name, int(target.config.vocab_size), out / "models", made)
    return made


def install_drafters(target_name: str, target_vocab: int, models: Path, names: Sequence[str],
                     dest: Path | None = None) -> None:
    """Copy distilled drafters into the zoo as ``TARGET-NAME`` with manifest entries that say whose they are."""
    dest = dest or shipped_models_dir()
    manifest = json.loads((dest / MANIFEST).read_text())
    entries = {e["name"]: e for e in manifest["models"]}
    for name in names:
        zoo_name = f"{target_name}-{name}"
        meta = json.loads((models / name / "training.json").read_text())
        if (dest / zoo_name).exists():
            shutil.rmtree(dest / zoo_name)
        shutil.copytree(models / name, dest / zoo_name)
        role = {"role": "head", "kind": meta["kind"]} if "kind" in meta else {"role": "drafter"}
        entries[zoo_name] = {"name": zoo_name, **role, "domains": meta["domains"],
                             "params": meta["params"], "target": target_name, "target_vocab": target_vocab}
    manifest["models"] = list(entries.values())
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
