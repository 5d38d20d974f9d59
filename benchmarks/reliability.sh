#!/usr/bin/env bash
# Issue 22's H200 run: the GPU tests, the examples, the fuzzer at scale, the sanitizers, the soak.
# Logs and JSON land in $OUT (the device tool's folder; default /tmp/xgemm-reliability).
#   carry: .gpu <cache tarball>        (docs/development.md: make-bundle, build-cache --pack)
# Knobs (0 skips a stage): CACHE_TAR (.cache/xgemm-cache.tar.xz), TESTS_S (300), TESTS (tests/gpu),
# EXAMPLES (1), FUZZ_CASES (20000), FUZZ_S (per-worker budget, 240), FUZZ_WORKERS (12), FUZZ_SEED (1),
# SAN (1; SAN_TOOLS / SAN_PARTS / SAN_TIMEOUT as in sanitize.sh), SOAK (1; SOAK_EAGER, SOAK_JIT).
set -u
OUT=${OUT:-/tmp/xgemm-reliability}; mkdir -p "$OUT"
source .gpu/use-bundle .gpu
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p /tmp/xc && tar -xJf "${CACHE_TAR:-.cache/xgemm-cache.tar.xz}" -C /tmp/xc && export XGEMM_CACHE_DIR=/tmp/xc
t0=$SECONDS
stage() { echo "== $1: rc $2, $((SECONDS - t0)) s"; }
timeout 300 python3 -c "from xgemm.runtime import cute_cache as c; print(len(c.prebuild(jobs=16)), 'CuTe classes')" \
  > "$OUT/prebuild.log" 2>&1; stage prebuild $?
if [ "${TESTS_S:-300}" != 0 ]; then
  FUZZ_EXAMPLES=${FUZZ_EXAMPLES:-25} timeout "${TESTS_S:-300}" python3 -m pytest -q -p no:cacheprovider -n 4 \
    --timeout=300 ${TESTS:-tests/gpu} > "$OUT/tests.log" 2>&1; stage tests $?; tail -3 "$OUT/tests.log"
fi
if [ "${EXAMPLES:-1}" != 0 ]; then
  for f in examples/*.py; do timeout 120 python3 "$f" > "$OUT/example-$(basename "$f" .py).log" 2>&1; stage "$f" $?; done
fi
if [ "${FUZZ_CASES:-20000}" != 0 ]; then
  timeout $(( ${FUZZ_S:-240} + 120 )) python3 benchmarks/fuzz.py --cases "${FUZZ_CASES:-20000}" --seed "${FUZZ_SEED:-1}" \
    --workers "${FUZZ_WORKERS:-12}" --budget-s "${FUZZ_S:-240}" --json "$OUT/fuzz.json" > "$OUT/fuzz.log" 2>&1
  stage fuzz $?; head -40 "$OUT/fuzz.log"
fi
if [ "${SAN:-1}" != 0 ]; then bash benchmarks/sanitize.sh "$OUT/sanitize" > "$OUT/sanitize.log" 2>&1; stage sanitize $?; cat "$OUT/sanitize.log"; fi
if [ "${SOAK:-1}" != 0 ]; then
  timeout 400 python3 benchmarks/soak.py --eager "${SOAK_EAGER:-1000000}" --jit "${SOAK_JIT:-100000}" \
    --json "$OUT/soak.json" > "$OUT/soak.log" 2>&1; stage soak $?; tail -6 "$OUT/soak.log"
fi
