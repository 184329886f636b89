#!/usr/bin/env bash
# One lent GPU call: probes on CUDA (issue 32's discovery and classify timings) first, then the compiled engine
# (issue 29's `benchmarks/gpu_engine_check.py`). Each part has its own time limit, so a slow or failing part cannot
# cost the next; every line goes to $OUT/gpu_check.log as it is printed. From the repository root:
#
#     bash scripts/gpu_check.sh            # about 10 minutes: run with the device tool's 600 s limit
#
# The probes need transformer-lens, which the device image lacks: carry wheels in .whl (README of the device tool)
# and this script installs them into /tmp/site. The engine check needs no transformer-lens except for its
# --invariance part, and the anchor copied into .anchors (see gpu_engine_check.py's docstring).
#
# Ran once on an H200 (2026-11-27): 354 s, docs/reproduction/gpu/check-2026-11-27.txt. A part's limit of 0 skips it
# (e.g. ENGINE_S=0 PROFILE_S=150 for the profiles of the compiled bf16 step alone, the open gap: each profile part
# runs twice, on the generator stream "torch-1" (the code before counter streams) and on "counter-1"; CAPTURE_S=240
# for the captured step against the uncaptured one).
set -uo pipefail
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
log="$OUT/gpu_check.log"
source "$(dirname "$0")/device_env.sh"
part() {  # part SECONDS COMMAND...: run it under a limit, say how it ended
  local seconds=$1 start=$SECONDS rc=0; shift
  [ "$seconds" -gt 0 ] || { echo "== skipped: $*"; return 0; }
  echo "== $* (limit ${seconds} s)"
  timeout "$seconds" "$@" || rc=$?
  echo "== exit $rc after $((SECONDS - start)) s"
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  git rev-parse HEAD 2>/dev/null || true
  python3 -c "import torch, importlib.metadata as m; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
      'transformer-lens', m.version('transformer-lens'))"
  part "${TESTS_S:-0}" python3 -m pytest -q -p no:cacheprovider -k cuda tests/probes/test_devices.py \
    tests/experiments/test_devices.py tests/report/test_report_devices.py tests/streams/test_streams.py \
    tests/sources/test_stream_sampling.py tests/training/test_step.py
  part "${DISCOVERY_S:-110}" python3 benchmarks/bench_classify.py --device cuda --threads 16 --only discovery \
    --cases 12x12/128 --repeats 1 --compare-cpu
  part "${SMALL_S:-70}" python3 benchmarks/bench_classify.py --device cuda --threads 16 --only discovery \
    --cases 2x2/128 6x4/64 --repeats 3 --compare-cpu
  part "${CLASSIFY_S:-40}" python3 benchmarks/bench_classify.py --device cuda --threads 16 --only classify --repeats 3
  part "${ENGINE_S:-330}" python3 benchmarks/gpu_engine_check.py --anchor-dir .anchors --invariance
  # the open gap before / after counter streams: the compiled bf16 stack of 256 against the compiled anchor
  part "${PROFILE_S:-0}" python3 benchmarks/gpu_engine_check.py --profile --short 12 --anchor-dir .anchors \
    --stream torch-1
  part "${PROFILE_S:-0}" python3 benchmarks/gpu_engine_check.py --profile --short 12 --anchor-dir .anchors \
    --stream counter-1
  # the captured step (one CUDA graph per step) against the uncaptured one and the compiled anchor, bf16, K = 256
  part "${CAPTURE_S:-0}" python3 benchmarks/gpu_engine_check.py --capture --short 12 --long 40 --anchor-dir .anchors
} 2>&1 | tee "$log"
