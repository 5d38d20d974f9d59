"""xgemm.jax.fp8: scaled_matmul in jit / vmap / export, and its custom_vjp: the fp8 operands get the
gradients of the dequantized operands (jax.grad of the float32 formula a_deq @ b_deq), optionally
with the incoming gradient quantized row-wise to e5m2, and the scales their exact gradients."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from xgemm import errors  # noqa: E402
from xgemm.jax import fp8  # noqa: E402

PAIRS = [("tensor", "tensor"), ("row", "col"), ("block_1x128", "block_128x128")]


def _operands(recipes, m=6, k=200, n=140, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((m, k)) * np.exp(rng.uniform(-3, 3, (m, 1))), jnp.float32)
    w = jnp.asarray(rng.standard_normal((k, n)) * np.exp(rng.uniform(-3, 3, (1, n))), jnp.float32)
    qa, sa = fp8.quantize_fp8(x, recipes[0])
    qb, sb = fp8.quantize_fp8(w, recipes[1])
    return qa, qb, sa, sb, jnp.asarray(rng.standard_normal(n), jnp.float32)


def _deq(q, s, block):
    s = s.reshape((1, 1)) if s.ndim == 0 else s
    r = jnp.arange(q.shape[0]) // block[0] if s.shape[0] > 1 else jnp.zeros(q.shape[0], int)
    c = jnp.arange(q.shape[1]) // block[1] if s.shape[1] > 1 else jnp.zeros(q.shape[1], int)
    return q.astype(jnp.float32) * s[r][:, c]


BLOCKS = {"tensor": ((10 ** 9, 10 ** 9), (10 ** 9, 10 ** 9)), "row": ((1, 10 ** 9), (10 ** 9, 1)),
          "block_1x128": ((1, 128), (128, 128))}


@pytest.mark.parametrize("recipes", PAIRS, ids=lambda p: p[0])
def test_grads_are_those_of_the_dequantized_formula(recipes):
    qa, qb, sa, sb, bias = _operands(recipes)
    g = jnp.asarray(np.random.default_rng(3).standard_normal((6, 140)), jnp.float32)
    loss = lambda a, b, bias: jnp.sum(fp8.scaled_matmul(a, b, sa, sb, bias=bias, out_dtype=jnp.float32) * g)
    da, db, dbias = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(qa, qb, bias)
    ba, bb = BLOCKS[recipes[0]]
    a_deq, b_deq = _deq(qa, sa, ba), _deq(qb, sb, bb)
    ref = jax.grad(lambda x, y, v: jnp.sum((jnp.matmul(x, y, precision="highest") + v) * g), argnums=(0, 1, 2))
    ra, rb, rbias = ref(a_deq, b_deq, bias)
    assert da.dtype == jnp.float32 and db.dtype == jnp.float32          # not fp8
    np.testing.assert_allclose(da, ra, rtol=1e-5, atol=1e-5 * float(jnp.abs(ra).max()))
    np.testing.assert_allclose(db, rb, rtol=1e-5, atol=1e-5 * float(jnp.abs(rb).max()))
    np.testing.assert_allclose(dbias, rbias, rtol=1e-5, atol=1e-6)
    # the scales: exact gradients of the same formula (they were zeros, silently)
    dsa, dsb = jax.jit(jax.grad(lambda s, t: jnp.sum(fp8.scaled_matmul(qa, qb, s, t, bias=bias, out_dtype=jnp.float32)
                                                     * g), argnums=(0, 1)))(sa, sb)
    rsa, rsb = jax.grad(lambda s, t: jnp.sum((jnp.matmul(_deq(qa, s, ba), _deq(qb, t, bb), precision="highest")
                                              + bias) * g), argnums=(0, 1))(sa, sb)
    assert dsa.shape == sa.shape and dsb.shape == sb.shape and np.any(rsa != 0)
    np.testing.assert_allclose(dsa, rsa, rtol=1e-4, atol=1e-5 * float(jnp.abs(rsa).max()))
    np.testing.assert_allclose(dsb, rsb, rtol=1e-4, atol=1e-5 * float(jnp.abs(rsb).max()))


def test_grads_come_in_bfloat16_by_default():
    qa, qb, sa, sb, _ = _operands(PAIRS[1])
    da = jax.grad(lambda a: jnp.sum(fp8.scaled_matmul(a, qb, sa, sb).astype(jnp.float32)))(qa)
    assert da.dtype == jnp.bfloat16


def test_e5m2_gradients_differ_by_at_most_e5m2_rounding():
    qa, qb, sa, sb, _ = _operands(PAIRS[2])
    g = jnp.asarray(np.random.default_rng(4).standard_normal((6, 140)) * np.exp(np.random.default_rng(5).uniform(
        -3, 3, (6, 1))), jnp.float32)

    def grads(grad_dtype):
        f = lambda a, b: jnp.sum(fp8.scaled_matmul(a, b, sa, sb, out_dtype=jnp.float32, grad_dtype=grad_dtype) * g)
        return jax.grad(f, argnums=(0, 1))(qa, qb)

    exact, e5 = grads(None), grads("float8_e5m2")
    a_deq, b_deq = _deq(qa, sa, (1, 128)), _deq(qb, sb, (128, 128))
    # |dg| <= 2^-3 |g| + subnormal rounding per row, so the products move by at most that through |b|, |a|
    row = jnp.abs(g).max(axis=1, keepdims=True) / 57344.0
    dg = 2.0 ** -3 * jnp.abs(g) + 2.0 ** -17 * row
    bound_a = dg @ jnp.abs(b_deq).T
    bound_b = jnp.abs(a_deq).T @ dg
    assert np.all(np.abs(e5[0] - exact[0]) <= bound_a * 1.001 + 1e-6)
    assert np.all(np.abs(e5[1] - exact[1]) <= bound_b * 1.001 + 1e-6)
    assert not np.allclose(e5[0], exact[0], rtol=1e-6)                 # the option does something


def test_vmap_and_jit():
    recipes = PAIRS[1]
    ops = [_operands(recipes, seed=s) for s in range(3)]
    qa, qb, sa, sb = (jnp.stack([o[i] for o in ops]) for i in range(4))
    f = jax.jit(jax.vmap(lambda a, b, s, t: fp8.scaled_matmul(a, b, s, t, out_dtype=jnp.float32)))
    y = f(qa, qb, sa, sb)
    for i, o in enumerate(ops):
        np.testing.assert_array_equal(y[i], fp8.scaled_matmul(*o[:4], out_dtype=jnp.float32))
    q = jax.vmap(lambda x: fp8.quantize_fp8(x, "block_1x128"))(jnp.ones((2, 3, 130)))
    assert q[0].shape == (2, 3, 130) and q[1].shape == (2, 3, 2)


def test_export_round_trip():
    qa, qb, sa, sb, bias = _operands(PAIRS[2])
    f = jax.jit(lambda a, b, s, t, v: fp8.scaled_matmul(a, b, s, t, bias=v))
    exp = jax.export.export(f)(qa, qb, sa, sb, bias)
    back = jax.export.deserialize(exp.serialize())
    np.testing.assert_array_equal(back.call(qa, qb, sa, sb, bias), f(qa, qb, sa, sb, bias))


def test_errors_are_typed_under_jit():
    qa, qb, sa, sb, _ = _operands(PAIRS[0])
    with pytest.raises(errors.ShapeError, match="match no recipe"):
        jax.jit(lambda a: fp8.scaled_matmul(a, qb, jnp.ones((6, 3), jnp.float32), sb))(qa)
    with pytest.raises(errors.DTypeError, match="grad_dtype"):
        fp8.scaled_matmul(qa, qb, sa, sb, grad_dtype="float8_e4m3fn")


def test_cuda_lowering_calls_the_promoting_fp8_class():
    """jit(scaled_matmul) lowered for cuda: tensor- and row-wise scales call cute_gemm_sm90's FP8
    class (one TVM-FFI custom call, b asked column-major, the scales as M / N vectors, tensor-wise
    ones as vectors of one value, no XLA dot);
    block-wise scales its block-scaled class, the scales in the layouts it loads (scale_a asked
    column-major, scale_b's rows padded to 4 floats: fp8_checks.kernel_block_scales)."""
    pytest.importorskip("cutlass")
    from xgemm import jax as xj
    m, k, n = 256, 512, 384
    a = jax.ShapeDtypeStruct((m, k), jnp.float8_e4m3fn)
    b = jax.ShapeDtypeStruct((k, n), jnp.float8_e4m3fn)
    f32 = jnp.float32
    for sa, sb, vectors in (((m, 1), (1, n), (m, n)), ((), (), (1, 1))):
        text = jax.jit(xj.scaled_matmul).trace(a, b, jax.ShapeDtypeStruct(sa, f32), jax.ShapeDtypeStruct(sb, f32)).lower(
            lowering_platforms=("cuda",)).as_text()
        (call,) = [ln for ln in text.splitlines() if "stablehlo.custom_call @xgemm_tvm_ffi_call" in ln]
        want = f"tensor<{m}x{k}xf8E4M3FN>, tensor<{k}x{n}xf8E4M3FN>, tensor<{vectors[0]}xf32>, tensor<{vectors[1]}xf32>"
        assert want in call, call
        assert "dot_general" not in text
    kb, nb = k // 128, n // 128
    block = jax.jit(xj.scaled_matmul).trace(a, b, jax.ShapeDtypeStruct((m, kb), f32),
                                            jax.ShapeDtypeStruct((kb, nb), f32)).lower(
        lowering_platforms=("cuda",)).as_text()
    (call,) = [ln for ln in block.splitlines() if "stablehlo.custom_call @xgemm_tvm_ffi_call" in ln]
    assert f"tensor<{m}x{k}xf8E4M3FN>, tensor<{k}x{n}xf8E4M3FN>, tensor<{m}x{kb}xf32>, tensor<{kb}x4xf32>" in call, call
    assert "operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[0, 1]> : tensor<2xindex>, dense<[0, 1]>" in call
    assert "dot_general" not in block
