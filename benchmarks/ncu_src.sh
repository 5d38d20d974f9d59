#!/usr/bin/env bash
# Nsight Compute, source level: xgemm's and quack's GEMM kernel (one call each, benchmarks/one_gemm.py)
# with per-instruction SASS counters (instructions executed, warp-stall samples by reason), so the
# two kernels can be compared region by region (mainloop, epilogue, scheduler).
#   SHAPE=8192x8192x1024 bash benchmarks/ncu_src.sh      (on the H200; writes $OUT)
#   FP8=block IMPLS="xgemm cublas" SHAPE=8192x8192x8192 bash benchmarks/ncu_src.sh   (one_gemm.py --fp8:
#   xgemm.scaled_matmul against torch._scaled_mm; the names get -fp8<recipe>)
# Out: ncu_src_<impl>-h200.txt (the sections' details), ncu_src_<impl>-h200.csv.gz (`ncu --page source
# --csv --print-source sass`: one row per SASS instruction): the names kept in benchmarks/results/.
set -u
N=${NCU:-/usr/local/cuda/bin/ncu}
$N --version | tail -1
#   SPLITK=128,64,4,sk IMPLS=xgemm SHAPE=1x8192x8192 bash benchmarks/ncu_src.sh   (one_gemm.py --splitk:
#   a gluon_splitk_sm90 tile, split or stream-K; the names get -splitk<tile>)
tag=${FP8:+-fp8$FP8}${SPLITK:+-splitk${SPLITK//,/-}}
for impl in ${IMPLS:-xgemm quack}; do
  $N --clock-control none --nvtx --nvtx-include "prof/" --section WarpStateStats --section SourceCounters \
     --section SpeedOfLight --metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second \
     -o /tmp/ncu_$impl -f python3 benchmarks/one_gemm.py --impl $impl --shape ${SHAPE:-8192x8192x1024} \
     ${FP8:+--fp8 $FP8} ${SPLITK:+--splitk $SPLITK} > $OUT/ncu_run_$impl$tag.log 2>&1; echo "$impl$tag rc=$?"
  $N -i /tmp/ncu_$impl.ncu-rep --page details > $OUT/ncu_src_$impl$tag-h200.txt 2>&1
  $N -i /tmp/ncu_$impl.ncu-rep --page source --csv --print-source sass > /tmp/src_$impl.csv 2>$OUT/src_err_$impl$tag.txt
  echo "source rc=$? $(wc -l < /tmp/src_$impl.csv) lines"
  gzip -c /tmp/src_$impl.csv > $OUT/ncu_src_$impl$tag-h200.csv.gz
done
grep -h "Duration\|Warp Cycles Per Issued\|inst_executed\|SM Frequency" $OUT/ncu_src_*-h200.txt
