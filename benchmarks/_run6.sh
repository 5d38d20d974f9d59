timeout 150 python3 benchmarks/softmax.py --sizes 65536,262144 --tune --peers quack --out $OUT --name softmax-o3 > $OUT/softmax.log 2>&1; echo "softmax rc=$?"
grep -E "tune|xgemm|quack|copy" $OUT/softmax.log | sed -e 's/  */ /g' | tail -30
timeout 200 python3 benchmarks/gemm_tc.py --shapes 8192x8192x8192,8192x8192x1024 --dtypes bfloat16,float16 --impls cublas,quack,xgemm --sweep --sweep-dtypes bfloat16,float16 --sweep-set epi --trials 9 --out $OUT/gemm_epi-h200.json > $OUT/gemm_epi.log 2>&1; echo "epi rc=$?"
grep -v "^|" $OUT/gemm_epi.log | awk '{print $1, $2, $3, $4, $5, $6, $7}' | grep -v "^$" | tail -24
