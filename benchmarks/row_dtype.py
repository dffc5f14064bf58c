"""One drafted token's matrix products by dtype: why white-box heads multiply a single row in float16.

    python benchmarks/row_dtype.py --threads 1

Times ``F.linear`` of 1 and 8 rows against weights of the SmolLM2 EAGLE head's shapes, in float32,
bfloat16 and float16. Each call uses the next of ``--copies`` distinct weights, so they come from
memory, as in the decode loop, where the target's forward has pushed a head's weights out of cache.
Prints milliseconds per product (median of the repeats).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = ((576, 576), (768, 576), (576, 1152), (4095, 576))  # q/o, gate/up, fc, the subset LM head
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def ms_per_product(shape: tuple[int, int], dtype: torch.dtype, rows: int, copies: int, repeats: int) -> float:
    weights = [torch.randn(*shape).to(dtype) for _ in range(copies)]
    x = torch.randn(rows, shape[1]).to(dtype)
    for w in weights:  # warm-up: oneDNN builds a kernel per new shape
        F.linear(x, w)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for w in weights:
            F.linear(x, w)
        times.append((time.perf_counter() - started) * 1000 / copies)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--copies", type=int, default=40, help="distinct weights cycled through (default 40)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    for rows in (1, 8):
        for shape in SHAPES:
            row = {name: round(ms_per_product(shape, dtype, rows, args.copies, args.repeats), 3)
                   for name, dtype in DTYPES.items()}
            print(json.dumps({"rows": rows, "shape": list(shape), "ms": row}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
