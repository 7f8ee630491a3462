"""CPU test helpers for the NumPy reference."""

import itertools
import math

import numpy as np


def assert_vjp_matches_finite_differences(forward, q, k, v, dout, grads, eps=1e-6, atol=1e-7):
    """grads = (dq, dk, dv) against central differences of <forward(q, k, v), dout>, element
    by element (forward returns O; the loss's gradient is the VJP with dout)."""
    def loss(q_, k_, v_):
        return float((forward(q_, k_, v_) * dout).sum())

    for which, (x, g) in enumerate(zip((q, k, v), grads)):
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args = [q, k, v]
            plus, minus = x.copy(), x.copy()
            plus[idx] += eps
            minus[idx] -= eps
            args[which] = plus
            lp = loss(*args)
            args[which] = minus
            fd[idx] = (lp - loss(*args)) / (2 * eps)
        np.testing.assert_allclose(g, fd, rtol=0, atol=atol)


def attention_by_definition(q, k, v, scale, window=(-1, -1), causal=False, softcap=0.0,
                            slopes=None):
    """Each query row written out from FlashAttention-2's definitions: the keys of a window
    around the bottom-right diagonal, softcap tanh(s / softcap) on the scaled score, minus
    slope |i + sk - sq - j|."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    out, lse = np.zeros((b, sq, h, d)), np.full((b, h, sq), -np.inf)
    for bi, hi, i in itertools.product(range(b), range(h), range(sq)):
        diag = i + sk - sq
        keys = [j for j in range(sk) if (left < 0 or j >= diag - left) and
                (right < 0 or j <= diag + right)]
        if not keys:
            continue
        s = np.array([scale * q[bi, i, hi] @ k[bi, j, hi // (h // hk)] for j in keys])
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        if slopes is not None:
            slope = slopes[hi] if np.ndim(slopes) == 1 else slopes[bi, hi]
            s = s - slope * np.abs(diag - np.array(keys))
        w = np.exp(s - s.max())
        out[bi, i, hi] = (w / w.sum()) @ v[bi, keys, hi // (h // hk)]
        lse[bi, hi, i] = s.max() + math.log(w.sum())
    return out, lse


def assert_same_attention(O1, L1, O2, L2, tol):
    """Two (O, L) pairs equal to `tol`: finite outputs, the same rows that saw no key."""
    assert np.isfinite(O1).all() and np.isfinite(O2).all()
    np.testing.assert_allclose(O1, O2, rtol=0, atol=tol)
    assert (np.isneginf(L1) == np.isneginf(L2)).all()
    finite = np.isfinite(L1)
    np.testing.assert_allclose(L1[finite], L2[finite], rtol=0, atol=tol)
