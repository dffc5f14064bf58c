"""What several benchmark scripts share, so that they time, load and count alike: the command line
and prompts of the zoo-split benchmarks, the target they load, a round's measured cost by draft
length, the rotating order of interleaved runs, and a distill build's dev prompts with the target's
greedy answers to them.

Scripts import it as a sibling (``from common import ...``): run from the repository root, a
script's own folder is first on the import path. Nothing here imports torch or vLLM at load time,
so the vLLM scripts import it from their own environment as well.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ANSWER_TOKENS = 96  # the target's greedy answer per dev prompt in the acceptance replays
DRAFT_LENGTH = 5  # greedy draft length of the acceptance replays (docs/zoo.md's tables)


def dev_set_parser(doc: str | None, per_domain: int, threads: int = 1,
                   temperature: float | None = None) -> argparse.ArgumentParser:
    """A parser with ``--per-domain``, ``--zoo-corpus``, ``--threads``, ``--target``, ``--numerics``,
    ``--split``, ``--prompt-file`` and, given its default, ``--temperature``; scripts add their own
    options."""
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
    import torch
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


def cost_of(costs: dict[int, float], drafted: int) -> float:
    """The measured cost of drafting ``drafted`` tokens, or of the nearest longer draft measured.

    >>> cost_of({0: 1.0, 2: 1.5, 8: 3.0}, 3)
    3.0
    """
    known = sorted(costs)
    return costs[next((k for k in known if k >= drafted), known[-1])]


def rotated(methods: list[Any], turn: int) -> list[Any]:
    """The order the methods run in at this turn (a chunk, a repeat): rotated by one each turn, so
    that no method always goes first and a drifting machine slows them alike.

    >>> rotated(["none", "ngram:4", "draftwise"], 1)
    ['ngram:4', 'draftwise', 'none']
    """
    turn = turn % len(methods)
    return methods[turn:] + methods[:turn]


def dev_answers(plain: Any, build: str | Path, per_domain: int, folder: Path,
                ) -> dict[str, tuple[list[Any], list[list[int]], list[list[int]]]]:
    """Per domain of a distill build's dev split: its first ``per_domain`` examples, their prompts
    in the target's chat template, and ``plain``'s greedy answers to them (``ANSWER_TOKENS`` each),
    kept in ``folder`` as ``continuations-DOMAIN.json`` so that later runs score the same answers."""
    from draftwise.training.corpus import DOMAINS, read_split
    from draftwise.training.labels import chat_prompt_ids

    out = {}
    for domain in DOMAINS:
        examples = read_split(Path(build) / "corpus" / "dev" / f"{domain}.jsonl")[:per_domain]
        prompts = [chat_prompt_ids(plain.tokenizer, e.instruction) for e in examples]
        out[domain] = (examples, prompts, continuations(plain, prompts, folder / f"continuations-{domain}.json"))
    return out


def continuations(plain: Any, prompts: list[list[int]], cache: Path) -> list[list[int]]:
    """The target's greedy answers to ``prompts``, kept in ``cache`` with the prompts they answer (a
    cache of more prompts serves its first ones)."""
    from draftwise.training.labels import greedy_answers

    if cache.exists() and (kept := json.loads(cache.read_text()))["prompts"][: len(prompts)] == prompts:
        return kept["answers"][: len(prompts)]
    out = greedy_answers(plain, prompts, ANSWER_TOKENS)
    cache.write_text(json.dumps({"prompts": prompts, "answers": out}))
    return out
