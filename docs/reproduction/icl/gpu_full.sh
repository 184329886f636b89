#!/usr/bin/env bash
# Issue 23 on one lent GPU: the phase diagram and the task-diversity sweep at their "gpu" budgets (stacks of 48 and
# 192 models, 16 seeds per cell, 2000 steps; `--list` prints every budget). Not yet run: the budgets are sized by
# estimate to about 10 minutes each on an H100/H200 (training on the GPU, measures and the classifier on the CPU
# cores), so run them as two device calls, diversity first (the cheaper one), each with timeout_s 600:
#
#   bash docs/reproduction/icl/gpu_full.sh diversity
#   bash docs/reproduction/icl/gpu_full.sh phases
#
# Each writes $OUT/icl-NAME.tar.gz (summary.md, results.json, cells.csv, figures; the device tool brings back at
# most 8 files) and $OUT/icl-NAME-summary.md, and prints the summary; the run folders stay on the device machine.
# Carry .whl (transformer-lens wheels, docs/reproduction/gpu/README.md): the measures probe the trained models. If a call runs out of time, rerun it with a
# smaller budget, e.g. `--set seeds=8` or `--steps 1000`, which the header of summary.md then states. Commit the
# results under docs/reproduction/icl/NAME-gpu/ and add their tables to docs/findings-icl.md.
set -euo pipefail
name="${1:?usage: gpu_full.sh phases|diversity [extra options, e.g. --set seeds=8]}"
shift
OUT="${OUT:-runs/gpu}"
out=/tmp/gpu-icl
mkdir -p "$OUT" "$out"
source "$(dirname "$0")/../../../scripts/device_env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__)"
python -m markov_interp.experiments --only "$name" --budget gpu --no-progress --out "$out" "$@"
pack "icl-$name" "$out/$name"
cat "$out/$name/summary.md"
