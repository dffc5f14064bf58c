"""Prompt sets for ``draftwise bench``: JSONL files in three shapes, or a named set.

Accepted line shapes (one JSON object per line; the shape is detected per line):

* plain — ``{"prompt": "...", "domain": "code"}`` (``domain`` optional, default ``"all"``;
  an ``id`` field is kept when present);
* Spec-Bench / MT-Bench — ``{"question_id": 81, "category": "writing", "turns": ["...", "..."]}``:
  the category becomes the domain; the first turn is the prompt unless ``turns="all"``, which
  makes one prompt per turn, each carrying the earlier turns as context;
* Self-Instruct seed tasks — ``{"id": "seed_task_0", "instruction": "...", "instances":
  [{"input": "", "output": "..."}], ...}``: the instruction, plus a blank line and the first
  instance's input when that is non-empty; domain ``self_instruct``.

Named sets (:data:`PROMPT_SETS`) stand for prompts that live outside the repository:
``self_instruct`` (the 175 Self-Instruct seed tasks in the shared datasets folder: everyday
instructions unlike the zoo's training domains, an out-of-domain check) and ``zoo:dev`` /
``zoo:test`` (the zoo corpus's held-out splits: dev for tuning, test for reporting).

Every prompt gets a stable id (``FILE:LINE``, ``FILE:ID``, ``FILE:QUESTION_ID[#TURN]`` or
``zoo-SPLIT:DOMAIN:INDEX``) so that results can be resumed and joined across methods.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.registry import Registry
from draftwise.zoo.load import read_manifest, shipped_models_dir

log = logging.getLogger(__name__)

DEFAULT_DOMAIN = "all"
TURN_CHOICES = ("first", "all")
CORPUS_ENV = "DRAFTWISE_ZOO_CORPUS"  # a zoo corpus folder (dev/DOMAIN.jsonl) or a zoo build folder
SHAPES_HELP = ("each line must be one JSON object: {\"prompt\": ..., \"domain\": ...}, Spec-Bench/MT-Bench "
               "{\"question_id\": ..., \"category\": ..., \"turns\": [...]} or a Self-Instruct seed task "
               "{\"id\": ..., \"instruction\": ..., \"instances\": [{\"input\": ..., \"output\": ...}]}")
SELF_INSTRUCT_DOMAIN = "self_instruct"
SELF_INSTRUCT_FILE = Path("self_instruct") / "seed_tasks.jsonl"  # inside the shared datasets folder
ZOO_PER_DOMAIN = 8  # prompts sampled per domain from a zoo split when --per-domain is not given


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    domain: str


@dataclass(frozen=True)
class Shape:
    """One line shape: the fields that identify it, and how an object of that shape becomes prompts."""

    keys: tuple[str, ...]  # every one present ⇒ this shape
    build: Callable[[dict, str, str], list[Prompt]]  # object, turns mode, id stem (FILE:LINE) → prompts

    def matches(self, obj: dict) -> bool:
        return all(key in obj for key in self.keys)


SHAPES: Registry[Shape] = Registry("prompt line shape")


def _record_id(stem: str, record_id: Any) -> str:
    """``FILE:ID`` from the line's stem ``FILE:LINE``: an id that survives edits elsewhere in the file."""
    return f"{stem.rsplit(':', 1)[0]}:{record_id}"


def _plain(obj: dict, turns: str, stem: str) -> list[Prompt]:
    text = obj["prompt"]
    if not isinstance(text, str) or not text.strip():
        raise ValueError("'prompt' must be a non-empty string")
    pid = _record_id(stem, obj["id"]) if "id" in obj else stem
    return [Prompt(pid, text, str(obj.get("domain") or DEFAULT_DOMAIN))]


def _mt_bench(obj: dict, turns: str, stem: str) -> list[Prompt]:
    all_turns = obj["turns"]
    if not isinstance(all_turns, list) or not all_turns or not all(isinstance(t, str) and t.strip() for t in all_turns):
        raise ValueError("'turns' must be a non-empty list of non-empty strings")
    domain = str(obj.get("category") or DEFAULT_DOMAIN)
    base = _record_id(stem, obj.get("question_id", stem.rsplit(":", 1)[-1]))
    if turns == "first":
        return [Prompt(base, all_turns[0], domain)]
    # Later turns carry the earlier ones as context (the model's own answers are not part of a
    # prompt file, and under greedy decoding they would be identical for every method anyway).
    return [Prompt(f"{base}#{i + 1}", "\n\n".join(all_turns[: i + 1]), domain) for i in range(len(all_turns))]


def _self_instruct(obj: dict, turns: str, stem: str) -> list[Prompt]:
    """A seed task as its authors prompt it: the instruction, then the first instance's input (the
    text the instruction is about: a passage to rewrite, pairs to relate) when it has one."""
    instruction, instances = obj["instruction"], obj["instances"]
    if not isinstance(instruction, str) or not instruction.strip():
        raise ValueError("'instruction' must be a non-empty string")
    if not isinstance(instances, list) or not all(isinstance(i, dict) for i in instances):
        raise ValueError("'instances' must be a list of {\"input\": ..., \"output\": ...} objects")
    given = instances[0].get("input") if instances else None
    if given is not None and not isinstance(given, str):
        raise ValueError("'instances[0].input' must be a string")
    text = f"{instruction}\n\n{given}" if given and given.strip() else instruction
    pid = _record_id(stem, obj["id"]) if "id" in obj else stem
    return [Prompt(pid, text, SELF_INSTRUCT_DOMAIN)]


SHAPES.register("plain")(Shape(("prompt",), _plain))
SHAPES.register("mt-bench")(Shape(("turns",), _mt_bench))
SHAPES.register("self-instruct")(Shape(("instruction", "instances"), _self_instruct))


def parse_line(line: str, turns: str, stem: str) -> list[Prompt]:
    """Prompts of one JSONL line; raises ``ValueError`` with what was wrong."""
    obj: Any = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    for _name, shape in SHAPES.items():
        if shape.matches(obj):
            return shape.build(obj, turns, stem)
    *others, last = [" + ".join(f"'{key}'" for key in shape.keys) for _name, shape in SHAPES.items()]
    wanted = f"{', '.join(others)} or {last}" if others else last
    raise ValueError(f"no {wanted} field (keys: {', '.join(sorted(obj)) or 'none'})")


def load_prompt_file(path: str | Path, turns: str = "first") -> list[Prompt]:
    """Every prompt of one JSONL file; a bad line raises with its file name and line number."""
    if turns not in TURN_CHOICES:
        raise DraftwiseError(f"turns must be one of {', '.join(TURN_CHOICES)}, got {turns!r}")
    path = Path(path)
    if not path.is_file():
        raise DraftwiseError(f"prompt file {path} not found (expected a JSONL file; {SHAPES_HELP})")
    prompts: list[Prompt] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                prompts.extend(parse_line(line, turns, f"{path.name}:{number}"))
            except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
                raise DraftwiseError(f"{path}, line {number}: {exc}; {SHAPES_HELP}") from None
    if not prompts:
        raise DraftwiseError(f"prompt file {path} holds no prompts; {SHAPES_HELP}")
    return prompts


def load_prompt_files(paths: Sequence[str | Path], turns: str = "first") -> list[Prompt]:
    prompts = [p for path in paths for p in load_prompt_file(path, turns)]
    return unique_ids(prompts)


def unique_ids(prompts: list[Prompt]) -> list[Prompt]:
    """Suffix repeated ids (the same file given twice) so every row key stays unique."""
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        n = seen.get(p.id, 0)
        seen[p.id] = n + 1
        out.append(p if n == 0 else Prompt(f"{p.id}~{n + 1}", p.text, p.domain))
    return out


def limit_per_domain(prompts: list[Prompt], per_domain: int | None) -> list[Prompt]:
    """Keep the first ``per_domain`` prompts of each domain (file order)."""
    if per_domain is None:
        return prompts
    counts: dict[str, int] = {}
    kept = []
    for p in prompts:
        if counts.get(p.domain, 0) < per_domain:
            counts[p.domain] = counts.get(p.domain, 0) + 1
            kept.append(p)
    return kept


# ----------------------------------------------------------------------------- built-in dev set


def zoo_corpus_candidates(explicit: str | Path | None = None) -> list[Path]:
    """Where the zoo's held-out splits may live, in the order they are tried.

    Adapter: the zoo ships its models, and its corpus lives in the build folder
    (``BUILD/corpus/{dev,test}/DOMAIN.jsonl``); a corpus shipped next to the models is used
    when the zoo starts shipping one.
    """
    candidates: list[Path] = []
    for value in (explicit, os.environ.get(CORPUS_ENV)):
        if value:
            candidates += [Path(value), Path(value) / "corpus"]
    models = shipped_models_dir()
    return candidates + [models / "corpus", models.parent / "corpus"]


DATA_ENV = "DRAFTWISE_DATA"  # the shared datasets folder (code_alpaca, spider, gsm8k, …) the zoo is built from
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "draftwise" / "zoo-corpus"


def project_root() -> Path | None:
    """The source checkout this package runs from (the folder holding ``pyproject.toml`` above
    ``src/draftwise``), or None for an installed copy (site-packages has no such folder)."""
    package = Path(__file__).resolve().parents[1]  # …/src/draftwise
    root = package.parent.parent
    return root if package.parent.name == "src" and (root / "pyproject.toml").is_file() else None


def default_data_dir() -> tuple[Path | None, str]:
    """Where the shared datasets are when ``--data`` is not given, and how that was decided:
    ``$DRAFTWISE_DATA``, else ``../shared/data`` beside the source checkout (the repository's
    layout) — never relative to the working directory, which would change with ``cd``."""
    value = os.environ.get(DATA_ENV)
    if value:
        return Path(value), f"${DATA_ENV}"
    root = project_root()
    if root is None:
        return None, "no default outside a source checkout"
    return root.parent / "shared" / "data", f"the default ../shared/data beside the checkout {root}"


def resolve_data_dir(explicit: str | Path | None = None, option: str = "--data") -> Path:
    """The shared datasets folder: ``explicit``, else :func:`default_data_dir`; it must exist."""
    folder: Path | None
    if explicit:
        folder, origin = Path(explicit), option
    else:
        folder, origin = default_data_dir()
    if folder is None:
        raise DraftwiseError(f"no data folder: pass {option} DIR or set ${DATA_ENV} to the shared datasets folder "
                             f"({origin})")
    if not folder.is_dir():
        raise DraftwiseError(f"data folder {folder} ({origin}) does not exist; pass {option} DIR or set ${DATA_ENV} "
                             "to the shared datasets folder")
    return folder


def regenerate_zoo_corpus(data: Path | None = None, cache: Path = CACHE_DIR) -> Path | None:
    """Rebuild the shipped zoo's held-out splits from the datasets, deterministically, into a cache.

    The splits are dataset text, so they are never committed: the zoo's manifest records its
    build budget and seed, and the corpus builder reproduces the same dev/test/train examples.
    ``data``: the shared datasets folder (default: :func:`default_data_dir`). None when the zoo
    or the datasets are absent.
    """
    try:
        # the build budgets import the training loops (torch, transformers: seconds); this module builds the
        # command line's parser, and only a corpus rebuild needs them
        from draftwise.training.budgets import BUDGETS
        from draftwise.training.corpus import build_corpus, write_corpus

        budget_name = read_manifest()["build"]["budget"]["name"]
        budget = BUDGETS.get(budget_name)
    except (ImportError, KeyError, DraftwiseError):
        return None
    data = data or default_data_dir()[0]
    if data is None or not data.is_dir():
        return None
    folder = cache / f"{budget_name}-{budget.seed}"
    if not (folder / "DONE").exists():
        log.warning("regenerating the zoo's held-out splits from %s into %s (once)", data, folder)
        corpus = build_corpus(data, budget.limits, budget.n_dev, budget.n_test, seed=budget.seed)
        write_corpus(corpus, folder)
        (folder / "DONE").write_text("ok\n")
    return folder


def has_split(folder: Path, split: str) -> bool:
    return (folder / split).is_dir() and any((folder / split).glob("*.jsonl"))


def locate_zoo_corpus(explicit: str | Path | None = None, split: str = "dev") -> Path | None:
    """The first zoo corpus folder holding ``split``: explicit / $DRAFTWISE_ZOO_CORPUS, one shipped
    beside the models, else (nothing explicit) one regenerated from the shared datasets; or None."""
    for folder in zoo_corpus_candidates(explicit):
        if has_split(folder, split):
            return folder
    if not explicit and (rebuilt := regenerate_zoo_corpus()) is not None and has_split(rebuilt, split):
        return rebuilt
    return None


def find_zoo_corpus(explicit: str | Path | None = None, split: str = "dev") -> Path:
    """:func:`locate_zoo_corpus`, or one clear error saying where the held-out prompts can come from."""
    folder = locate_zoo_corpus(explicit, split)
    if folder is not None:
        return folder
    if explicit:
        raise DraftwiseError(f"no zoo corpus at {explicit}: expected {split}/DOMAIN.jsonl there or under corpus/")
    raise DraftwiseError(
        "no prompts: pass --data FILE, or point --zoo-corpus (or $" + CORPUS_ENV + ") at a zoo build folder "
        "or its corpus folder (it holds the held-out dev/test splits per domain), or set $" + DATA_ENV + " to the "
        "shared datasets folder to rebuild them"
    )


def read_split_examples(folder: Path, split: str, kind: str) -> dict[str, list[dict]]:
    """Examples of one split, per domain (file stem), as dicts with ``instruction``."""
    out: dict[str, list[dict]] = {}
    for path in sorted((folder / split).glob("*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            rows = []
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError as exc:
                        raise DraftwiseError(f"{path}, line {number}: {exc} ({kind} split of the zoo corpus)") from None
        out[path.stem] = rows
    return out


def zoo_prompts(folder: Path, split: str, per_domain: int | None, seed: int) -> list[Prompt]:
    """Held-out prompts per domain, sampled with ``seed`` (recorded in env.json)."""
    rng = np.random.default_rng(seed)
    prompts: list[Prompt] = []
    for domain, rows in read_split_examples(folder, split, split).items():
        order = rng.permutation(len(rows)) if per_domain is not None and per_domain < len(rows) else range(len(rows))
        chosen = sorted(order[:per_domain]) if per_domain is not None else list(order)
        prompts += [Prompt(f"zoo-{split}:{domain}:{i}", rows[i]["instruction"], domain) for i in chosen]
    if not prompts:
        raise DraftwiseError(f"the zoo corpus at {folder} has an empty {split} split")
    return prompts


def zoo_training_texts(folder: Path, per_domain: int, seed: int) -> tuple[list[str], list[str]]:
    """Training instructions and their domains (the router's training set), capped per domain."""
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    labels: list[str] = []
    for domain, rows in read_split_examples(folder, "train", "train").items():
        take = rng.permutation(len(rows))[:per_domain]
        texts += [rows[i]["instruction"] for i in sorted(take)]
        labels += [domain] * len(take)
    return texts, labels


# ----------------------------------------------------------------------------- named prompt sets


@dataclass(frozen=True)
class PromptRequest:
    """The bench options a prompt source reads: one object, so every source takes the same argument."""

    turns: str = "first"
    per_domain: int | None = None  # None: every prompt of a file, ZOO_PER_DOMAIN of a zoo split
    zoo_corpus: str | None = None
    seed: int = 0  # samples the zoo splits


PromptSet = Callable[[PromptRequest], list[Prompt]]
PROMPT_SETS: Registry[PromptSet] = Registry("prompt set")


@PROMPT_SETS.register("self_instruct")
def self_instruct_prompts(request: PromptRequest) -> list[Prompt]:
    """The Self-Instruct seed tasks from the shared datasets folder; never copied into the repository
    (and never used to train the zoo, so that they stay a fair out-of-domain check)."""
    folder, origin = default_data_dir()  # bench has no option for the folder: its --data names prompts
    path = folder / SELF_INSTRUCT_FILE if folder is not None else None
    if path is None or not path.is_file():
        where = f"{path} not found" if path is not None else "no shared datasets folder"
        raise DraftwiseError(f"prompt set self_instruct: {where} ({origin}); set ${DATA_ENV} to the shared datasets "
                             f"folder (it holds {SELF_INSTRUCT_FILE}), or pass the file itself as --data FILE")
    return limit_per_domain(load_prompt_file(path, request.turns), request.per_domain)


def zoo_split_set(split: str) -> PromptSet:
    """``zoo:SPLIT``: ``per_domain`` prompts per domain of the zoo corpus's held-out split, sampled with ``seed``."""

    def load(request: PromptRequest) -> list[Prompt]:
        folder = find_zoo_corpus(request.zoo_corpus, split)
        return zoo_prompts(folder, split, request.per_domain or ZOO_PER_DOMAIN, request.seed)

    load.__doc__ = f"The zoo corpus's held-out {split} split."
    return load


for _split in ("dev", "test"):
    PROMPT_SETS.register(f"zoo:{_split}")(zoo_split_set(_split))

DEFAULT_PROMPT_SET = "zoo:dev"  # tuning happens on dev; test and self_instruct are for reporting


def looks_like_path(spec: str) -> bool:
    """A spec naming a file (a folder part or an extension) rather than a set: its error is 'not found'."""
    return Path(spec).suffix != "" or os.sep in spec or "/" in spec


def load_prompt_source(spec: str, request: PromptRequest) -> list[Prompt]:
    """One ``--data`` value: a named set, else a JSONL file (first ``per_domain`` prompts per domain).

    A name wins over a file of the same name in the working directory; write ``./NAME`` for the file.
    """
    if spec in PROMPT_SETS:
        return PROMPT_SETS.get(spec)(request)
    if not Path(spec).is_file() and not looks_like_path(spec):
        raise DraftwiseError(f"--data {spec}: no such prompt set or file; named sets: {', '.join(PROMPT_SETS)}, "
                             f"or a JSONL file ({SHAPES_HELP})")
    return limit_per_domain(load_prompt_file(spec, request.turns), request.per_domain)


def load_prompt_sources(specs: Sequence[str], request: PromptRequest) -> list[Prompt]:
    """Every ``--data`` value in order (default: the zoo's dev split), ``per_domain`` applied to each
    source on its own (so ``zoo:dev`` and ``zoo:test`` together keep both), ids made unique."""
    return unique_ids([p for spec in specs or (DEFAULT_PROMPT_SET,) for p in load_prompt_source(spec, request)])
