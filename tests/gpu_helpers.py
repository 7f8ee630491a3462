"""GPU test helpers: inputs, the same-dtype naive attention and the accuracy rule of
shared/guides/accuracy.md (FlashAttention-2's test rule)."""

import numpy as np


def rand(cp, shape, dtype, scale=1.0):
    """Fresh standard-normal values in `dtype` (never zeros or ones)."""
    return (cp.random.standard_normal(shape, dtype=cp.float32) * scale).astype(dtype)


def poisoned(cp, shape, dtype):
    return cp.full(shape, np.nan, dtype=dtype)


def max_err(cp, a, ref):
    return float(cp.abs(a.astype(cp.float64) - ref).max()) if a.size else 0.0


def assert_accurate(cp, ours, naive, ref, factor, what):
    """max|ours - ref| <= factor * max|naive - ref| + 1e-5; NaN/Inf never passes."""
    assert bool(cp.isfinite(ours.astype(cp.float32)).all()), f"{what}: NaN or Inf in output"
    err, naive_err = max_err(cp, ours, ref), max_err(cp, naive, ref)
    assert err <= factor * naive_err + 1e-5, (
        f"{what}: max error {err:.3e} > {factor} x naive {naive_err:.3e} + 1e-5")
    return err, naive_err


def assert_lse(cp, lse, L_ref, tol=1e-3):
    assert lse.dtype == cp.float32
    ninf = cp.isneginf(L_ref)
    assert bool((cp.isneginf(lse) == ninf).all()), "lse: -inf pattern differs from float64"
    assert not bool(cp.isnan(lse).any()) and not bool(cp.isposinf(lse).any())
    fin = ~ninf
    if bool(fin.any()):
        err = float(cp.abs(lse[fin].astype(cp.float64) - L_ref[fin]).max())
        assert err <= tol, f"lse: max error {err:.3e} > {tol}"


# Ring attention's blocks (cuflash.distributed): (causal, window_size, ALiBi) under which the
# forward and backward GPU tests shift the diagonal.
SHIFTED_CASES = [(True, (-1, -1), True), (False, (-1, -1), True), (True, (97, -1), False),
                 (False, (60, 13), True), (True, (200, 0), True)]
