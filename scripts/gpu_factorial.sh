#!/usr/bin/env bash
# The clamp factorial (issue 22, `markov_interp.experiments.factorial`) at its full budget on a lent GPU:
# 16 seeds per arm and cell, 600 steps, fp32, 4 cells (layer-1 heads {1, 2} x data {Dirichlet, zero diagonal}).
# From the repository root (the device tool puts a folder in $OUT; elsewhere pass one):
#
#     bash scripts/gpu_factorial.sh            # writes $OUT/stage1.tar.gz, $OUT/stage2.tar.gz (+ -summary.md)
#     STAGE1_S=0 STAGE2_S=560 bash scripts/gpu_factorial.sh   # stage 2 alone (a limit of 0 skips a stage)
#
# Stage 1 ran on an H200 on 2026-11-27: 143 s (docs/reproduction/factorial-full-gpu/). Stage 2 has not run: it
# trains 20 stacks (about 2.5x stage 1's training) and scores every checkpoint, so give it a call of its own, or
# split it by arms (EXTRA="--set arms=free,mixed", then head-start,position-code).
# Carry .whl (transformer-lens wheels, docs/reproduction/gpu/README.md): the end scores and stage 2 probe.
#
# Stage 1: arms free and clamped only (the factorial proper: 8 stacks of 16 runs). Stage 2: every arm (adds the
# mixed clamp, the head start and its position-code control). Each stage writes summary.md,
# results.json (every seed's curve and crossings), overview.csv and figures; the run folders stay on the
# device machine ($WORK). Each stage has its own time limit so that a slow stage 2 cannot cost stage 1.
# Expected cost (not measured for this model): stacks of 16 tiny models (d_model 16, seq 32, batch 64) are
# launch-bound, ~5-10 ms/step on an H100/H200 -> ~5-10 s per stack, 20 stacks, plus imports and scoring.
# Stage 1 skips the scores over training and the circuit discovery (score_checkpoints=0, discovered=0: they cost
# ~0.5 s per checkpoint and ~1.5 s per discovery on a CPU, ~770 scorings and 24 discoveries for two arms); stage 2
# adds them for every arm. Its run folders differ from stage 1's (checkpoints are part of a run's config), so it
# trains again; stage 1 is the result to keep if stage 2 runs out of time.
set -euo pipefail
OUT=${1:-${OUT:?pass an output folder or set OUT}}
WORK=${WORK:-/tmp/gpu-factorial}
STAGE1_S=${STAGE1_S:-240}
STAGE2_S=${STAGE2_S:-330}
DEVICE=${DEVICE:-cuda}  # a dry run of the wiring elsewhere: DEVICE=cpu EXTRA="--n-seeds 2 --steps 4 ..." (the quick
EXTRA=${EXTRA:-}        # budget's fields stay the full one's unless EXTRA overrides them)
mkdir -p "$OUT" "$WORK"
source "$(dirname "$0")/device_env.sh"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
  python -c "import torch, sys; ok = torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', ok)
sys.exit(0 if ok or sys.argv[1] != 'cuda' else 1)" "$DEVICE"
  git rev-parse HEAD 2>/dev/null || true; } | tee "$OUT/provenance.txt"

stage() {  # stage NAME SECONDS [--set ...]: the full budget on $DEVICE into $WORK/NAME, packed as $OUT/NAME.tar.gz
  local name=$1 seconds=$2; shift 2
  local start=$SECONDS rc=0
  [ "$seconds" -gt 0 ] || { echo "$name: skipped (limit 0)" | tee -a "$OUT/provenance.txt"; return 0; }
  # shellcheck disable=SC2086
  timeout "$seconds" python -m markov_interp.experiments --only factorial --device "$DEVICE" --no-progress \
    --out "$WORK/$name" $EXTRA "$@" || rc=$?
  echo "$name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/provenance.txt"
  pack "$name" "$WORK/$name/factorial"
}

stage stage1 "$STAGE1_S" --set arms=free,clamped --set score_checkpoints=0 --set discovered=0
stage stage2 "$STAGE2_S"
