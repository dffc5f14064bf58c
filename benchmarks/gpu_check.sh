#!/usr/bin/env bash
# One prepared device check (a CUDA machine with its own torch/transformers: no installs, no network):
# the CUDA losslessness tests, then batched benches on the GPU. Every step has its own time limit
# and copies what it produced to $OUT at once, so a step cut short loses nothing before it.
# Usage (repo root, on the device): OUT=DIR [ZOO_CORPUS=DIR] [DEVICE=cuda] [STEPS="tests hf16 ..."] \
#     bash benchmarks/gpu_check.sh
# Steps (default: tests hf16 sampled sweepq, in this order; each STEP_S=seconds overrides its limit,
# e.g. SWEEPQ_S=200):
#   tests    tests/test_cuda.py
#   hf16     B = 16: ar against transformers' batched generate, and the default
#   sampled  B = 8, 32 at temperature 0.7: ar, the default, suffix@8, pld
#   sweepq   B = 32, 16, 4 over 56 prompts (--per-domain 8), 2 repeats: passes long enough to time
#            (the adaptive length vs the best fixed one; the default vs suffix@8)
#   single   one request at a time (no batch), self_instruct (40) and zoo:dev (28): ar, the default, a fixed
#            LM drafter (generalist@3) and suffix@8, at temperature 0.7 and greedy
#   queue32  B = 32 over 56 prompts (a queue: rows refilled; its --per-domain 8 overrides the 4), 3 repeats — at 28 prompts a B = 32 pass
#            takes < 1 s on an H200 and one hiccup doubles it
# (ZOO_CORPUS: the zoo's dev/test splits, e.g. copied from ~/.cache/draftwise/zoo-corpus/*/ into an
# ignored folder that the device call carries; DEVICE=cpu tries the script's mechanics here.)
# Each step backs a table of BENCHMARKS.md ("GPU"; "Batched engine", *Sampled batches*).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
STEPS=${STEPS:-tests hf16 sampled sweepq}
log() { echo "== $(date +%T) $*"; }
BENCH=(python3 -m draftwise.cli bench --device "${DEVICE:-cuda}" --per-domain 4 --quiet --no-plots ${ZOO_CORPUS:+--zoo-corpus "$ZOO_CORPUS"})
bench() {  # NAME LIMIT_S ARGS...: one bench into /tmp/gpu-NAME, its rows copied to $OUT/NAME.*
  local name=$1 limit=$2; shift 2
  log "$name"
  timeout "$limit" "${BENCH[@]}" --out "/tmp/gpu-$name" "$@"
  local kind=batch-; [ -f "/tmp/gpu-$name/batch-results.jsonl" ] || kind=  # a batched bench, or one at a time
  cp "/tmp/gpu-$name/${kind}results.jsonl" "$OUT/$name.jsonl"; cp "/tmp/gpu-$name/${kind}summary.md" "$OUT/$name.md"
  [ -f "$OUT/env.json" ] || cp "/tmp/gpu-$name/${kind}env.json" "$OUT/env.json"
}
{
  log versions
  nvidia-smi -L
  python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
  for step in $STEPS; do
    case $step in
      tests) log "tests/test_cuda.py"
             timeout "${TESTS_S:-150}" python3 -m pytest tests/test_cuda.py -q -x -p no:cacheprovider 2>&1 | tail -5 ;;
      hf16) bench hf16 "${HF16_S:-120}" --batch-size 16 --repeats 2 --methods ar,hf-ar,default ;;
      sampled) bench sampled "${SAMPLED_S:-150}" --batch-size 8,32 --repeats 2 --temperature 0.7 \
                   --methods ar,default,fixed:suffix@8,fixed:pld ;;
      sweepq) bench sweepq "${SWEEPQ_S:-330}" --per-domain 8 --batch-size 32,16,4 --repeats 2 \
                  --methods ar,length:1,length:2,length:3,length:4,banditspec-length,default,fixed:suffix@8 ;;
      single) for t in 0.7 0; do
                bench "single-si-t$t" "${SINGLE_S:-150}" --data "${SI_DATA:-.gpucorpus/data/self_instruct/seed_tasks.jsonl}" \
                    --per-domain 40 --repeats 1 --temperature $t --methods ar,default,fixed:generalist@3,fixed:suffix@8
                bench "single-dev-t$t" "${SINGLE_S:-150}" --repeats 1 --temperature $t \
                    --methods ar,default,fixed:generalist@3,fixed:suffix@8
              done ;;
      queue32) bench queue32 "${QUEUE32_S:-200}" --per-domain 8 --batch-size 32 --repeats 3 \
                   --methods ar,length:2,length:4,banditspec-length,default,fixed:suffix@8 ;;
      *) log "unknown step $step (steps: tests hf16 sampled sweepq queue32 single)" ;;
    esac
  done
  log done
} 2>&1 | grep -v "FutureWarning\|return forward_call" | tee "$OUT/log.txt"
