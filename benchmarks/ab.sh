#!/usr/bin/env bash
# Two checkouts' benchmarks side by side in one H200 call, each with its own build cache, so a
# change that should not move performance (a refactor) can be checked against the commit before it:
#   git archive BASE_COMMIT xgemm ffi benchmarks tests | (mkdir -p .ab/base && tar -x -C .ab/base)
#   (cd .ab/base && XGEMM_CACHE_DIR=$PWD/../cache-base python -m xgemm build-cache --pack ../base.tar.xz)
#   python -m xgemm build-cache --pack .ab/head.tar.xz
#   device run, carrying .gpu and .ab:   bash benchmarks/ab.sh
# Each benchmark (first_call, overhead, gemm, softmax, jax_jit, grouped: its Zipf forward, every
# grouped candidate and the dense matmul beside it) runs on base, then head, then (gemm and
# overhead) base and head again; every script writes its JSON under $OUT/{base,head}{,2}, and
# benchmarks/compare.py prints the ratios.
# Knobs: GEMM_TRIALS (6), AB_ROUNDS (2: rounds of gemm and overhead), SOFTMAX_SIZES, AB_SKIP (names of
# benchmarks to leave out), AB_TIMEOUT (150 s per script).
set -u
source .gpu/use-bundle .gpu
export PYTHONUNBUFFERED=1
HEAD=$PWD
for side in base head; do
  mkdir -p /tmp/ab-cache-$side && tar -xJf .ab/$side.tar.xz -C /tmp/ab-cache-$side
done
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
run() {   # run SIDE DIR_SUFFIX SCRIPT ARGS...: the script of that checkout, on its own package and cache
  local side=$1 suffix=$2; shift 2
  local root=$HEAD; [ "$side" = base ] && root=$HEAD/.ab/base
  mkdir -p $OUT/$side$suffix
  (cd $root && PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} XGEMM_CACHE_DIR=/tmp/ab-cache-$side \
     timeout ${AB_TIMEOUT:-150} python3 "$@" --out $OUT/$side$suffix) > $OUT/$side$suffix/$(basename $1 .py).log 2>&1
  echo "$side$suffix $(basename $1) rc=$? $SECONDS s"
}
skip() { [[ " ${AB_SKIP:-} " == *" $1 "* ]]; }
skip first_call || { run base "" benchmarks/first_call.py --runs 5; run head "" benchmarks/first_call.py --runs 5; }
rounds=""; [ "${AB_ROUNDS:-2}" -ge 2 ] && rounds=2
skip overhead || for r in "" $rounds; do run base "$r" benchmarks/overhead.py; run head "$r" benchmarks/overhead.py; done
skip gemm || for r in "" $rounds; do run base "$r" benchmarks/gemm.py --trials ${GEMM_TRIALS:-6}; run head "$r" benchmarks/gemm.py --trials ${GEMM_TRIALS:-6}; done
skip softmax || { run base "" benchmarks/softmax.py --sizes ${SOFTMAX_SIZES:-256,4096,65536,262144}; run head "" benchmarks/softmax.py --sizes ${SOFTMAX_SIZES:-256,4096,65536,262144}; }
skip jax_jit || { run base "" benchmarks/jax_jit.py --name jax-h200 --only chain,gemm,softmax; run head "" benchmarks/jax_jit.py --name jax-h200 --only chain,gemm,softmax; }
skip grouped || { run base "" benchmarks/grouped.py --only zipf; run head "" benchmarks/grouped.py --only zipf; }
for r in "" 2; do [ -d $OUT/base$r ] && python3 benchmarks/compare.py $OUT/base$r $OUT/head$r --json $OUT/compare$r.json > $OUT/compare$r.txt; done
tar -czf $OUT/ab-logs.tgz -C $OUT base head $(ls -d $OUT/base2 $OUT/head2 2>/dev/null | xargs -n1 basename) && rm -rf $OUT/base $OUT/head $OUT/base2 $OUT/head2
cat $OUT/compare.txt $OUT/compare2.txt 2>/dev/null | grep -v "^ *$"
