"""A white-box head's learning curve: dev-split acceptance of the weights its training kept every N
steps (``TrainConfig.snapshot_every``), against the tokens it had seen.

    python benchmarks/head_curve.py --build BUILD --head BUILD/models/eagle --snapshots BUILD/eagle \
        --out runs/head-curve/curve.json

Acceptance as ``benchmarks/real_zoo.py`` measures it (greedy, draft length 5, the target's own
greedy answers to the dev prompts, the engine's rounds replayed exactly); ``--start`` adds the head
the training started from as step 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import re
import tempfile
import time
from pathlib import Path

import torch
from common import DRAFT_LENGTH, dev_answers  # benchmarks/common.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="the distill build folder (its corpus' dev split)")
    parser.add_argument("--head", required=True, help="the trained head's folder (its config and vocabulary)")
    parser.add_argument("--snapshots", required=True, help="folder of the training's head-stepNNNNNN.pt files")
    parser.add_argument("--start", default=None, help="the head the training started from (step 0)")
    parser.add_argument("--out", required=True, help="JSON result file")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--prompts", type=int, default=6, help="dev prompts per domain")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)

    from draftwise import Generator
    from draftwise.drafters.eagle import EagleHead
    from draftwise.drafters.whitebox import load_head_drafter, read_head_config, save_head
    from draftwise.models.vocab_map import FILE as VOCAB_FILE
    from draftwise.training.evaluate import RoundStats, head_stats

    head = Path(args.head)
    meta = json.loads((head / "training.json").read_text())
    train = meta["recipe"]["train"]
    tokens_per_step = int(train["batch"]) * int(train["seq_len"])
    plain = Generator.from_pretrained(args.target, [], policy="fixed:none")
    target = plain.target.model
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    dev = {domain: (prompts, conts) for domain, (_, prompts, conts)
           in dev_answers(plain, args.build, args.prompts, out.parent).items()}

    def measure(folder: Path) -> dict:
        drafter = load_head_drafter(str(folder), target)
        per_domain, total = {}, RoundStats(0, 0, 0, 0)
        for domain, (prompts, conts) in dev.items():
            stats = head_stats(drafter, target, prompts, conts, DRAFT_LENGTH)
            per_domain[domain] = round(stats.mat, 3)
            total = total + stats
        mean = sum(per_domain.values()) / len(per_domain)
        return {"mat": round(mean, 3), "first": round(total.first_acceptance, 3), "domains": per_domain}

    points = []
    if args.start:
        points.append({"step": 0, "tokens_seen": 0, **measure(Path(args.start))})
    config = read_head_config(head)
    for snapshot in sorted(Path(args.snapshots).glob("*-step*.pt")):
        step = int(re.search(r"step(\d+)", snapshot.name).group(1))  # type: ignore[union-attr]
        module = EagleHead(config)
        module.load_state_dict(torch.load(snapshot, map_location="cpu"))
        with tempfile.TemporaryDirectory() as tmp:
            folder = save_head(module, config, Path(tmp) / "head")
            (folder / VOCAB_FILE).write_text((head / VOCAB_FILE).read_text())
            points.append({"step": step, "tokens_seen": step * tokens_per_step, **measure(folder)})
        logging.info("step %d: %s", step, points[-1])
    result = {"head": str(head), "target": args.target, "draft_length": DRAFT_LENGTH,
              "prompts_per_domain": args.prompts, "machine": platform.processor() or platform.machine(),
              "date": time.strftime("%Y-%m-%d"), "points": points}
    out.write_text(json.dumps(result, indent=2) + "\n")
    for p in points:
        print(f"step {p['step']:6d}  tokens seen {p['tokens_seen']:>10,}  MAT@{DRAFT_LENGTH} {p['mat']:.3f}  "
              f"first token {p['first']:.3f}")


if __name__ == "__main__":
    main()
