"""Train a small causal self-attention layer with plain CuPy, cuflash doing the attention.

    python examples/train_attention.py              # GPU: cuflash forward/backward in bf16
    python examples/train_attention.py --cpu        # no GPU: cuflash.reference in float64

A student layer (Wq, Wk, Wv, Wo) learns to imitate a fixed random teacher layer of the same
shape on random inputs. Everything except attention is written out by hand, backward
included, to show how cuflash's VJP plugs into custom autodiff code:

    out, vjp = cuflash.attention_with_vjp(q, k, v, causal=True)   # residuals: q, k, v, out, lse
    dq, dk, dv = vjp(dout)

The loss (mean squared error against the teacher) falls by orders of magnitude.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def attention_backend(use_gpu: bool):
    """attn(q, k, v) -> (out, vjp) on float32 (batch, seq, heads, head_dim) arrays."""
    if use_gpu:
        import ml_dtypes

        import cuflash

        bf16 = ml_dtypes.bfloat16

        def attn(q, k, v):
            out, vjp = cuflash.attention_with_vjp(q.astype(bf16), k.astype(bf16),
                                                  v.astype(bf16), causal=True)
            return out.astype("float32"), lambda g: [x.astype("float32")
                                                     for x in vjp(g.astype(bf16))]
        return attn

    from cuflash import reference

    def attn(q, k, v):
        out, _ = reference.attention_naive(q, k, v, causal=True)
        return out, lambda g: reference.attention_backward_naive(g, q, k, v, causal=True)
    return attn


def train(steps=200, batch=4, seqlen=256, d_model=128, heads=4, lr=3e-3, use_gpu=True,
          log_every=20, seed=0, verbose=True):
    """Returns the list of losses."""
    if use_gpu:
        import cupy as xp
    else:
        import numpy as xp
    attn = attention_backend(use_gpu)
    head_dim = d_model // heads
    rng = xp.random.RandomState(seed)

    def init():
        return {n: (rng.standard_normal((d_model, d_model)) / d_model ** 0.5).astype(xp.float32)
                for n in ("Wq", "Wk", "Wv", "Wo")}

    def layer(x, W):
        """y = Attention(x Wq, x Wk, x Wv) Wo, causal; returns y and what backward needs."""
        split = (x.shape[0], x.shape[1], heads, head_dim)
        q, k, v = ((x @ W[n]).reshape(split) for n in ("Wq", "Wk", "Wv"))
        a, vjp = attn(q, k, v)
        a = a.reshape(x.shape)
        return a @ W["Wo"], (a, vjp)

    teacher, W = init(), init()
    x = rng.standard_normal((batch, seqlen, d_model)).astype(xp.float32)
    y, _ = layer(x, teacher)
    m = {n: xp.zeros_like(w) for n, w in W.items()}   # Adam moments
    s = {n: xp.zeros_like(w) for n, w in W.items()}
    losses = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        y_hat, (a, vjp) = layer(x, W)
        diff = y_hat - y
        losses.append(float((diff ** 2).mean()))
        # backward, by hand: loss = mean(diff^2)
        dy = 2 * diff / diff.size
        grads = {"Wo": xp.einsum("bnc,bnd->cd", a, dy)}
        da = (dy @ W["Wo"].T).reshape(batch, seqlen, heads, head_dim)
        dq, dk, dv = vjp(da)                                          # cuflash.backward
        for n, g in (("Wq", dq), ("Wk", dk), ("Wv", dv)):
            grads[n] = xp.einsum("bnc,bnd->cd", x, g.reshape(x.shape))
        for n in W:                                                   # Adam
            m[n] = 0.9 * m[n] + 0.1 * grads[n]
            s[n] = 0.999 * s[n] + 0.001 * grads[n] ** 2
            m_hat, s_hat = m[n] / (1 - 0.9 ** step), s[n] / (1 - 0.999 ** step)
            W[n] -= (lr * m_hat / (xp.sqrt(s_hat) + 1e-8)).astype(xp.float32)
        if verbose and (step == 1 or step % log_every == 0):
            print(f"step {step:4d}  loss {losses[-1]:.3e}  ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
    return losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="train a small attention layer with cuflash")
    p.add_argument("--cpu", action="store_true", help="use cuflash.reference on the CPU")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seqlen", type=int, default=256)
    args = p.parse_args(argv)
    use_gpu = not args.cpu
    if use_gpu:
        try:
            import cupy
            ok = cupy.cuda.is_available()
        except ImportError:
            ok = False
        if not ok:
            print("no CUDA GPU found: run with --cpu to train on the float64 reference",
                  file=sys.stderr)
            return 2
    losses = train(steps=args.steps, seqlen=args.seqlen, use_gpu=use_gpu)
    print(f"loss {losses[0]:.3e} -> {losses[-1]:.3e} ({losses[0] / losses[-1]:.0f}x lower)")
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
