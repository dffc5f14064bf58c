"""The command line every zoo dev-set benchmark shares: how many prompts per domain, where the zoo
build (its dev split) is, how many torch threads; and the prompts themselves."""

from __future__ import annotations

import argparse
from typing import Any

import torch


def dev_set_parser(doc: str | None, per_domain: int, threads: int = 1,
                   temperature: float | None = None) -> argparse.ArgumentParser:
    """A parser with ``--per-domain``, ``--zoo-corpus``, ``--threads``, ``--prompt-file`` and, given
    its default, ``--temperature``; scripts add their own options."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-domain", type=int, default=per_domain)
    parser.add_argument("--zoo-corpus", default=None,
                        help="zoo build folder (its dev split); default: found as bench does")
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("--target", default="zoo:target",
                        help="the target: the toy zoo's (zoo:target), a named model (smollm2) or a folder")
    parser.add_argument("--numerics", default="auto",
                        help="how the target computes (docs/numerics.md; default: its own precision, token-exact)")
    parser.add_argument("--split", default="dev", choices=("dev", "test"),
                        help="the zoo split (dev: the tuning set; test: held out, an out-of-domain check)")
    parser.add_argument("--prompt-file", default=None, metavar="JSONL",
                        help="these prompts instead of the dev split (e.g. the out-of-domain check set "
                             "../shared/data/self_instruct/seed_tasks.jsonl; --per-domain still limits each domain)")
    if temperature is not None:
        parser.add_argument("--temperature", type=float, default=temperature,
                            help="sampling temperature, 0 for greedy (coupled sampling: one seed per prompt, "
                                 "the same text for every configuration)")
    return parser


def dev_prompts(args: argparse.Namespace, seed: int = 0) -> list[Any]:
    """Set the thread count, quiet transformers' progress bars, and sample the ``--split`` prompts
    (or read ``--prompt-file``'s, the first ``--per-domain`` of each domain)."""
    from transformers.utils import logging as hf_logging

    from draftwise.bench.datasets import find_zoo_corpus, limit_per_domain, load_prompt_file, zoo_prompts

    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    if args.prompt_file:
        return limit_per_domain(load_prompt_file(args.prompt_file), args.per_domain)
    return zoo_prompts(find_zoo_corpus(args.zoo_corpus), args.split, args.per_domain, seed)


def zoo_target(name: str = "zoo:target", numerics: str = "auto") -> tuple[Any, Any, Any]:
    """The target (the toy zoo's by default) in ``numerics``, its tokenizer and the load options the
    scripts build drafters with."""
    from draftwise.models.loading import LoadOptions, load_target

    options = LoadOptions(numerics=numerics)
    model, tokenizer, _ = load_target(name, options)
    return model, tokenizer, options


def answerable(model: Any, ids: list[list[int]], max_new: int) -> list[int]:
    """Indices of the prompts the target can continue for ``max_new`` tokens; the others are left
    out, and said so."""
    from draftwise.models.loading import context_limit

    limit = context_limit(model)
    if limit is None:
        return list(range(len(ids)))
    fits = [i for i, tokens in enumerate(ids) if len(tokens) + max_new <= limit]
    if len(fits) < len(ids):
        print(f"left out {len(ids) - len(fits)} prompt(s) longer than {limit - max_new} tokens")
    return fits
