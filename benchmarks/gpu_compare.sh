#!/usr/bin/env bash
# One GPU check of `python -m distattn.compare --profile full` (run on the device machine):
# environment, a smoke test of the compiled kernels there, then the full profile cold and warm.
# Logs and the report land in $OUT. The IMDB archive is expected in .gpu/ (carried). The stage
# cache ($COMPARE_CACHE, default /tmp/dacache) is emptied first, so that the cold run is cold.
# COMPARE_TIMEOUT (default 520) and COMPARE_WARM_TIMEOUT (default 0: none) bound the two runs;
# COMPARE_SMOKE=0 leaves the smoke test out (benchmarks/gpu_session.sh, whose call has no time for it).
# COMPARE_PROFILE (default full) is there for a rehearsal on a CPU (quick): the same steps, small.
set -o pipefail
export PYTHONPATH=$PWD DISTATTN_DATA_DIR=$PWD/.gpu DISTATTN_CACHE_DIR=${COMPARE_CACHE:-/tmp/dacache} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
COMPARE_RUNS=${COMPARE_RUNS:-/tmp/runs}
mkdir -p "$OUT" "$COMPARE_RUNS"
# a warm device machine keeps /tmp between calls: an earlier call's stage cache would make this
# call's "cold" run a warm one, and its run directories are older than this call's (the report
# copied is the first one finished after this marker, never an earlier call's)
rm -rf "$DISTATTN_CACHE_DIR"
STARTED=$(mktemp)
# seconds since $1 (python3, not bc: the device image need not have bc)
since() { python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 2))" "$1"; }
# the report, metrics and config of the first finished run (the cold one; the warm one when the
# cold run was cut by the timeout and left a directory without a report)
copy_report() {
  local report r
  while IFS= read -r r; do
    [ "$r" -nt "$STARTED" ] && { report=$r; break; }
  done < <(ls -tr "$COMPARE_RUNS"/imdb-*/report.html 2>/dev/null)
  [ -n "$report" ] || { echo "no run of this call finished under $COMPARE_RUNS: no report to copy"; return 1; }
  cp "$(dirname "$report")"/{report.html,metrics.json,config.json} "$OUT"/ && echo "report of $(dirname "$report")"
}
python3 -c "import numba, llvmlite, torch; print('numba', numba.__version__, 'llvmlite', llvmlite.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))" 2>&1 | tee $OUT/env.txt
nproc | tee -a $OUT/env.txt
# not the IMDB tests: with the archive carried, one tokenizes the whole corpus (time the call's 600 s
# limit does not have beside the compare's 520 s); pytest's exit status decides, not words in its output
if [ "${COMPARE_SMOKE:-1}" != 0 ]; then
  python3 -m pytest -q -x -p no:cacheprovider -m "not imdb" tests/test_cooccurrence.py tests/test_nexttoken.py \
      tests/test_projection_core.py tests/test_torch_rows.py > $OUT/smoke_full.txt 2>&1
  smoke_rc=$?
  tail -3 $OUT/smoke_full.txt | tee $OUT/smoke.txt && rm -f $OUT/smoke_full.txt
  [ $smoke_rc -eq 0 ] || { echo "smoke test failed (pytest exit $smoke_rc); not running compare"; exit 1; }
fi
start=$(date +%s.%N)
# the stage log (no -q) goes to a file, its stage lines to the terminal; a run cut by the
# timeout still leaves every finished stage's time in the log
timeout ${COMPARE_TIMEOUT:-520} python3 -m distattn.compare --corpus imdb --profile "${COMPARE_PROFILE:-full}" --out "$COMPARE_RUNS" \
    > $OUT/compare_cold.log 2>&1
echo "exit $?; cold wall $(since "$start") s" | tee -a $OUT/compare_cold.log
grep -aE "stage|analysis |ppl|report" $OUT/compare_cold.log | tr '\r' '\n' | grep -avE "it/s|row/s" | tail -40
copy_report      # now, so that a warm run cut by the call's limit still leaves the cold run's report
start=$(date +%s.%N)
timeout ${COMPARE_WARM_TIMEOUT:-0} python3 -m distattn.compare --corpus imdb --profile "${COMPARE_PROFILE:-full}" --out "$COMPARE_RUNS" -q 2>&1 \
    | tail -3 | tee $OUT/compare_warm.log
echo "exit ${PIPESTATUS[0]}" | tee -a $OUT/compare_warm.log
echo "warm wall $(since "$start") s" | tee -a $OUT/compare_warm.log
[ -f "$OUT/report.html" ] || copy_report
