"""``draftwise datastore``: build (and describe) the token datastore of the retrieval drafter ``rest``."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from draftwise.errors import DraftwiseError
from draftwise.retrieval.corpora import encode_documents, read_corpus
from draftwise.retrieval.datastore import Datastore

DEFAULT_TOKENIZER = "zoo:target"
DEFAULT_MAX_TOKENS = 10_000_000  # 80 MB on disk (int32 stream + int32 suffix array)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "datastore",
        help="build the datastore of the retrieval drafter (rest)",
        description="Build or describe a retrieval datastore: a corpus tokenized with the target's tokenizer, "
        "documents separated, indexed by a suffix array. Use it as a drafter with --drafter rest:store=DIR.",
    )
    actions = p.add_subparsers(dest="datastore_action", metavar="ACTION")
    build = actions.add_parser(
        "build",
        help="tokenize a corpus and index it",
        description="Tokenize a corpus and write DIR/tokens.npy, DIR/sa.npy and DIR/meta.json. The corpus is text "
        "(one document per line) or JSONL (.jsonl/.json: fields text, or prompt or instruction with response); "
        "gzip-compressed files (.gz) are read as well.",
    )
    build.add_argument("--corpus", required=True, metavar="FILE", help="the corpus file")
    build.add_argument("--out", required=True, metavar="DIR", help="the datastore folder (created)")
    build.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, metavar="PATH_OR_ZOO_NAME",
                       help=f"tokenizer folder, hub id or zoo name; must be the target's (default {DEFAULT_TOKENIZER})")
    build.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N",
                       help=f"index at most N corpus tokens (default {DEFAULT_MAX_TOKENS:,}: 8 bytes per token on "
                       "disk); when the corpus is larger, documents are taken in a seeded random order")
    build.add_argument("--format", default="auto", choices=("auto", "text", "jsonl"),
                       help="corpus format (default auto: by the file's extension)")
    build.add_argument("--seed", type=int, default=0, help="seed of the document order under --max-tokens (default 0)")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.set_defaults(func=run)
    info = actions.add_parser("info", help="describe a datastore", description="Print a datastore's meta.json.")
    info.add_argument("store", metavar="DIR", help="the datastore folder")
    info.set_defaults(func=run)
    p.set_defaults(func=run, datastore_parser=p)


def run(args: argparse.Namespace) -> int:
    if args.datastore_action == "build":
        return _build(args)
    if args.datastore_action == "info":
        store = Datastore.load(args.store)
        print(json.dumps({**store.meta, "bytes": store.nbytes}, indent=2))
        return 0
    args.datastore_parser.print_help()
    return 2


def load_tokenizer(name: str) -> Any:
    """The tokenizer of a model folder, hub id or ``zoo:NAME``."""
    # the engine loads torch and transformers (seconds): imported when the command runs, not for its parser
    from transformers import AutoTokenizer

    from draftwise.models.loading import resolve_model_path

    path = os.path.expanduser(resolve_model_path(name))
    if not os.path.isdir(path) and (os.path.exists(path) or path.count("/") != 1):
        raise DraftwiseError(f"tokenizer {name!r} does not exist (expected a model or tokenizer folder, "
                             "an org/name hub id or a zoo name)")
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise DraftwiseError(f"cannot load a tokenizer from {name!r}: {exc}") from None


def _build(args: argparse.Namespace) -> int:
    if args.max_tokens is not None and args.max_tokens < 1:
        raise DraftwiseError(f"--max-tokens must be ≥ 1, got {args.max_tokens}")
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise DraftwiseError(f"--out {args.out!r} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "meta.json").is_file():
        raise DraftwiseError(f"--out {args.out!r} exists and is not a datastore; choose an empty or new folder")
    start = time.perf_counter()
    texts = list(read_corpus(args.corpus, args.format))
    if not texts:
        raise DraftwiseError(f"corpus {args.corpus!r} holds no documents (only blank lines)")
    tokenizer = load_tokenizer(args.tokenizer)
    shuffled = False
    if args.max_tokens is not None and sum(map(len, texts)) > args.max_tokens:  # ≥ 1 character per token
        order = np.random.default_rng(args.seed).permutation(len(texts))  # the cap then samples the whole file
        texts, shuffled = [texts[i] for i in order], True

    def encode(batch: list[str]) -> list[list[int]]:
        return tokenizer(batch, add_special_tokens=False)["input_ids"]

    with tqdm(total=len(texts), desc="tokenize", unit="doc", disable=args.quiet) as bar:
        documents = encode_documents(texts, encode, args.max_tokens, on_batch=bar.update)
    tokenize_s = time.perf_counter() - start
    if not any(len(document) for document in documents):
        raise DraftwiseError(f"corpus {args.corpus!r} tokenizes to no tokens")
    meta = {
        "tokenizer": args.tokenizer,
        "tokenizer_class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "corpus": str(args.corpus),
        "corpus_documents": len(texts),
        "build": {"max_tokens": args.max_tokens, "format": args.format, "shuffled": shuffled,
                  "add_special_tokens": False},
        "seed": args.seed,
        "tokenize_s": round(tokenize_s, 3),
    }
    store = Datastore.from_documents(documents, meta)
    store.save(out)
    total_s = time.perf_counter() - start
    print(f"datastore {out}: {store.meta['tokens']:,} tokens ({store.meta['documents']:,} documents), "
          f"{store.nbytes / 1e6:.1f} MB; tokenize {tokenize_s:.1f} s, index {store.meta['index_s']:.1f} s, "
          f"total {total_s:.1f} s")
    print(f"use it with: --drafter rest:store={out}")
    return 0
