"""Which drafter the policy plays, round by round, along one long answer.

    python benchmarks/round_choices.py --out runs/round_choices               # 384 new tokens, greedy
    python benchmarks/round_choices.py --max-new-tokens 96 --out runs/rc-short
    python benchmarks/round_choices.py --policy ucb --prompt "Explain recursion." --ignore-eos --out runs/rc-ucb

Loads ``Generator.from_pretrained("zoo:target", ["zoo:all", "pld", "suffix"])`` with the library's
default policy (or ``--policy``), generates one answer and writes to ``--out``:

* ``round_choices.png`` — one marker per round at its position in the answer (tokens generated
  before it), coloured by the arm played, at the height of the tokens it emitted (accepted + the
  bonus token). A bandit that follows the text shows runs of one colour where one drafter fits
  (lookups on repeated spans, a domain model on its own kind of text) and switches when the text
  changes; rounds still exploring show as isolated markers of other colours.
* ``round_choices.jsonl`` — one row per round: arm_name, position, drafted, accepted, emitted and
  the reward the policy was given (null when it got none).
* ``round_choices.json`` — what produced them: prompt, seed, policy, pool, settings, the answer
  and its statistics (MAT, acceptance, pulls, wall time).

The answer ends at the end-of-text token or at ``--max-new-tokens``; ``--ignore-eos`` fills the
length whatever the prompt. Under greedy decoding the text is the same on every run; the choices
need not be: the default policy is rewarded by each round's measured throughput, so a loaded
machine can change them (the rewards it saw are in the JSONL).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from draftwise import Generator
from draftwise.api import DEFAULT_POLICY
from draftwise.trace import GenerationResult, RoundRecord, write_jsonl

# defaults, one line each
TARGET = "zoo:target"
POOL = ("zoo:all", "pld", "suffix")  # the library's default pool
MAX_NEW_TOKENS = 384  # long enough for the policy to settle and for the text to change kind
# Prose about code: the zoo target answers it at length (most prompts end within ~60 tokens) and
# moves between text a domain model drafts and repeated spans a lookup finds.
PROMPT = "Explain the difference between a list and a tuple in Python, with examples."
ROUND_FIELDS = ("index", "arm_name", "position", "drafted", "accepted", "emitted", "reward")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", default=PROMPT, help=f"the prompt (default {PROMPT!r})")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="keep generating past the end-of-text token (a prompt whose answer is short still "
                        "fills --max-new-tokens)")
    parser.add_argument("--seed", type=int, default=0, help="the generator's and the policy's seed")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help=f"policy spec (default {DEFAULT_POLICY})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    parser.add_argument("--out", default="runs/round_choices", help="output folder (default runs/round_choices)")
    return parser.parse_args(argv)


def round_rows(trace: Sequence[RoundRecord]) -> list[dict[str, Any]]:
    """The per-round fields the plot and the JSONL need, nothing else (the full trace is much larger)."""
    return [{name: getattr(record, name) for name in ROUND_FIELDS} for record in trace]


def legend_order(played: Iterable[str], arm_names: Sequence[str]) -> list[str]:
    """Arms played, in pool order; an arm that resolves per query (``auto@4=code``: the auto arm on
    the code drafter) sorts at its arm's place, so the same pool keeps the same colours run to run."""
    rank = {name: i for i, name in enumerate(arm_names)}
    return sorted(set(played), key=lambda name: (rank.get(name.split("=")[0], len(rank)), name))


def plot_rounds(rows: Sequence[dict[str, Any]], arm_names: Sequence[str], title: str, path: Path) -> None:
    """Scatter of emitted tokens against position, a colour per arm; the legend counts each arm's rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import colormaps

    names = legend_order((row["arm_name"] for row in rows), arm_names)
    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    fig, ax = plt.subplots(figsize=(11, 4))
    for i, name in enumerate(names):
        mine = [row for row in rows if row["arm_name"] == name]
        ax.scatter([row["position"] for row in mine], [row["emitted"] for row in mine], s=22, color=cmap(i % cmap.N),
                   label=f"{name} ({len(mine)})", alpha=0.85, linewidths=0)
    ax.set_xlabel("position in the answer (tokens generated before the round)")
    ax.set_ylabel("tokens emitted that round")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(title="arm (rounds)", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_record(args: argparse.Namespace, generator: Generator, result: GenerationResult) -> dict[str, Any]:
    """Everything needed to reproduce and read the plot (the sidecar JSON)."""
    return {"command": "python benchmarks/round_choices.py " + " ".join(sys.argv[1:]), "target": TARGET,
            "pool": list(POOL), "arms": [arm.name for arm in generator.arms], "policy": args.policy,
            "seed": args.seed, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
            "ignore_eos": args.ignore_eos,
            "prompt": args.prompt, "answer": result.text, "stats": result.stats.to_dict()}


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    from transformers.utils import logging as hf_logging

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    generator = Generator.from_pretrained(TARGET, list(POOL), policy=args.policy, seed=args.seed)
    result = generator.generate(args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                seed=args.seed, ignore_eos=args.ignore_eos)
    rows = round_rows(result.trace)
    record = run_record(args, generator, result)
    write_jsonl(out / "round_choices.jsonl", rows)
    (out / "round_choices.json").write_text(json.dumps(record, indent=2) + "\n")
    stats = result.stats
    title = (f"{args.policy} over {', '.join(POOL)}: {stats.new_tokens} tokens in {stats.rounds} rounds, "
             f"MAT {stats.mat:.2f} (seed {args.seed}, temperature {args.temperature:g})")
    plot_rounds(rows, record["arms"], title, out / "round_choices.png")
    print(json.dumps({"out": str(out), "rounds": stats.rounds, "new_tokens": stats.new_tokens,
                      "mat": round(stats.mat, 3), "tokens_per_s": round(stats.tokens_per_s, 1), "pulls": stats.pulls}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
