"""Array-API generic code gets xgemm's matmul through xgemm.array_api.namespace."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import to_f64
from helpers import FRAMEWORKS, make

import xgemm


def generic_attention(xp, q, k, v):
    """Code that knows only the array API standard."""
    scores = xp.matmul(q, xp.permute_dims(k, (1, 0))) / 2.0
    return xp.matmul(xp.softmax(scores, axis=-1), v)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_generic_code_runs_on_xgemm(fw, monkeypatch):
    rng = np.random.default_rng(1)
    qv, kv, vv = (rng.standard_normal((6, 4)) for _ in range(3))
    q, k, v = (make(x, fw, "float32") for x in (qv, kv, vv))
    calls = []
    real = xgemm.api.matmul
    monkeypatch.setattr(xgemm.api, "matmul", lambda a, b: calls.append(1) or real(a, b))
    xp = xgemm.array_api.namespace(q, k)
    out = generic_attention(xp, q, k, v)
    s = qv @ kv.T / 2
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ vv
    np.testing.assert_allclose(to_f64(out), ref, rtol=1e-5, atol=1e-5)
    assert len(calls) == 2 and xp.sum is not None
    assert xgemm.array_api.namespace(q) is xp


def test_namespace_of_no_arrays_a_list_or_two_libraries_is_a_typed_error():
    from xgemm import errors
    from xgemm.array_api import namespace
    assert namespace(np.ones(2), 1.0, None) is namespace(np.ones(3))     # scalars and None are ignored
    with pytest.raises(errors.NotAnArrayError, match="no arrays given"):
        namespace(1.0)
    with pytest.raises(errors.NotAnArrayError, match=r"arrays\[1\] is a list"):
        namespace(np.ones(2), [1.0])
    torch = pytest.importorskip("torch")
    with pytest.raises(errors.FrameworkError, match="one library"):
        namespace(np.ones(2), torch.ones(2))


def test_namespace_matmul_of_dtypes_xgemm_does_not_serve_is_the_standards():
    """Integers, complex and mixed float dtypes (which the standard promotes) go to the wrapped
    namespace's matmul; xgemm's own errors are for its direct calls."""
    from xgemm.array_api import namespace
    for a, b, want in ((np.ones((2, 3), np.int64), np.ones((3, 2), np.int64), "int64"),
                       (np.ones((2, 3), np.float32), np.ones((3, 2), np.float64), "float64"),
                       (np.ones((2, 3), np.complex64), np.ones((3, 2), np.complex64), "complex64")):
        r = namespace(a, b).matmul(a, b)
        assert r.dtype.name == want and np.all(r == 3)
    assert "sum" in dir(namespace(np.ones(2))) and "matmul" in dir(namespace(np.ones(2)))
