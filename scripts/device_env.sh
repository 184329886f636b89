# Sourced by the GPU scripts (scripts/gpu_*.sh, docs/reproduction/icl/gpu_full.sh) on a lent device machine.
# - Puts the checkout on PYTHONPATH and keeps Hugging Face libraries offline (nothing can be reached there).
# - Installs wheels carried in .whl (transformer-lens and what the image lacks: see docs/reproduction/gpu/README.md)
#   into /tmp/site where TransformerLens is missing: the probes need it, and the device image does not have it.
# - `pack NAME DIR`: the device tool brings back at most 8 files, so a result folder comes back as one archive,
#   $OUT/NAME.tar.gz, with its summary.md beside it as $OUT/NAME-summary.md for reading at once.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null && ! python3 -c "import transformer_lens" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

pack() {  # pack NAME DIR: DIR's files (not its run folders) as $OUT/NAME.tar.gz, its summary.md as $OUT/NAME-summary.md
  local name=$1 dir=$2
  [ -d "$dir" ] || { echo "pack: no $dir"; return 0; }
  tar -czf "$OUT/$name.tar.gz" -C "$dir" --exclude=./runs .
  [ -f "$dir/summary.md" ] && cp "$dir/summary.md" "$OUT/$name-summary.md"
  echo "packed $dir -> $OUT/$name.tar.gz"
}
