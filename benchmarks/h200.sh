#!/usr/bin/env bash
# One H200 session: build the CuTe cache there, run the GPU tests of the public API and JAX,
# then the JAX, host-overhead and fp32 GEMM benchmarks. Logs and JSON land in $OUT.
#   carry: .gpu .cache/xgemm-cache.tar.xz     (`python -m xgemm build-cache --pack` writes it; docs/development.md)
# Knobs: GLUON_TAR (the tarball of a build-cache dir: gluon cubins, CuTe objects), PREBUILD_S,
# TESTS, PYTEST_X (empty: no -x), TEST_S, NATIVE=0, OVERHEAD=0, SGEMM_SHAPES, EXTRA (eval'd), RUN_JAX=0.
set -u
source .gpu/use-bundle .gpu
# the scripts import xgemm from the environment (they no longer put the checkout on sys.path)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
mkdir -p /tmp/xc && tar -xJf ${GLUON_TAR:-.cache/xgemm-cache.tar.xz} -C /tmp/xc && export XGEMM_CACHE_DIR=/tmp/xc
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
t0=$SECONDS
timeout ${PREBUILD_S:-300} python3 -c "from xgemm.runtime import cute_cache as c; print(len(c.prebuild(jobs=16)), 'CuTe classes')" > $OUT/prebuild.log 2>&1; tail -1 $OUT/prebuild.log
echo "prebuild $((SECONDS-t0)) s"
# the native torch fast path is built against this machine's torch (xgemm/torch_native.py)
[ "${NATIVE:-1}" = 1 ] && { python3 -c "from xgemm.torch import native as t; t.load(); print('native torch fast path:', t.status())" 2>&1 | tail -2; echo "native build done $((SECONDS-t0)) s"; }
timeout ${TEST_S:-170} python3 -m pytest -q -p no:cacheprovider ${PYTEST_X--x} --timeout=60 ${TESTS:-tests/gpu/test_api_gpu.py tests/gpu/test_jax_gpu.py} > $OUT/tests.log 2>&1; echo "tests rc=$? $((SECONDS-t0)) s"; tail -4 $OUT/tests.log
[ "${OVERHEAD:-1}" = 1 ] && timeout 90 python3 benchmarks/overhead.py --out $OUT 2>&1 | tail -8
[ -n "${SGEMM_SHAPES:-}" ] && timeout 150 python3 benchmarks/gemm_sgemm.py --no-overhead --out $OUT --shapes $SGEMM_SHAPES 2>&1 | tail -12
[ -n "${EXTRA:-}" ] && eval "$EXTRA"
[ "${RUN_JAX:-1}" = 1 ] || exit 0
timeout ${JAX_S:-150} python3 benchmarks/jax_jit.py --out $OUT --name jax-h200 > $OUT/jax.log 2>&1; echo "jax bench rc=$? $((SECONDS-t0)) s"; tail -15 $OUT/jax.log
