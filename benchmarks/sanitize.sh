#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck, synccheck and initcheck over every kernel family and
# policy row (benchmarks/sanitize_cases.py says which), then a table per tool and kernel.
#
#   bash benchmarks/sanitize.sh [OUTDIR]     (default benchmarks/results/sanitize; on the GPU machine)
#
# Knobs: SAN_TOOLS (default all four), SAN_PARTS ("torch jax"), SAN_TIMEOUT (s per run, 600), SAN_CONTROL (1),
# SAN_EXTRA (options added to every run),
# SAN_CASES (a regex: only the cases whose label matches, sanitize_cases.py --cases),
# SAN_ONLY_OURS (tools that check only xgemm's kernels; default "racecheck initcheck"): their
# --kernel-regex matches CuTe-DSL's kernel_cutlass_* symbols and Gluon's xgemm_* ones, so torch's
# float64 reference products run uninstrumented (racecheck timed out in them at 8192 rows), and so
# do cuBLAS's own CUTLASS kernels (cutlass3x_sm90_*: a bare "cutlass" matched them, and racecheck
# failed on a wgmma one inside the gate op's case, H200 2026-12-02), and
# initcheck does not flag framework copies of results written by TMA stores, which it cannot see.
# The same filter leaves the writes of the framework's kernels untracked, so initcheck's host-API
# check flagged every readback of a torch reduction in the harness (sanitize_cases.py's _check: 2
# per case, 44 in the torch part, 197 in JAX's start-up, H200 2026-12-02): initcheck runs with
# --check-api-memory-access no, and the outputs' values (NaN-poisoned, checked) cover the copies.
# memcheck's API errors from cuda-bindings' driver symbol probes are listed apart (is_probe).
# Each (tool, part) runs in its own process; its log is OUTDIR/<tool>-<part>.log. Exit status 0
# only when every run finished with no error but driver symbol probes and every output was right.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/sanitize}
mkdir -p "$out"
tools=${SAN_TOOLS:-memcheck racecheck synccheck initcheck}
# racecheck stops at the first wgmma kernel unless told not to check wgmma's operands
# (docs/development.md): with the option it instruments every other shared-memory access
racecheck_opts=(--racecheck-report all --check-warpgroup-mma no)
parts=${SAN_PARTS:-torch jax}
# JAX must not take 75% of the GPU beside torch; XLA's autotuner would run its own kernels
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0"
for tool in $tools; do
  for part in $parts; do
    start=$(date +%s)
    extra=()
    [ "$tool" = racecheck ] && extra=("${racecheck_opts[@]}")
    case " ${SAN_ONLY_OURS-racecheck initcheck} " in
      *" $tool "*) extra+=(--kernel-regex "kns=kernel_cutlass|xgemm")
                   [ "$tool" = initcheck ] && extra+=(--check-api-memory-access no);;
    esac
    # SAN_EXTRA: more compute-sanitizer options for every run (e.g. "--racecheck-memcpy-async no")
    timeout "${SAN_TIMEOUT:-600}" compute-sanitizer --tool "$tool" "${extra[@]}" ${SAN_EXTRA:-} --print-limit 200 \
      python3 benchmarks/sanitize_cases.py --part "$part" --cases "${SAN_CASES:-}" > "$out/$tool-$part.log" 2>&1
    echo "$tool $part: rc $? in $(( $(date +%s) - start )) s; $(grep -ho 'ERROR SUMMARY.*' "$out/$tool-$part.log" | tail -1)"
  done
done
# SAN_CONTROL=1: racecheck on our cluster probes, then on the peers' GEMMs (cuBLAS, quack), unfiltered: what the tool says about
# Hopper kernels that are not ours, in the same run (reported, not counted)
if [ "${SAN_CONTROL:-1}" = 1 ] && [[ " $tools " == *" racecheck "* ]]; then
  # a trivial kernel of our own (shared memory and bar.sync only), unclustered and in 2-CTA clusters,
  # with the same options as the cases: whether the tool itself fails on cluster launches
  # (and in 2-CTA clusters through distributed shared memory)
  for probe in cluster1 cluster2 dsmem2; do
    timeout "${SAN_TIMEOUT:-600}" compute-sanitizer --tool racecheck "${racecheck_opts[@]}" ${SAN_EXTRA:-} \
      --print-limit 20 python3 benchmarks/sanitize_cases.py --part $probe > "$out/racecheck-$probe-control.log" 2>&1
    echo "racecheck $probe probe: rc $?; $(grep -ho 'Internal Sanitizer Error.*\|RACECHECK SUMMARY.*\|    ok.*\|    WRONG.*' "$out/racecheck-$probe-control.log" | head -3 | tr '\n' ' ')"
  done
  timeout "${SAN_TIMEOUT:-600}" compute-sanitizer --tool racecheck "${racecheck_opts[@]}" --print-limit 20 \
    python3 benchmarks/sanitize_cases.py --part control > "$out/racecheck-control.log" 2>&1
  echo "racecheck control: rc $?; $(grep -ho 'RACECHECK SUMMARY.*\|ERROR SUMMARY.*' "$out/racecheck-control.log" | tail -1)"
fi
python3 benchmarks/sanitize_cases.py --report "$out"
