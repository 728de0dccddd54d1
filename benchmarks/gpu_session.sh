#!/usr/bin/env bash
# The GPU figures issues #4 and #6 owe first, in ONE device call sized for this workplace's budget
# (15 device-minutes a session, the machine's start included: one call of at most 600 s):
#   mkdir -p .gpu && cp ../shared/data/aclImdb_v1.tar.gz .gpu/   (a copy: a symbolic link travels as a link)
#   run(command="bash benchmarks/gpu_session.sh", carry=[".gpu/aclImdb_v1.tar.gz"], timeout_s=600), then
#   give_back (the archive alone: 54 MiB of the 64 MiB that travel, so no .gpu/prep* beside it)
# In order of priority, each step given only the time left before SESSION_DEADLINE (seconds after
# the start, default 560, so that the script ends inside the call's 600 s and packs what it has):
#   1. compare: `python -m distattn.compare --corpus imdb --profile full` cold (issue #6: at most 5 min
#      on one GPU; cut at COMPARE_TIMEOUT, default 330 s), then warm: benchmarks/gpu_compare.sh
#      without its smoke test (the compare runs the same kernels, and the call has no minute to spare);
#   2. models: bench_models.py --part seed,lm,mfu through benchmarks/gpu_check.sh (issue #4: the seed
#      classifier's accuracy and wall time, the 4-layer d=512 LM's tokens/s and MFU, each beside the
#      plain-PyTorch fp32 baseline; then the LM under batch sizes 256, 512 and 768). Its arrays
#      are built from the carried archive, on the tokens the compare cached, without the PPMI-SVD
#      vectors no part of it uses; each part's JSON is written when it ends, so a cut keeps the others.
# A step that cannot have its minimum (SESSION_MIN_COMPARE 120 s, SESSION_MIN_MODELS 60 s) is
# skipped, and says so. What comes back: $OUT/session.log (the steps' times and the lines that
# matter), $OUT/session.tar.gz (every step's files; refreshed every 30 s, so a call cut at its limit
# keeps what had finished: tar -xzf session.tar.gz) and $OUT/report.html (the compare's, to open).
# Later calls, one a session (benchmarks/results/README.md): the best classifier's rows (gpu_check.sh best).
# Run on an H100 in session 82 (benchmarks/results/h100_session_s82/): the compare and the seed and lm
# parts finished; the mfu part was cut in its max-autotune variant, since replaced by batch 768.
# A rehearsal on a CPU, the same steps at small sizes (the real compare and bench, the archive in
# DISTATTN_DATA_DIR): COMPARE_PROFILE=quick SESSION_BENCH_ARGS=--smoke bash benchmarks/gpu_session.sh
set -o pipefail
OUT=${OUT:-/tmp/gpu_session}
DEADLINE=${SESSION_DEADLINE:-560}
STAGE=${SESSION_STAGE:-/tmp/gpu_session_stage}      # the steps write here, outside $OUT
export COMPARE_RUNS=${COMPARE_RUNS:-$STAGE/runs} COMPARE_CACHE=${COMPARE_CACHE:-/tmp/dacache}
# the models step reads the compare's cache (the tokenized corpus): the same directory for both
export DISTATTN_CACHE_DIR=$COMPARE_CACHE DISTATTN_DATA_DIR=${DISTATTN_DATA_DIR:-$PWD/.gpu} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
rm -rf "$STAGE" && mkdir -p "$STAGE"
T0=$(date +%s)
LOG=$OUT/session.log
: > "$LOG"

left() { echo $((DEADLINE - ($(date +%s) - T0))); }
say() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$LOG"; }
# the steps' files, less gpu_check.sh's own archives (their bench/ folders are packed as they are)
pack() {
  tar -czf "$OUT/session.tar.gz.part" --exclude='bench_*.tar.gz' -C "$STAGE" --exclude=./runs . 2>/dev/null \
    && mv -f "$OUT/session.tar.gz.part" "$OUT/session.tar.gz"
}
( n=0; until [ -e "$STAGE/.done" ]; do sleep 2; n=$((n + 2)); [ $((n % 30)) -ne 0 ] || pack; done ) >/dev/null 2>&1 &
packer=$!
# budget NAME MIN CAP: sets T to the seconds step NAME may take (CAP, or less if less is left), or
# skips it (returns 1) when fewer than MIN are left
budget() {
  local l
  l=$(left)
  if [ "$l" -lt "$2" ]; then
    say "$1: skipped, $l s left before the deadline ($DEADLINE s) and it needs $2"
    return 1
  fi
  T=$(( l < $3 ? l : $3 ))
  say "$1: up to $T s"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
  nproc; } | tee -a "$LOG"
rc=0

if budget compare "${SESSION_MIN_COMPARE:-120}" $((${COMPARE_TIMEOUT:-330} + 30)); then
  mkdir -p "$STAGE/compare"
  # the cold run gets all but 30 s, which the warm run (seconds) may use
  OUT=$STAGE/compare COMPARE_SMOKE=0 COMPARE_TIMEOUT=$((T - 30)) COMPARE_WARM_TIMEOUT=25 \
    timeout $((T + 10)) bash benchmarks/gpu_compare.sh > "$STAGE/compare/gpu_compare.txt" 2>&1
  step=$?
  # gpu_compare.sh carries on past a cold run cut at its timeout (to the warm run): its exit line says
  cold=$(grep -aoE "^exit [0-9]+; cold wall" "$STAGE/compare/compare_cold.log" 2>/dev/null | grep -oE "[0-9]+")
  [ $step -ne 0 ] || [ "${cold:-0}" -eq 0 ] || step=$cold
  [ $step -eq 0 ] || rc=$step
  # each stage's time, the classifiers' accuracy and the totals of the cold run; the warm run's exit and wall
  grep -aE "^stage .* done in|accuracy|^total |^report|^exit |wall " "$STAGE/compare/compare_cold.log" 2>/dev/null \
    | tr '\r' '\n' | grep -avE "it/s|row/s" | tee -a "$LOG"
  grep -aE "^exit |wall " "$STAGE/compare/compare_warm.log" 2>/dev/null | tee -a "$LOG"
  say "compare: exit $step"
  [ -f "$STAGE/compare/report.html" ] && cp "$STAGE/compare/report.html" "$OUT/report.html"
  pack
fi

if budget models "${SESSION_MIN_MODELS:-60}" "$DEADLINE"; then      # all the time that is left
  mkdir -p "$STAGE/models"
  # gpu_check.sh empties its stage folder first: one of its own, inside this step's
  # shellcheck disable=SC2086  (SESSION_BENCH_ARGS: words for bench_models.py, e.g. --smoke)
  OUT=$STAGE/models GPU_CHECK_STAGE=$STAGE/models/stage timeout "$T" bash benchmarks/gpu_check.sh seed,lm,mfu \
    ${SESSION_BENCH_ARGS:-} \
    > "$STAGE/models/gpu_check.txt" 2>&1
  step=$?
  [ $step -eq 0 ] || rc=$step
  grep -ahE "test accuracy|tokens/s|ppl|part .* done|Error|error" "$STAGE/models/log_seed_lm_mfu.txt" 2>/dev/null \
    | tee -a "$LOG"
  say "models: exit $step"
fi

touch "$STAGE/.done" && wait "$packer"
pack && say "session files: $OUT/session.tar.gz ($(tar -tzf "$OUT/session.tar.gz" | grep -vc '/$') files), exit $rc"
exit $rc
