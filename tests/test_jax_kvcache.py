"""cuflash.jax.flash_attention_kvcache: KV-cache decoding under jax.jit, on JAX's CPU backend
(the binding around the float64 reference) and, marked gpu, on a CUDA device (the decode
kernels on XLA's stream), against float64 attention by the accuracy rule. Skipped without
JAX."""

import ml_dtypes
import numpy as np
import pytest

from cuflash import reference

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'cuflash[jax]')")
jnp = pytest.importorskip("jax.numpy")
cjax = pytest.importorskip("cuflash.jax")

BF16 = ml_dtypes.bfloat16


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    if request.param == "cpu":
        return jax.devices("cpu")[0]
    try:
        return jax.devices("cuda")[0]
    except RuntimeError:
        pytest.skip("JAX has no CUDA backend here (jax[cuda12] or jax[cuda13] is not installed)")


def _err(a, ref):
    return float(np.abs(np.asarray(a, np.float64) - ref).max()) if np.size(ref) else 0.0


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("new", [0, 3], ids=["no append", "append 3"])
@pytest.mark.parametrize("traced", [False, True], ids=["host lengths", "traced lengths"])
@pytest.mark.parametrize("causal,heads_k", [(False, 2), (True, 8), (True, 1)])
def test_decode_matches_float64_and_appends(device, paged, new, traced, causal, heads_k):
    """out and lse of a jitted decode step (GQA/MQA, cached lengths 0..90, with and without
    an append of 3 keys, contiguous and paged in pages of 16 through a shuffled table) by the
    accuracy rule against float64 attention over each entry's keys; the returned caches hold
    the appended keys exactly, every other row unchanged."""
    batch, sq, heads, d, page = 3, 3 if new else 1, 8, 64, 16
    lens = np.array([0, 37, 90 - new], np.int32)
    rng = np.random.default_rng(7)
    if paged:
        per = 6  # pages per entry: 96 keys
        table = rng.permutation(batch * per + 2)[:batch * per].reshape(batch, per).astype(
            np.int32)
        cache_shape = (batch * per + 2, page, heads_k, d)
    else:
        table, cache_shape = None, (batch, 96, heads_k, d)
    q = rng.standard_normal((batch, sq, heads, d)).astype(BF16)
    kc, vc = (rng.standard_normal(cache_shape).astype(BF16) for _ in range(2))
    k, v = ((rng.standard_normal((batch, new, heads_k, d)).astype(BF16) for _ in range(2))
            if new else (None, None))
    put = lambda x: None if x is None else jax.device_put(x, device)  # noqa: E731
    Q, KC, VC, K, V = (put(x) for x in (q, kc, vc, k, v))
    if traced:  # lengths and table as arguments of the jitted step: traced, trusted
        @jax.jit
        def step(Q, KC, VC, K, V, lens_, table_):
            return cjax.flash_attention_kvcache(Q, KC, VC, lens_, k=K, v=V,
                                                block_table=table_, causal=causal,
                                                return_lse=True)
        res = step(Q, KC, VC, K, V, put(lens), put(table))
    else:  # host values, checked at trace time and folded in as constants
        @jax.jit
        def step(Q, KC, VC, K, V):
            return cjax.flash_attention_kvcache(Q, KC, VC, [int(n) for n in lens], k=K, v=V,
                                                block_table=table, causal=causal,
                                                return_lse=True)
        res = step(Q, KC, VC, K, V)
    out, lse = res[:2]
    O, L = reference.attention_kvcache_naive(q, kc, vc, lens, k=k, v=v, block_table=table,
                                             causal=causal)
    naive = np.zeros(O.shape)
    for b, Kb, Vb in reference._kvcache_entries(q, kc, vc, lens, k, v, table):
        naive[b] = reference.attention_naive_same_dtype(q[b:b + 1], Kb[None], Vb[None],
                                                        causal)[0]
    assert _err(out, O) <= 2 * _err(naive, O) + 1e-5, (_err(out, O), _err(naive, O))
    fin = np.isfinite(L)
    assert (np.isneginf(np.asarray(lse)) == ~fin).all() and _err(np.asarray(lse)[fin],
                                                                 L[fin]) <= 1e-3
    if new:
        kc2, vc2 = reference.kvcache_append(kc, vc, lens, k, v, table)
        np.testing.assert_array_equal(np.asarray(res[2]), kc2)
        np.testing.assert_array_equal(np.asarray(res[3]), vc2)
    else:
        assert len(res) == 2


def test_decode_refuses_bad_input_at_trace_time():
    f = cjax.flash_attention_kvcache
    q = jax.ShapeDtypeStruct((2, 1, 8, 64), jnp.bfloat16)
    kc = jax.ShapeDtypeStruct((2, 32, 2, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="capacity"):
        jax.eval_shape(lambda q, kc: f(q, kc, kc, [10, 40]), q, kc)
    with pytest.raises(ValueError, match="multiple of the cache's"):
        jax.eval_shape(lambda q, kc: f(q, kc, kc, 3),
                       jax.ShapeDtypeStruct((2, 1, 3, 64), jnp.bfloat16), kc)
    with pytest.raises(ValueError, match="give both k and v"):
        jax.eval_shape(lambda q, kc: f(q, kc, kc, 3, k=q), q, kc)
    with pytest.raises(ValueError, match="int32"):
        jax.eval_shape(lambda q, kc, n: f(q, kc, kc, n), q, kc,
                       jax.ShapeDtypeStruct((2,), jnp.float32))
    with pytest.raises(ValueError, match="names pages outside"):
        paged = jax.ShapeDtypeStruct((4, 16, 2, 64), jnp.bfloat16)
        jax.eval_shape(lambda q, kc: f(q, kc, kc, [3, 20], block_table=[[0, 1], [2, 9]]),
                       q, paged)
    with pytest.raises(ValueError, match="num_splits"):
        jax.eval_shape(lambda q, kc: f(q, kc, kc, 3, num_splits=-1), q, kc)


def test_decode_eagerly_and_with_an_empty_append():
    """An eager call (no jit around it) gives the jitted result; k and v with no new rows
    still return the caches, unchanged."""
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((2, 1, 4, 32)), jnp.float16)
    kc, vc = (jnp.asarray(rng.standard_normal((2, 40, 2, 32)), jnp.float16) for _ in range(2))
    k0 = jnp.zeros((2, 0, 2, 32), jnp.float16)
    f = cjax.flash_attention_kvcache
    eager = f(q, kc, vc, [5, 40])
    np.testing.assert_array_equal(np.asarray(eager),
                                  np.asarray(jax.jit(lambda q: f(q, kc, vc, [5, 40]))(q)))
    out, kc2, vc2 = f(q, kc, vc, [5, 40], k=k0, v=k0)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(eager))
    np.testing.assert_array_equal(np.asarray(kc2), np.asarray(kc))
    np.testing.assert_array_equal(np.asarray(vc2), np.asarray(vc))
