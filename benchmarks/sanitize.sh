#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every kernel family and
# policy row (benchmarks/sanitize_cases.py says which), then a table per tool and kernel.
#
#   bash benchmarks/sanitize.sh [OUTDIR]     (default benchmarks/results/sanitize; on the GPU machine)
#
# Knobs: SAN_TOOLS (default all four), SAN_PARTS ("torch jax"), SAN_TIMEOUT (s per run, 600),
# SAN_CASES (a regex: only the cases whose label matches, sanitize_cases.py --cases),
# SAN_ONLY_OURS (tools that check only xgemm's kernels; default "racecheck initcheck"): their
# --kernel-regex matches CuTe-DSL's kernel_cutlass_* symbols and Gluon's xgemm_* ones, so torch's
# float64 reference products run uninstrumented (racecheck timed out in them at 8192 rows) and
# initcheck does not flag framework copies of results written by TMA stores, which it cannot see.
# Each (tool, part) runs in its own process; its log is OUTDIR/<tool>-<part>.log. Exit status 0
# only when every run printed "ERROR SUMMARY: 0 errors" and every output was right.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/sanitize}
mkdir -p "$out"
tools=${SAN_TOOLS:-memcheck racecheck synccheck initcheck}
parts=${SAN_PARTS:-torch jax}
# JAX must not take 75% of the GPU beside torch; XLA's autotuner would run its own kernels
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0"
for tool in $tools; do
  for part in $parts; do
    start=$(date +%s)
    extra=()
    [ "$tool" = racecheck ] && extra=(--racecheck-report all)
    case " ${SAN_ONLY_OURS-racecheck initcheck} " in *" $tool "*) extra+=(--kernel-regex "kns=cutlass|xgemm");; esac
    timeout "${SAN_TIMEOUT:-600}" compute-sanitizer --tool "$tool" "${extra[@]}" --print-limit 200 \
      python3 benchmarks/sanitize_cases.py --part "$part" --cases "${SAN_CASES:-}" > "$out/$tool-$part.log" 2>&1
    echo "$tool $part: rc $? in $(( $(date +%s) - start )) s; $(grep -ho 'ERROR SUMMARY.*' "$out/$tool-$part.log" | tail -1)"
  done
done
python3 benchmarks/sanitize_cases.py --report "$out"
