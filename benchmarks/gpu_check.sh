#!/usr/bin/env bash
# The whole GPU check of distattn.models / distattn.train, in one command on the device machine:
#   bash benchmarks/gpu_check.sh [PART] [EXTRA ARGS...]     PART: seed,lm | best | all (default)
# Needs .gpu/prep/imdb_prep.npz (python benchmarks/prepare_imdb.py; carry ".gpu/prep") or the IMDB
# archive in $DISTATTN_DATA_DIR. Logs go under $OUT (default /tmp/gpu_check): log_PART.txt, and
# bench_PART.tar.gz holding bench/ (every part's JSON, the runs' metrics_*.json, the rows'
# probs_*.npz, and with rows, ensemble_with_nbsvm.json: benchmarks/ensemble_rows.py over them and
# the committed NBSVM probabilities). The device machine brings back at most 8 files from $OUT, and one call writes more,
# so they travel as that one archive, refreshed every 30 s and at the end (a call cut at its time
# limit keeps the parts finished by then); unpack it with `tar -xzf bench_PART.tar.gz`.
set -o pipefail
PART=${1:-all}
shift || true
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
export DISTATTN_DATA_DIR=${DISTATTN_DATA_DIR:-$PWD/.gpu} DISTATTN_CACHE_DIR=${DISTATTN_CACHE_DIR:-/tmp/dacache}
TAG=${PART//,/_}
STAGE=${GPU_CHECK_STAGE:-/tmp/gpu_check_$TAG}     # bench/ is written here, outside $OUT
rm -rf "$STAGE" && mkdir -p "$STAGE/bench"
snapshot() {
  tar -czf "$OUT/bench_$TAG.tar.gz.part" -C "$STAGE" bench && mv -f "$OUT/bench_$TAG.tar.gz.part" "$OUT/bench_$TAG.tar.gz"
}
( n=0; until [ -e "$STAGE/.done" ]; do sleep 2; n=$((n + 2)); [ $((n % 30)) -ne 0 ] || snapshot; done ) >/dev/null 2>&1 &
snapper=$!
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  python3 benchmarks/bench_models.py --part "$PART" --out "$STAGE/bench" --runs /tmp/distattn_runs "$@"
} 2>&1 | tee "$OUT/log_$TAG.txt"
rc=$?
if compgen -G "$STAGE/bench/probs_*.npz" >/dev/null; then
  # the rows of this call combined with, and set beside, the committed NBSVM baseline's probabilities
  # (same validation reviews and test set; seconds on the CPU): mean, stack, gain with its interval
  { python3 benchmarks/ensemble_rows.py "$STAGE"/bench/probs_*.npz benchmarks/results/cpu_nbsvm_imdb/probs_nbsvm.npz \
      --json "$STAGE/bench/ensemble_with_nbsvm.json" || echo "ensemble with NBSVM: not made (exit $?)"; } 2>&1 \
      | tee -a "$OUT/log_$TAG.txt"
fi
touch "$STAGE/.done" && wait "$snapper"
snapshot && echo "bench outputs: $OUT/bench_$TAG.tar.gz ($(tar -tzf "$OUT/bench_$TAG.tar.gz" | grep -vc '/$') files)"
exit $rc
