#!/usr/bin/env bash
# The whole GPU check of distattn.models / distattn.train, in one command on the device machine:
#   bash benchmarks/gpu_check.sh [PART] [EXTRA ARGS...]     PART: seed,lm | best | all (default)
# Needs .gpu/prep/imdb_prep.npz (python benchmarks/prepare_imdb.py; carry ".gpu/prep") or the IMDB
# archive in $DISTATTN_DATA_DIR. Logs and JSON go under $OUT (default /tmp/gpu_check).
set -o pipefail
PART=${1:-all}
shift || true
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
export DISTATTN_DATA_DIR=${DISTATTN_DATA_DIR:-$PWD/.gpu} DISTATTN_CACHE_DIR=${DISTATTN_CACHE_DIR:-/tmp/dacache}
TAG=${PART//,/_}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  python3 benchmarks/bench_models.py --part "$PART" --out "$OUT/bench" --runs /tmp/distattn_runs "$@"
} 2>&1 | tee "$OUT/log_$TAG.txt"
