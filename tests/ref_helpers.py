"""CPU test helpers for the NumPy reference."""

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
