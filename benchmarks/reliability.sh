#!/usr/bin/env bash
# Issue 22's H200 run: the GPU tests, the examples, the sanitizers, the soak, the fuzzer at scale.
# What it prints goes to $OUT/summary.txt too, and every log and JSON into one $OUT/logs.tar.xz: the
# device tool brings back only a few files from $OUT (default /tmp/xgemm-reliability).
#   carry: .gpu <cache tarball>        (docs/development.md: make-bundle, build-cache --pack)
# Knobs (0 skips a stage): CACHE_TAR (.cache/xgemm-cache.tar.xz), TESTS_S (300), TESTS (tests/gpu),
# EXAMPLES (1), SAN (1; SAN_TOOLS / SAN_PARTS / SAN_TIMEOUT as in sanitize.sh), SOAK (1; SOAK_EAGER,
# SOAK_JIT), SAN_WITH_FUZZ (0), FUZZ_CASES (20000), FUZZ_WORKERS (12), FUZZ_SEED (1), FUZZ_SKIP (0: each worker's cases to skip,
# so a second run of a seed adds new ones), DEADLINE (s, 570): the fuzzer's
# workers stop drawing cases DEADLINE - 90 s after the start (compiles of new classes may run over).
set -u
OUT=${OUT:-/tmp/xgemm-reliability}
source benchmarks/gpu/device-call.sh      # LOGS, summary.txt, the bundle, the cache; pack_logs
t0=$SECONDS
stage() { echo "== $1: rc $2, $((SECONDS - t0)) s"; }
timeout 300 python3 -c "from xgemm.runtime import cute_cache as c; print(len(c.prebuild(jobs=16)), 'CuTe classes')" \
  > "$LOGS/prebuild.log" 2>&1; stage prebuild $?
if [ "${TESTS_S:-300}" != 0 ]; then
  FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-25} timeout "${TESTS_S:-300}" python3 -m pytest -q -p no:cacheprovider -n 4 \
    --timeout=300 ${TESTS:-tests/gpu} > "$LOGS/tests.log" 2>&1; stage tests $?; tail -3 "$LOGS/tests.log"
fi
if [ "${EXAMPLES:-1}" != 0 ]; then
  for f in examples/*.py; do timeout 120 python3 "$f" > "$LOGS/example-$(basename "$f" .py).log" 2>&1; stage "$f" $?; done
fi
# sanitize [CAP_S]: benchmarks/sanitize.sh, stopped after CAP_S when given (beside the fuzzer, so
# that the final wait and pack_logs still come before DEADLINE: a run that the device tool's
# limit kills brings back no logs, as the 2026-12-02 racecheck did)
sanitize() {
  if [ -n "${1:-}" ]; then timeout "$1" bash benchmarks/sanitize.sh "$LOGS/sanitize" > "$LOGS/sanitize.log" 2>&1
  else bash benchmarks/sanitize.sh "$LOGS/sanitize" > "$LOGS/sanitize.log" 2>&1; fi
  stage sanitize $?; cat "$LOGS/sanitize.log"
}
# SAN_WITH_FUZZ=1: the sanitizers run beside the fuzzer (one process and its GPU work beside the
# fuzzer's CPU-bound workers; neither is a timing)
if [ "${SAN:-1}" != 0 ] && [ "${SAN_WITH_FUZZ:-0}" = 0 ]; then sanitize; fi
if [ "${SOAK:-1}" != 0 ]; then
  timeout 400 python3 benchmarks/soak.py --eager "${SOAK_EAGER:-1000000}" --jit "${SOAK_JIT:-100000}" \
    --json "$LOGS/soak.json" > "$LOGS/soak.log" 2>&1; stage soak $?; tail -4 "$LOGS/soak.log"
fi
san_pid=
if [ "${SAN:-1}" != 0 ] && [ "${SAN_WITH_FUZZ:-0}" = 1 ]; then
  sanitize $(( ${DEADLINE:-570} - 20 - (SECONDS - t0) )) & san_pid=$!
fi
if [ "${FUZZ_CASES:-20000}" != 0 ]; then
  budget=$(( ${DEADLINE:-570} - 90 - (SECONDS - t0) ))
  if [ "$budget" -gt 20 ]; then
    timeout $(( budget + 75 )) python3 benchmarks/fuzz.py --cases "${FUZZ_CASES:-20000}" --seed "${FUZZ_SEED:-1}" --skip "${FUZZ_SKIP:-0}" \
      --workers "${FUZZ_WORKERS:-12}" --budget-s "$budget" --json "$LOGS/fuzz.json" > "$LOGS/fuzz.log" 2>&1
    rc=$?
    [ -f "$LOGS/fuzz.json" ] || python3 benchmarks/fuzz.py --merge "$LOGS" --json "$LOGS/fuzz.json" > "$LOGS/fuzz-merged.log" 2>&1
    stage "fuzz (budget $budget s)" $rc; grep -v "compiling\|CacheWarning\|cache.corrupt" "$LOGS/fuzz.log" | head -45
    [ -f "$LOGS/fuzz-merged.log" ] && head -45 "$LOGS/fuzz-merged.log"
  fi
fi
# the sanitizers' job only: a bare `wait` also waits for the `tee` of device-call.sh's process
# substitution ($! when no job was started), which never ends; two 2026-12-02 calls hung in it
# until the device tool's limit, and their logs never got packed
[ -n "$san_pid" ] && wait "$san_pid"
pack_logs
