"""``draftwise generate``: one prompt, a pool of drafters, a policy; text and statistics out."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.models.defaults import DEFAULT_TARGET, default_drafters
from draftwise.models.numerics_modes import AUTO, NUMERICS_CHOICES, NUMERICS_HELP
from draftwise.request import Request, check_prompt_text, check_seed


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with speculative decoding",
        description="Generate text with a target model, speculative decoding with a pool of drafters, and a "
        "policy that picks a drafter each round. Output equals the target's own decoding (greedy: token for "
        "token; sampling: in distribution). Without --target, the real target SmolLM2-135M-Instruct (smollm2, "
        "fetched once into the local cache) is used with its zoo drafters plus pld and suffix.",
    )
    p.add_argument("prompt", nargs="?", help="the prompt text; read from stdin when omitted or '-'")
    add_model_options(p)
    p.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default; so is anything below 1e-5); > 0 samples")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None,
                   help="nucleus sampling mass in (0, 1] (the most likely token always stays)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop once this text appears (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    p.add_argument("--truncate", action="store_true",
                   help="shorten a prompt too long for the context: the start of its text is cut, the chat template "
                   "and the room for the answer are kept (a warning says how many tokens were cut)")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    p.add_argument("--trace", metavar="FILE", help="write the per-round trace as JSONL")
    p.set_defaults(func=run)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The options that load a :class:`~draftwise.api.Generator` (target, pool, policy, arms, device),
    shared by every command that serves one (``generate``, ``serve``)."""
    p.add_argument("--target", default=None,
                   help="target model: smollm2 (the default: SmolLM2-135M-Instruct, fetched once), a local "
                   "path, a .gguf file, a hub id, or zoo:target (the small embedded model for quick experiments)")
    p.add_argument("--drafter", action="append", default=None, metavar="SPEC",
                   help="a drafter (repeatable): model path or hub id, zoo:NAME, zoo:all, pld, suffix, with options "
                   "such as pld:max_ngram=4 (default with smollm2 or zoo:target: zoo:all, pld, suffix — zoo:all is "
                   "every zoo drafter for that target; with other targets none)")
    p.add_argument("--policy", default=None, help="drafter-selection policy, e.g. ucb, ucb:beta=0.1, fixed:pld, "
                   "round-robin, random; 'draftwise policies' lists them (default: ctx-ucb, UCB per 'does the lookup "
                   "match?' context over the suffix lookup (else PLD), a routed model drafter and no speculation)")
    p.add_argument("--draft-len", type=int, default=None, help="draft tokens per round (default 4, or the preset's)")
    p.add_argument("--arms", default=None,
                   help="what the policy chooses among: drafters, lengths, stops, drafters×stops, "
                   "cascade, or a list such as code@6+svip,pld@3,auto@4,none (DRAFTER[@LEN][+RULE]; auto = the "
                   "model drafter that best predicts the prompt). Default: the policy's own (cascade for ctx-ucb, "
                   "else drafters)")
    p.add_argument("--max-draft", type=int, default=None,
                   help="draft budget under dynamic stopping rules (default 16, or the preset's)")
    p.add_argument("--stops", default=None, help="stopping rules of the stops layouts, comma-separated "
                   "(default: static,max-confidence,svip,adaedl,svip-difference,logit-margin)")
    p.add_argument("--arm-drafter", default=None,
                   help="the drafter of the lengths / stops layouts (default: the first), or the "
                   "lookup of the cascade layout (default: suffix, else pld)")
    p.add_argument("--drafter-head-dtype", choices=("auto", "float32", "bfloat16"), default=None,
                   help="LM head of small drafters and white-box heads: auto (default) = bfloat16 where the CPU "
                   "multiplies it natively, else float32, and white-box heads' single rows in float16; "
                   "outputs are unaffected (the target decides every token)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the tokenizer's chat template (default: when it has one)")
    add_sampling_option(p)
    p.add_argument("--device", default="cpu", help="where the models run: cpu (default), cuda, cuda:N, mps or xpu")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads, from 1 to the CPUs this process may use (more is refused: extra "
                        "threads only wait for each other); default: torch's choice; 1 is often fastest for small "
                        "models or a busy CPU")
    p.add_argument("--numerics", default=AUTO, choices=NUMERICS_CHOICES, help=NUMERICS_HELP)
    p.add_argument("--dtype", default="float32",
                   help="float32 (default), float16 or bfloat16: what drafters load in, and the target under "
                   "--numerics native")


def add_sampling_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sampling", choices=("coupled", "rejection"), default="coupled",
                   help="how sampled tokens are drawn (temperature > 0): coupled (default) = each token is the "
                   "Gumbel-max of the target's distribution with noise fixed by the seed and its position, so one "
                   "seed gives one text whatever the drafters, policy, batch or timing; rejection = classic "
                   "speculative sampling, whose draws depend on what was drafted (same distribution either way)")


def load_generator(args: argparse.Namespace) -> Any:
    """The :class:`~draftwise.api.Generator` that :func:`add_model_options`' options describe (the zoo
    target and its whole pool by default). Set ``--threads`` first; check everything else before."""
    # the engine loads torch (seconds): only a command that generates imports it
    import torch

    from draftwise.api import DEFAULT_POLICY, Generator, Setup

    setup = Setup.parse(args.policy or DEFAULT_POLICY, draft_len=args.draft_len, arms=args.arms,
                        max_draft=args.max_draft, stops=args.stops.split(",") if args.stops else None,
                        arm_drafter=args.arm_drafter)
    if args.threads is not None:
        torch.set_num_threads(check_threads(args.threads))
    target = args.target or DEFAULT_TARGET
    drafters = args.drafter if args.drafter is not None else list(default_drafters(target))
    return Generator.from_pretrained(
        target, drafters, device=args.device, dtype=args.dtype, numerics=args.numerics,
        seed=0 if args.seed is None else args.seed,
        chat=args.chat, setup=setup, drafter_head_dtype=args.drafter_head_dtype, sampling=args.sampling,
    )


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity masks
        return os.cpu_count() or 1


def check_threads(threads: int) -> int:
    """A ``--threads`` value between 1 and the usable CPUs: torch's threads spin-wait for each other, so each
    one past the CPU count makes every forward slower (1000 threads on 2 CPUs: 16× slower)."""
    cpus = usable_cpus()
    if not 1 <= threads <= cpus:
        raise DraftwiseError(f"--threads must lie in [1, {cpus}] (the CPUs this process may use), got {threads}")
    return threads


def run(args: argparse.Namespace) -> int:
    # Everything the user typed is checked before the models load (seconds) and before generating.
    prompt = read_prompt(args.prompt)
    check_seed(args.seed, "--seed")
    request = Request(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                      top_p=args.top_p, seed=args.seed, stop=args.stop or (), ignore_eos=args.ignore_eos,
                      truncate=args.truncate)
    if args.trace:
        check_output_file(args.trace, "--trace", "trace.jsonl")
    gen = load_generator(args)
    result = gen.generate(prompt, request)
    if args.json:
        out = result.to_dict()
        keys = ("new_tokens", "rounds", "target_calls", "mat", "acceptance_rate", "tokens_per_s", "wall_s", "pulls",
                "stopped_by", "prompt_tokens_cut")
        out["stats"] = {k: out["stats"][k] for k in keys}
        out["stats"]["costs"] = gen.costs.summary()  # the machine's prices the decisions weighed
        print(json.dumps(out))
    else:
        print(result.text)
        print(format_stats(result.stats), file=sys.stderr)
    if args.trace:  # after printing: should the write still fail, the output is not lost
        try:
            result.write_trace(args.trace)
        except OSError as error:
            raise DraftwiseError(f"--trace: cannot write {args.trace}: {error.strerror or error}") from None
    return 130 if result.stats.stopped_by == "interrupted" else 0


def read_prompt(argument: str | None) -> str:
    """The prompt from the argument, or stdin when it is omitted or '-'; UTF-8 text, not empty."""
    if argument is None or argument == "-":
        prompt = check_prompt_text(_read_stdin(), "the prompt on stdin")
    else:
        prompt = check_prompt_text(_argument_text(argument), "the prompt argument")
    if not prompt.strip():
        raise DraftwiseError("the prompt is empty: pass it as an argument or on stdin")
    return prompt


def _read_stdin() -> str:
    if sys.stdin is None or sys.stdin.isatty():
        return ""
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream without bytes underneath (already decoded)
        return sys.stdin.read()
    data = raw.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DraftwiseError(f"stdin is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); "
                             "pass the prompt as UTF-8") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # the newlines text-mode stdin gave before


def _argument_text(argument: str) -> str:
    """Python hands undecodable argv bytes over as lone surrogates (surrogateescape): name the byte."""
    try:
        argument.encode("utf-8")
        return argument
    except UnicodeEncodeError as error:
        try:
            where = len(os.fsencode(argument[: error.start]))
            detail = f"byte 0x{os.fsencode(argument)[where]:02x} at offset {where}"
        except UnicodeEncodeError:  # a lone surrogate that was never a byte (a caller's string)
            detail = f"character {argument[error.start]!r} at position {error.start}"
        raise DraftwiseError(f"the prompt argument is not UTF-8 text ({detail}); pass the prompt as UTF-8") from None


def check_output_file(path: str, option: str, example: str) -> None:
    """A file we will write later: its folder must exist now, and the path must not be a folder (``example``:
    a file name for that option, suggested inside a folder given by mistake)."""
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise DraftwiseError(f"{option}: folder {folder} does not exist; create it or pick a file in an existing "
                             "folder")
    if target.is_dir():
        raise DraftwiseError(f"{option}: {target} is a folder; give a file name such as {target / example}")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise DraftwiseError(f"{option}: {target} is not writable")


def format_stats(stats: Any) -> str:
    pulls = ", ".join(f"{name} {n}" for name, n in sorted(stats.pulls.items(), key=lambda kv: -kv[1]))
    lines = [
        f"-- {stats.new_tokens} tokens in {stats.rounds} target calls (MAT {stats.mat:.2f}), "
        f"acceptance {stats.acceptance_rate:.0%}, {stats.tokens_per_s:.1f} tokens/s, stopped by {stats.stopped_by}",
        f"-- time {stats.wall_s:.3f}s: draft {stats.draft_s:.3f}, verify {stats.verify_s:.3f}, "
        f"policy {stats.policy_s:.4f}, evaluation {stats.eval_s:.3f}, other {stats.other_s:.3f}",
        f"-- pulls: {pulls}",
    ]
    if stats.stopped_by == "interrupted":
        lines.insert(0, "-- interrupted: what was generated so far is shown above")
    return "\n".join(lines)
