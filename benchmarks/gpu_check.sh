#!/usr/bin/env bash
# One prepared device check (a lent CUDA machine: its own torch/transformers, no installs, no network):
# the CUDA losslessness tests, then the batched bench on the GPU. Every step has its own time limit
# and copies what it produced to $OUT at once, so a step cut short loses nothing before it.
# Usage (repo root, on the device): OUT=DIR [ZOO_CORPUS=DIR] [SKIP_TESTS=1] [DEVICE=cuda] \
#     bash benchmarks/gpu_check.sh [SWEEP_S] [MIXED_S] [HF_S]
# (ZOO_CORPUS: the zoo's dev/test splits, e.g. copied from ~/.cache/draftwise/zoo-corpus/*/ into an
# ignored folder that the device call carries; DEVICE=cpu tries the script's mechanics here.)
# Session 15 ran the first two steps on an H200 in ≈ 2 minutes (NOTES, BENCHMARKS).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
SWEEP_S=${1:-200}; MIXED_S=${2:-150}; HF_S=${3:-120}
log() { echo "== $(date +%T) $*"; }
BENCH=(python3 -m draftwise.cli bench --device "${DEVICE:-cuda}" --per-domain 4 --quiet --no-plots ${ZOO_CORPUS:+--zoo-corpus "$ZOO_CORPUS"})
{
  log versions
  nvidia-smi -L
  python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
  [ -n "${SKIP_TESTS:-}" ] || { log "tests/test_cuda.py"
  timeout 150 python3 -m pytest tests/test_cuda.py -q -x -p no:cacheprovider 2>&1 | tail -5; }
  log "sweep B = 32, 8, 1"
  timeout "$SWEEP_S" "${BENCH[@]}" --out /tmp/gpu-sweep --batch-size 32,8,1 --repeats 2 \
      --methods ar,length:2,length:4,banditspec-length,default,fixed:suffix@8
  cp /tmp/gpu-sweep/batch-results.jsonl "$OUT/sweep.jsonl"; cp /tmp/gpu-sweep/batch-summary.md "$OUT/sweep.md"
  log "mixed B = 8 with model drafters"
  timeout "$MIXED_S" "${BENCH[@]}" --out /tmp/gpu-mixed --batch-size 8 --repeats 2 \
      --methods ar,default,metasd-ucb,fixed:suffix@8,fixed:pld,fixed:generalist
  cp /tmp/gpu-mixed/batch-results.jsonl "$OUT/mixed.jsonl"; cp /tmp/gpu-mixed/batch-summary.md "$OUT/mixed.md"
  log "B = 16 against transformers' batched generate (issue 15's 0.95× bar)"
  timeout "$HF_S" "${BENCH[@]}" --out /tmp/gpu-hf16 --batch-size 16 --repeats 2 --methods ar,hf-ar,default
  cp /tmp/gpu-hf16/batch-results.jsonl "$OUT/hf16.jsonl"
  cp /tmp/gpu-sweep/batch-env.json "$OUT/env.json"
  log done
} 2>&1 | grep -v "FutureWarning\|return forward_call" | tee "$OUT/log.txt"
