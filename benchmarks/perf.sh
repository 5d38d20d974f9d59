#!/usr/bin/env bash
# One H200 call for the model-layer benchmarks (issues 20, 21, 23, 24): prebuild, the GPU tests, then
# decode.py, model_shapes.py, the short-row softmax sweep, epilogue.py, fp8.py and grouped.py, each
# capped so that the whole run ends before DEADLINE and the logs still come back.
# What it prints goes to $OUT/summary.txt too; logs and JSON are packed into $OUT/logs.tar.xz (the
# device tool brings back only a few files from $OUT).
#   carry: .gpu <cache tarball>        (docs/development.md: make-bundle, build-cache --pack)
# Knobs: CACHE_TAR (.cache/xgemm-cache.tar.xz), DEADLINE (s, 560), STAGES (default
# "tests decode model softmax epilogue fp8 grouped fuzz"; also gemm (GEMM_SHAPES, GEMM_S), groupedtune (GROUPEDTUNE_S), groupedorder (GROUPEDORDER_S), fp8tune, and the policy
# sweeps longk (LONGK_SHAPES), splitk (SPLITK_SHAPES, SPLITK_S) and cutesplit (CUTESPLIT_SHAPES, CUTESPLIT_S)), TESTS (tests/gpu), TESTS_S (220), MODEL_SUBSET (core),
# MODEL_JIT (jit), MODEL_ARGS (more model_shapes.py options, e.g. --jit-kernel-time), SOFTMAX_SIZES (1000,1536,3000,4095,4096), SOFTMAX_DTYPES (float16,bfloat16),
# FUZZ_S (60), FUZZ_SEED (3), SWITCHES (exported for the benchmarks and the fuzzer: code still switched
# off, docs/development.md; default none, e.g. "XGEMM_DECODE=1").
set -u
OUT=${OUT:-/tmp/xgemm-perf}
source benchmarks/gpu/device-call.sh      # LOGS, summary.txt, the bundle, the cache; pack_logs
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
t0=$SECONDS
deadline=${DEADLINE:-560}
# stage NAME MAX_S CMD...: runs CMD under the smaller of MAX_S and the time left, log in $LOGS/NAME.log
stage() {
  local name=$1 max=$2; shift 2
  local left=$(( deadline - (SECONDS - t0) ))
  [ "$left" -lt 20 ] && { echo "== $name: skipped, $left s left"; return; }
  [ "$max" -gt "$left" ] && max=$left
  local start rc; start=$(date +%s)
  timeout "$max" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  echo "== $name: rc $rc, done at $((SECONDS - t0)) s (cap $max s); $(clocks "$start" "$(date +%s)")"
}
want() { case " ${STAGES:-tests decode model softmax epilogue fp8 grouped fuzz} " in *" $1 "*) return 0;; esac; return 1; }
stage prebuild 240 python3 -c "from xgemm.runtime import cute_cache as c; print(len(c.prebuild(jobs=16)), 'CuTe classes')"
tail -1 "$LOGS/prebuild.log"
if want tests; then
  # -v: each result is logged as it lands, so a run cut at the cap still names its failures
  stage tests "${TESTS_S:-220}" python3 -m pytest -v -p no:cacheprovider -n 4 --timeout=200 ${TESTS:-tests/gpu}
  grep -E "(FAILED|ERROR) tests/" "$LOGS/tests.log" | sed 's/^.*\(FAILED\|ERROR\) /\1 /' | sort -u | head -20
  grep -cE "PASSED tests/" "$LOGS/tests.log" | sed 's/$/ passed/'; tail -1 "$LOGS/tests.log"
fi
R=$LOGS/results; mkdir -p "$R"
# the benchmarks measure the code still switched off (docs/development.md) with it on; their own
# checks of every timed output say whether it is right
switches=${SWITCHES-}
[ -n "$switches" ] && export $switches && echo "switched on for the benchmarks: $switches"
if want decode; then stage decode 120 python3 benchmarks/decode.py --out "$R"; tail -25 "$LOGS/decode.log"; fi
if want model; then
  stage model 200 python3 benchmarks/model_shapes.py --subset "${MODEL_SUBSET:-core}" --jit-subset "${MODEL_JIT:-jit}" \
    --budget-s 150 --out "$R" ${MODEL_ARGS:-}
  grep -iE "summary|geomean|median|worst|below|skipped|jit kernel time" "$LOGS/model.log" | head -60
fi
if want softmax; then
  stage softmax 90 python3 benchmarks/softmax.py --sizes "${SOFTMAX_SIZES:-1000,1536,3000,4095,4096}" \
    --dtypes "${SOFTMAX_DTYPES:-float16,bfloat16}" --bytes 0.5 --tune --out "$R" --name softmax-short-h200
  tail -30 "$LOGS/softmax.log"
fi
if want groupedorder; then
  # the Zipf forward at the same group sizes in other expert orders, each beside the dense matmul
  stage groupedorder "${GROUPEDORDER_S:-120}" python3 benchmarks/grouped.py --only order --out "$R/order"
  grep -E " vs " "$LOGS/groupedorder.log" | tail -20
fi
for b in epilogue fp8 grouped; do
  if want $b; then stage $b 130 python3 benchmarks/$b.py --out "$R"; tail -32 "$LOGS/$b.log"; fi
done
if want gemm; then
  # the dense kernel against cuBLAS and quack (gemm.py's two large shapes and the grouped Zipf case's
  # dense product): a regression check for edits of the compiled classes made for other products
  stage gemm "${GEMM_S:-120}" python3 benchmarks/gemm_tc.py --shapes "${GEMM_SHAPES:-8192x8192x8192,8192x8192x1024,65536x4096x4096}" \
    --dtypes bfloat16 --impls cublas,quack,xgemm --out "$R/gemm.json"
  grep -E "^\|" "$LOGS/gemm.log" | tail -6
fi
if want fp8tune; then
  # the promoting FP8 class at each tile width, then the quantize kernel at each prebuilt candidate
  # (results/tune-fp8; the quantize candidates are built on request)
  stage fp8tune 150 python3 benchmarks/fp8.py --only tune --out "$R/tune-fp8"
  tail -24 "$LOGS/fp8tune.log"
fi
if want groupedtune; then
  # the grouped kernel at each prebuilt tile candidate (results/tune; the candidates are built on request)
  stage groupedtune "${GROUPEDTUNE_S:-120}" python3 benchmarks/grouped.py --only tune --out "$R/tune"
  tail -16 "$LOGS/groupedtune.log"
fi
if want longk; then
  # cute_gemm_sm90's 128x192 and 128x128 tiles (transposed run) where the wave model prefers 128x128
  stage longk 150 python3 benchmarks/gemm_tc.py --shapes "${LONGK_SHAPES:-4096x8192x57344,4096x57344x8192,4096x29568x8192,4096x8192x29568}" \
    --dtypes bfloat16 --sweep --sweep-set long --reps 6 --trials 5 --out "$R/longk.json"
  grep -E "^\|" "$LOGS/longk.log" | tail -8
fi
if want splitk; then
  # gluon_splitk_sm90's tiles x splits on decode shapes (B row-major, bf16)
  stage splitk "${SPLITK_S:-120}" python3 benchmarks/gemm_tc.py --shapes "${SPLITK_SHAPES:-1x18432x7168,1x24576x1536,1x57344x8192,1x8192x28672,16x8192x8192,64x4096x4096}" \
    --dtypes bfloat16 --impls cublas,xgemm --sweep --sweep-set splitk --reps 20 --trials 5 --out "$R/splitk.json"
  grep -E "^\|" "$LOGS/splitk.log" | tail -8
fi
if want cutesplit; then
  # cute_gemm_sm90's split-K parts on the policy's split picks (B row-major, bf16, run as given)
  stage cutesplit "${CUTESPLIT_S:-150}" python3 benchmarks/gemm_tc.py --shapes "${CUTESPLIT_SHAPES:-4096x576x7168,7168x576x4096,512x1536x7168,512x512x32768}" \
    --dtypes bfloat16 --impls cublas,quack,xgemm --sweep --sweep-set cutesplit --reps 20 --trials 5 --out "$R/cutesplit.json"
  grep -E "^\|" "$LOGS/cutesplit.log" | tail -8
fi
if want fuzz; then
  # the switched-on code under the fuzzer's torch cases (FP8, fused epilogues), a short budget
  stage fuzz $(( ${FUZZ_S:-60} + 60 )) python3 benchmarks/fuzz.py --cases 24000 --seed "${FUZZ_SEED:-3}" --workers 12 \
    --frameworks torch --budget-s "${FUZZ_S:-60}" --json "$LOGS/fuzz.json"
  tail -8 "$LOGS/fuzz.log"
fi
pack_logs
echo "total $((SECONDS - t0)) s"
