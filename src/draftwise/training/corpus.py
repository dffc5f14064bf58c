"""The zoo's corpus: every source on disk turned into instruction → response examples, split.

Each *source* (a registered function) reads one dataset from ``../shared/data`` or from text
that every Python installation carries (the standard library's source and its pydoc topics),
and returns two lists: examples that may be trained on and a *held-out pool*. Held-out pools
come from the upstream dev/test files where a dataset has them, otherwise from a seeded,
hash-based carve-out (by document or database where examples would otherwise leak). A
domain's ``dev`` and ``test`` splits are drawn round-robin from its sources' held-out pools;
nothing in a held-out pool is ever trained on, and training examples whose instruction also
appears in a held-out pool are dropped.

Example (the chat format the tokenizer's template produces)::

    <|user|>
    Translate from English to German:
    The cat sat on the mat.
    <|assistant|>
    Die Katze saß auf der Matte.<|endoftext|>
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import logging
import os
import re
import sysconfig
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftwise.errors import DraftwiseError
from draftwise.registry import Registry
from draftwise.retrieval.corpora import open_text

log = logging.getLogger(__name__)

DOMAINS = ("code", "math", "sql", "translation", "summarization", "qa", "general")
"""Every domain; ``general`` is prose used for the target / generalist mix (no specialist)."""

SPECIALIST_DOMAINS = DOMAINS[:-1]


@dataclass(frozen=True)
class Example:
    domain: str
    source: str
    instruction: str
    response: str


@dataclass(frozen=True)
class SourceSplit:
    train: list[Example]
    heldout: list[Example]


@dataclass(frozen=True)
class Corpus:
    """Train examples per domain plus the held-out dev and test splits per domain."""

    train: dict[str, list[Example]]
    dev: dict[str, list[Example]]
    test: dict[str, list[Example]]


@dataclass(frozen=True)
class SourceLimits:
    """How much each source may contribute (the tiny budget caps everything)."""

    max_train: int | None = None  # per source; None = all
    max_stdlib_files: int | None = None  # Python files scanned for code / docstrings


SourceFn = Callable[[Path, SourceLimits], SourceSplit]
SOURCES: Registry[tuple[str, SourceFn]] = Registry("zoo corpus source")


def source(name: str, domain: str) -> Callable[[SourceFn], SourceFn]:
    def decorate(fn: SourceFn) -> SourceFn:
        SOURCES.register(name)((domain, fn))
        return fn

    return decorate


# ----------------------------------------------------------------------------- small helpers


def stable_fraction(key: str) -> float:
    """A number in [0, 1) fixed by ``key`` (sha256), for seed-free, order-free carve-outs."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:12], 16) / float(16**12)


def read_jsonl(path: Path) -> list[dict]:
    with open_text(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_json(path: Path) -> list[dict]:
    with open_text(path) as handle:
        return json.load(handle)


def read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as handle:
        return [line.rstrip("\r\n") for line in handle]


def need(path: Path) -> Path:
    if not path.exists():
        raise DraftwiseError(f"zoo corpus: missing data file {path} (is --data the shared/data folder?)")
    return path


def capped(items: list[Example], limit: int | None) -> list[Example]:
    return items if limit is None else items[:limit]


def clean(text: str) -> str:
    return text.replace("\r\n", "\n").strip()


# ----------------------------------------------------------------------------- sources


CALC_ANNOTATION = re.compile(r"<<[^<>]*>>")


def gsm8k_example(record: dict) -> Example:
    # "48/2 = <<48/2=24>>24" → "48/2 = 24": the calculator annotations are not prose
    answer = CALC_ANNOTATION.sub("", record["answer"])
    return Example("math", "gsm8k", clean(record["question"]), clean(answer))


@source("gsm8k", "math")
def gsm8k(data: Path, limits: SourceLimits) -> SourceSplit:
    train = [gsm8k_example(r) for r in read_jsonl(need(data / "gsm8k/train.jsonl.gz"))]
    heldout = [gsm8k_example(r) for r in read_jsonl(need(data / "gsm8k/test.jsonl.gz"))]
    return SourceSplit(capped(train, limits.max_train), heldout)


def code_alpaca_example(record: dict) -> Example:
    instruction = clean(record["instruction"])
    if clean(record.get("input", "")):
        instruction = f"{instruction}\n\n{clean(record['input'])}"
    return Example("code", "code_alpaca", instruction, clean(record["output"]))


@source("code_alpaca", "code")
def code_alpaca(data: Path, limits: SourceLimits) -> SourceSplit:
    records = read_json(need(data / "code_alpaca/code_alpaca_2k.json.gz"))
    records += read_json(need(data / "code_alpaca/new_codealpaca.json.gz"))
    examples = [code_alpaca_example(r) for r in records if clean(r.get("output", ""))]
    # 8% held out by a hash of the instruction, so duplicates land on the same side
    heldout = [e for e in examples if stable_fraction("code_alpaca:" + e.instruction) < 0.08]
    train = [e for e in examples if stable_fraction("code_alpaca:" + e.instruction) >= 0.08]
    return SourceSplit(capped(train, limits.max_train), heldout)


LANGUAGES = {"deu": "German", "fra": "French", "spa": "Spanish", "zho-CN": "Chinese"}


@source("ntrex128", "translation")
def ntrex128(data: Path, limits: SourceLimits) -> SourceSplit:
    folder = data / "ntrex128"
    english = read_lines(need(folder / "newstest2019-src.eng.txt"))
    documents = [line.split("\t")[-1].strip() for line in read_lines(need(folder / "DOCUMENT_IDS.tsv"))]
    documents = (documents + [""] * len(english))[: len(english)]
    train: list[Example] = []
    heldout: list[Example] = []
    for code, language in LANGUAGES.items():
        references = read_lines(need(folder / f"newstest2019-ref.{code}.txt"))
        for source_text, reference, document in zip(english, references, documents):
            if not source_text.strip() or not reference.strip():
                continue
            example = Example(
                "translation", "ntrex128", f"Translate from English to {language}:\n{clean(source_text)}",
                clean(reference),
            )
            # whole news documents are held out (15%), so no article leaks into training
            (heldout if stable_fraction("ntrex:" + document) < 0.15 else train).append(example)
    return SourceSplit(capped(train, limits.max_train), heldout)


def wikisql_example(record: dict) -> Example:
    instruction = f"Write an SQL query over the table TABLE for this question:\n{clean(record['question'])}"
    return Example("sql", "wikisql", instruction, clean(record["sql"]))


@source("wikisql", "sql")
def wikisql(data: Path, limits: SourceLimits) -> SourceSplit:
    train = [wikisql_example(r) for r in read_jsonl(need(data / "wikisql/train.jsonl.gz"))]
    heldout = [wikisql_example(r) for r in read_jsonl(need(data / "wikisql/dev.jsonl.gz"))]
    return SourceSplit(capped(train, limits.max_train), heldout)


def spider_schema(table: dict) -> str:
    columns: dict[int, list[str]] = {}
    for table_index, column in table["column_names_original"]:
        if table_index >= 0:
            columns.setdefault(table_index, []).append(column)
    return "\n".join(f"{name}({', '.join(columns.get(i, []))})" for i, name in enumerate(table["table_names_original"]))


@source("spider", "sql")
def spider(data: Path, limits: SourceLimits) -> SourceSplit:
    schemas = {t["db_id"]: spider_schema(t) for t in read_json(need(data / "spider/tables.json.gz"))}
    train: list[Example] = []
    heldout: list[Example] = []
    for record in read_json(need(data / "spider/dev.json.gz")):
        db_id = record["db_id"]
        instruction = (
            f"Database {db_id} has tables:\n{schemas.get(db_id, '')}\n"
            f"Write an SQL query for this question:\n{clean(record['question'])}"
        )
        example = Example("sql", "spider", instruction, clean(record["query"]))
        # whole databases are held out (30%), so schemas seen in dev/test are never trained on
        (heldout if stable_fraction("spider:" + db_id) < 0.30 else train).append(example)
    return SourceSplit(capped(train, limits.max_train), heldout)


def scitldr_example(record: dict) -> Example:
    abstract = " ".join(s.strip() for s in record["source"])
    return Example(
        "summarization", "scitldr", f"Summarize this abstract in one sentence:\n{abstract}", clean(record["target"][0])
    )


@source("scitldr", "summarization")
def scitldr(data: Path, limits: SourceLimits) -> SourceSplit:
    train = [scitldr_example(r) for r in read_jsonl(need(data / "scitldr/train.jsonl.gz")) if r["target"]]
    heldout = [
        scitldr_example(r)
        for name in ("dev", "test")
        for r in read_jsonl(need(data / f"scitldr/{name}.jsonl.gz"))
        if r["target"]
    ]
    return SourceSplit(capped(train, limits.max_train), heldout)


def dialogsum_example(record: dict) -> Example:
    summary = record.get("summary") or record.get("summary1", "")
    return Example(
        "summarization", "dialogsum", f"Summarize this dialogue:\n{clean(record['dialogue'])}", clean(summary)
    )


@source("dialogsum", "summarization")
def dialogsum(data: Path, limits: SourceLimits) -> SourceSplit:
    # upstream has no train split here: its dev file trains, its test file is held out
    train = [dialogsum_example(r) for r in read_jsonl(need(data / "dialogsum/dialogsum.dev.jsonl"))]
    heldout = [dialogsum_example(r) for r in read_jsonl(need(data / "dialogsum/dialogsum.test.jsonl"))]
    return SourceSplit(capped(train, limits.max_train), heldout)


def nq_example(record: dict) -> Example:
    question = clean(record["question"])
    question = question[:1].upper() + question[1:] + ("" if question.endswith("?") else "?")
    answer = clean(record["answer"][0])
    # a one-sentence answer (as a chat model gives) rather than a bare span of two or three tokens
    response = f"The answer is {answer}" + ("" if answer.endswith(".") else ".")
    return Example("qa", "nq_open", f"Answer the question in one sentence.\n{question}", response)


@source("nq_open", "qa")
def nq_open(data: Path, limits: SourceLimits) -> SourceSplit:
    train = [nq_example(r) for r in read_jsonl(need(data / "nq_open/NQ-open.dev.jsonl"))]
    heldout = [nq_example(r) for r in read_jsonl(need(data / "nq_open/NQ-open.efficientqa.dev.1.1.jsonl"))]
    return SourceSplit(capped(train, limits.max_train), heldout)


# --- text every Python installation carries: the standard library's source and pydoc topics

SKIPPED_STDLIB_PARTS = {
    "test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "__pycache__", "ensurepip",
}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(limit: int | None) -> list[Path]:
    files: list[Path] = []
    for folder, subfolders, names in os.walk(stdlib_root()):
        subfolders[:] = sorted(d for d in subfolders if d not in SKIPPED_STDLIB_PARTS)  # prune in place
        files.extend(Path(folder) / n for n in names if n.endswith(".py"))
    files.sort()
    return files if limit is None else files[:limit]


@functools.lru_cache(maxsize=4)
def parsed_stdlib(limit: int | None) -> tuple[tuple[str, str, ast.Module], ...]:
    """Every parseable stdlib module as (module name, source text, syntax tree); parsed once."""
    parsed: list[tuple[str, str, ast.Module]] = []
    for path in stdlib_files(limit):
        try:
            text = path.read_text(encoding="utf-8")
            parsed.append((module_name(path), text, ast.parse(text)))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
    return tuple(parsed)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(stdlib_root()).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def first_paragraph(docstring: str) -> str:
    return " ".join(docstring.strip().split("\n\n")[0].split())


def iter_functions(tree: ast.Module) -> Iterator[ast.FunctionDef]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in node.body if isinstance(n, ast.FunctionDef))


def function_example(module: str, text: str, node: ast.FunctionDef) -> Example | None:
    docstring = ast.get_docstring(node)
    if not docstring or node.name.startswith("_") or node.end_lineno is None:
        return None
    lines = text.splitlines()[node.lineno - 1 : node.end_lineno]  # whole lines: the def and its body
    body = textwrap.dedent("\n".join(lines))
    if len(body) > 1600:
        return None
    summary = first_paragraph(docstring)
    instruction = f"Write the Python function `{node.name}` (module {module}): {summary}"
    return Example("code", "python_stdlib", instruction, body.strip())


def docstring_example(module: str, node: ast.AST) -> Example | None:
    docstring = ast.get_docstring(node)  # type: ignore[arg-type]
    if not docstring or len(docstring) < 200 or len(docstring) > 2500:
        return None
    name = getattr(node, "name", None)
    subject = f"`{module}.{name}`" if name else f"the module `{module}`"
    return Example("general", "stdlib_docstrings", f"Explain what {subject} does.", clean(textwrap.dedent(docstring)))


def parse_stdlib(limit: int | None) -> Iterator[tuple[str, str, ast.Module]]:
    yield from parsed_stdlib(limit)


def carve(examples: list[Example], source_name: str, fraction: float) -> tuple[list[Example], list[Example]]:
    def is_held(e: Example) -> bool:
        return stable_fraction(f"{source_name}:{e.instruction}") < fraction

    return [e for e in examples if not is_held(e)], [e for e in examples if is_held(e)]


@source("python_stdlib", "code")
def python_stdlib(data: Path, limits: SourceLimits) -> SourceSplit:
    examples = [
        example
        for module, text, tree in parse_stdlib(limits.max_stdlib_files)
        for node in iter_functions(tree)
        if ast.get_docstring(node) and (example := function_example(module, text, node)) is not None
    ]
    train, heldout = carve(examples, "python_stdlib", 0.05)
    return SourceSplit(capped(train, limits.max_train), heldout)


@source("stdlib_docstrings", "general")
def stdlib_docstrings(data: Path, limits: SourceLimits) -> SourceSplit:
    examples: list[Example] = []
    for module, _text, tree in parse_stdlib(limits.max_stdlib_files):
        nodes: Iterable[ast.AST] = [tree, *(n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)))]
        examples.extend(e for n in nodes if (e := docstring_example(module, n)) is not None)
    train, heldout = carve(examples, "stdlib_docstrings", 0.05)
    return SourceSplit(capped(train, limits.max_train), heldout)


def pydoc_topics() -> dict[str, str]:
    path = stdlib_root() / "pydoc_data" / "topics.py"
    namespace: dict[str, object] = {}
    # the file is one literal assignment `topics = {...}`; evaluate the literal, run nothing
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "topics":
            namespace["topics"] = ast.literal_eval(node.value)
    topics = namespace.get("topics", {})
    if not isinstance(topics, dict):
        raise DraftwiseError("zoo corpus: the topics table is not a dict literal")
    return dict(topics)


def chunk_paragraphs(text: str, max_chars: int) -> list[str]:
    chunks: list[str] = []
    current = ""
    for paragraph in (p.strip() for p in text.split("\n\n") if p.strip()):
        if current and len(current) + len(paragraph) > max_chars:
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{paragraph}" if current else paragraph
    return chunks + ([current] if current else [])


@source("pydoc_topics", "general")
def pydoc_topics_source(data: Path, limits: SourceLimits) -> SourceSplit:
    examples = [
        Example("general", "pydoc_topics", f"Explain the Python topic \"{key}\" (part {i + 1}).", chunk)
        for key, text in sorted(pydoc_topics().items())
        for i, chunk in enumerate(chunk_paragraphs(text, 1500))
    ]
    train, heldout = carve(examples, "pydoc_topics", 0.08)
    return SourceSplit(capped(train, limits.max_train), heldout)


# ----------------------------------------------------------------------------- assembly


def round_robin(pools: Sequence[list[Example]]) -> list[Example]:
    merged: list[Example] = []
    for i in range(max((len(p) for p in pools), default=0)):
        merged.extend(pool[i] for pool in pools if i < len(pool))
    return merged


def shuffled(items: list[Example], rng: np.random.Generator) -> list[Example]:
    order = rng.permutation(len(items))
    return [items[i] for i in order]


def build_corpus(data: Path, limits: SourceLimits, n_dev: int, n_test: int, seed: int) -> Corpus:
    """Read every source, carve dev/test per domain, drop train examples that leak into them."""
    if not data.is_dir():
        raise DraftwiseError(f"zoo corpus: data folder {data} does not exist (pass --data ../shared/data)")
    rng = np.random.default_rng(seed)
    train: dict[str, list[Example]] = {d: [] for d in DOMAINS}
    pools: dict[str, list[list[Example]]] = {d: [] for d in DOMAINS}
    for name, (domain, fn) in SOURCES.items():
        split = fn(data, limits)
        log.info("source %s (%s): %d train, %d held out", name, domain, len(split.train), len(split.heldout))
        train[domain].extend(split.train)
        pools[domain].append(shuffled(split.heldout, rng))
    dev: dict[str, list[Example]] = {}
    test: dict[str, list[Example]] = {}
    for domain in DOMAINS:
        merged = round_robin(pools[domain])
        # a small pool is split half and half rather than leaving test empty
        n_domain_dev = min(n_dev, len(merged) // 2)
        dev[domain] = merged[:n_domain_dev]
        test[domain] = merged[n_domain_dev : n_domain_dev + min(n_test, len(merged) - n_domain_dev)]
        heldout_instructions = {e.instruction for e in merged}
        train[domain] = shuffled([e for e in train[domain] if e.instruction not in heldout_instructions], rng)
    return Corpus(train, dev, test)


def write_split(path: Path, examples: Sequence[Example]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for e in examples:
            handle.write(json.dumps(e.__dict__, ensure_ascii=False) + "\n")


def read_split(path: Path) -> list[Example]:
    if not path.exists():
        raise DraftwiseError(f"zoo corpus: split file {path} not found (run `draftwise zoo build` first)")
    with open(path, encoding="utf-8") as handle:
        return [Example(**json.loads(line)) for line in handle if line.strip()]


def write_corpus(corpus: Corpus, folder: Path) -> None:
    for split_name, split in (("train", corpus.train), ("dev", corpus.dev), ("test", corpus.test)):
        for domain, examples in split.items():
            write_split(folder / split_name / f"{domain}.jsonl", examples)


def read_corpus(folder: Path) -> Corpus:
    def load(split_name: str) -> dict[str, list[Example]]:
        return {d: read_split(folder / split_name / f"{d}.jsonl") for d in DOMAINS}

    return Corpus(load("train"), load("dev"), load("test"))


def corpus_text_sample(corpus: Corpus, max_chars_per_domain: int) -> Iterator[str]:
    """Training text for the tokenizer: instruction and response of train examples, capped per domain."""
    for domain in DOMAINS:
        used = 0
        for e in corpus.train[domain]:
            if used > max_chars_per_domain:
                break
            used += len(e.instruction) + len(e.response)
            yield e.instruction + "\n" + e.response


def describe(corpus: Corpus) -> dict[str, dict[str, int]]:
    return {
        d: {"train": len(corpus.train[d]), "dev": len(corpus.dev[d]), "test": len(corpus.test[d])} for d in DOMAINS
    }

