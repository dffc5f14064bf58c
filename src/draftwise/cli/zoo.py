"""``draftwise zoo``: list, build, evaluate and install the embedded model zoo."""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from draftwise.bench.datasets import resolve_data_dir
from draftwise.errors import DraftwiseError
from draftwise.models.named_models import NAMED_MODELS
from draftwise.registry import Registry
from draftwise.request import check_seed
from draftwise.zoo.load import zoo_entries

if TYPE_CHECKING:
    from draftwise.training.distill_eagle import SignalHeadRecipe

Action = Callable[[argparse.Namespace], int]
ACTIONS: Registry[Action] = Registry("zoo command")


def action(name: str) -> Callable[[Action], Action]:
    return ACTIONS.register(name)


@action("list")
def list_action(args: argparse.Namespace) -> int:
    entries = zoo_entries(Path(args.models) if args.models else None)
    if args.json:
        print(json.dumps([e.__dict__ for e in entries], indent=2))
        return 0
    width = max([4, *(len(e.name) for e in entries)])  # the name column fits the longest name
    print(f"{'name':<{width}} {'role':<8} {'for target':<11} {'domains':<48} {'params':>9} {'size':>9}")
    for e in entries:
        print(f"{e.name:<{width}} {e.role:<8} {e.target:<11} {','.join(e.domains):<48} "
              f"{e.params / 1e6:>8.2f}M {e.bytes / 1e6:>7.1f}MB")
    return 0


def add_log_file(path: str | None) -> None:
    if not path:
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("draftwise").addHandler(handler)
    logging.getLogger("draftwise").setLevel(logging.INFO)


@action("build")
def build_action(args: argparse.Namespace) -> int:
    # training and the models load torch and transformers (seconds): only the subcommand that runs them
    from draftwise.training.build import run_build

    add_log_file(args.log)
    models = run_build(
        data_dir(args), Path(args.out), args.budget, until=args.until, progress=not args.quiet, threads=args.threads
    )
    print(f"zoo built under {models}")
    return 0


@action("install")
def install_action(args: argparse.Namespace) -> int:
    # training and the models load torch and transformers (seconds): only the subcommand that runs them
    from draftwise.training.install import install_zoo

    installed = install_zoo(Path(args.build), Path(args.to) if args.to else None)
    print(f"zoo installed into {installed}")
    return 0


@action("eval")
def eval_action(args: argparse.Namespace) -> int:
    # training and the models load torch and transformers (seconds): only the subcommand that runs them
    from draftwise.training.evaluate import evaluate_zoo, format_table

    add_log_file(args.log)
    result = evaluate_zoo(
        Path(args.build), split=args.split, n_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
        draft_length=args.draft_length, models=Path(args.models) if args.models else None, progress=not args.quiet,
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    print(format_table(result))
    return 0


@action("heads")
def heads_action(args: argparse.Namespace) -> int:
    # training and the models load torch and transformers (seconds): only the subcommand that runs them
    from draftwise.models.loading import LoadOptions, load_causal_lm
    from draftwise.training.heads import HEADS_BUDGETS, corpus_streams, install_heads, run_heads

    add_log_file(args.log)
    budget = HEADS_BUDGETS.get(args.budget)
    data = data_dir(args)  # before loading anything: a missing folder is one clear error now
    target, tokenizer = load_causal_lm(args.target, LoadOptions())
    if tokenizer is None:
        raise DraftwiseError(f"zoo heads: target {args.target!r} has no tokenizer to encode the corpus")
    heads = run_heads(target, args.target, lambda: corpus_streams(data, tokenizer, budget.corpus_budget),
                      Path(args.out), budget.name, progress=not args.quiet, threads=args.threads)
    print(f"heads trained under {heads}")
    if args.install:
        entries = install_heads(heads, Path(args.models) if args.models else None)
        print(f"installed {', '.join(e['name'] for e in entries)}")
    return 0


MODEL_NAMES = f"{', '.join(NAMED_MODELS)}, zoo:NAME (draftwise zoo list) or a .gguf file"  # what `zoo path` takes


@action("path")
def path_action(args: argparse.Namespace) -> int:
    # training and the models load torch and transformers (seconds): only the subcommand that runs them
    from draftwise.models.loading import resolve_model_path

    if not args.name.strip():  # an empty path is the current folder to pathlib: it would pass for a model
        raise DraftwiseError(f"the model name is empty; valid: {MODEL_NAMES}")
    folder = resolve_model_path(args.name)  # a named model is fetched first when it is not cached
    if not Path(folder).is_dir():
        raise DraftwiseError(f"no local model {args.name!r}; valid: {MODEL_NAMES}")
    print(folder)
    return 0


def head_recipe(args: argparse.Namespace) -> SignalHeadRecipe:
    """The EAGLE head's recipe with the command line's start, steps and learning rate."""
    from draftwise.training.distill_eagle import SignalHeadRecipe

    recipe = SignalHeadRecipe(start=args.start_head or "")
    if args.head_steps is not None and args.head_steps < 1:
        raise DraftwiseError(f"--head-steps must be ≥ 1, got {args.head_steps}")
    if args.head_lr is not None and not (math.isfinite(args.head_lr) and args.head_lr > 0):
        raise DraftwiseError(f"--head-lr must be a finite number > 0, got {args.head_lr}")
    train = replace(recipe.train, steps=args.head_steps or recipe.train.steps, lr=args.head_lr or recipe.train.lr)
    return replace(recipe, train=train)


@action("distill")
def distill_action(args: argparse.Namespace) -> int:
    # training and the models load torch and transformers (seconds): only the subcommand that runs them
    from draftwise.training.distill import check_drafters, run_distill
    from draftwise.training.labels import LabelPlan

    # everything typed is checked before anything is written (the log file, the corpus) or loaded
    only = check_drafters([name.strip() for name in args.only.split(",")], "--only") if args.only else ()
    head = head_recipe(args)
    data = data_dir(args)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    add_log_file(args.log)
    plan = LabelPlan(per_domain=args.per_domain, batch_size=args.batch)
    made = run_distill(args.target, data, Path(args.out), plan=plan, head=head,
                       labels=Path(args.labels) if args.labels else None,
                       signal=Path(args.signal) if args.signal else None, signal_tokens=args.signal_tokens,
                       until=args.until or "", install=args.install, only=only)
    print(f"drafters for {args.target} under {Path(args.out) / 'models'}: {', '.join(made) or 'labels only'}")
    return 0


@action("router")
def router_action(args: argparse.Namespace) -> int:
    # training and the models load torch and transformers (seconds): only the subcommand that runs them
    from draftwise.bench.router_training import build_router_file

    seed = check_seed(args.seed, "--seed")
    path, info = build_router_file(args.data, args.zoo_corpus, seed, Path(args.out) if args.out else None)
    print(f"router written to {path}: {info['examples']} prompts, labels {', '.join(info['labels'])}, "
          f"train accuracy {info['train_accuracy']:.3f}, {info['features']} features")
    return 0


def data_dir(args: argparse.Namespace) -> Path:
    """--data, else $DRAFTWISE_DATA, else ../shared/data beside the source checkout (not the cwd)."""
    return resolve_data_dir(args.data)


DATA_HELP = "the shared datasets folder (default: $DRAFTWISE_DATA, else ../shared/data beside the source checkout)"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "zoo", help="the embedded model zoo: list, path, build, distill, eval, install, heads, router")
    sub = parser.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND", required=True)

    p = sub.add_parser("list", help="show zoo models: names, roles, domains, sizes")
    p.add_argument("--models", help="a models folder to list instead of the shipped zoo")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("build", help="build the zoo from the shared datasets (resumes if interrupted)")
    p.add_argument("--data", default=None, help=DATA_HELP)
    p.add_argument("--out", required=True, help="build folder (corpus, checkpoints, models)")
    p.add_argument("--budget", default="full", help="full or tiny (a quick test build)")
    p.add_argument("--until", help="stop after this stage (corpus, tokenizer, tokens, target, teacher, drafters)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--log", help="also append progress logs to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser("install", help="copy a build's models into the package (fp16 safetensors)")
    p.add_argument("--build", required=True, help="the build folder")
    p.add_argument("--to", help="destination (default: the package's zoo/models)")

    p = sub.add_parser("heads", help="train white-box heads (EAGLE, Medusa) on the zoo target (resumes if interrupted)")
    p.add_argument("--target", default="zoo:target", help="the target: zoo:target or its checkpoint folder")
    p.add_argument("--data", default=None, help=DATA_HELP + ", or a zoo build folder whose corpus to reuse")
    p.add_argument("--out", required=True, help="output folder (hidden states, checkpoints, heads)")
    p.add_argument("--budget", default="full", help="full (≈ 40 min on 2 cores) or tiny (a quick test run)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--install", action="store_true", help="then copy the heads into the zoo and its manifest")
    p.add_argument("--models", help="zoo folder to install into (default: the package's)")
    p.add_argument("--log", help="also append progress logs to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser("path", help="print a model's local folder (a named model such as smollm2 is fetched first)")
    p.add_argument("name", help="smollm2, zoo:NAME, or a .gguf file")

    p = sub.add_parser("distill", help="distill a drafter pool for a real target from its answers and its "
                       "reading of the train split (resumes if interrupted)")
    p.add_argument("--target", default="smollm2", help="the target (default smollm2)")
    p.add_argument("--data", default=None, help=DATA_HELP)
    p.add_argument("--out", required=True, help="build folder (corpus, labels, checkpoints, models)")
    p.add_argument("--labels", default=None, help="label folder (default: OUT/labels)")
    p.add_argument("--per-domain", type=int, default=400, help="training instructions answered per domain (400)")
    p.add_argument("--batch", type=int, default=32, help="answers generated together (32)")
    p.add_argument("--signal", default=None,
                   help="folder of the target's features and soft labels (default: OUT/signal; gigabytes)")
    p.add_argument("--signal-tokens", type=int, default=220_000,
                   help="tokens of each domain's train split the target reads (220000); it reads every answer")
    p.add_argument("--until", choices=("labels", "signal"), help="stop after this stage")
    p.add_argument("--start-head", metavar="HEAD",
                   help="start the EAGLE head from this trained head (a folder or zoo name, e.g. zoo:smollm2-eagle)")
    p.add_argument("--head-steps", type=int, default=None,
                   help="the head's training steps (default: the recipe's; a continued head may train longer)")
    p.add_argument("--head-lr", type=float, default=None, help="the head's peak learning rate (default: the recipe's)")
    p.add_argument("--only", help="train only these drafters, comma-separated (generalist, code, math, …, eagle)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--install", action="store_true", help="then copy the drafters into the package's zoo")
    p.add_argument("--log", help="also append progress logs to this file")

    p = sub.add_parser("router", help="train the bench's prompt router and ship it with the zoo (deterministic)",
                       description="Train the TF-IDF + logistic-regression router of `draftwise bench --methods "
                       "router` on the zoo corpus's train split (400 prompts per domain, rebuilt from the shared "
                       "datasets with the zoo build's budget and seed) and write it, with a record of how it was "
                       "built, to the package's zoo/models/router.npz. Same data and seed give the same file.")
    p.add_argument("--data", default=None, help=DATA_HELP)
    p.add_argument("--zoo-corpus", default=None, metavar="DIR",
                   help="train on this zoo build or corpus folder's train split instead of rebuilding it from --data")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt sample and the weights' init (default 0)")
    p.add_argument("--out", default=None, help="write here instead of the package's zoo/models/router.npz")

    p = sub.add_parser("eval", help="acceptance rate and MAT of every drafter on every domain's dev split")
    p.add_argument("--build", required=True, help="the build folder (for its held-out splits)")
    p.add_argument("--models", help="models folder (default: the shipped zoo)")
    p.add_argument("--split", default="dev", choices=("dev", "test"))
    p.add_argument("--prompts", type=int, default=24, help="prompts per domain")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--draft-length", type=int, default=5)
    p.add_argument("--json-out", help="write the full result (JSON) here")
    p.add_argument("--log", help="also append logs to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return ACTIONS.get(args.zoo_command)(args)
