"""Train a small transformer block in plain JAX, cuflash doing the attention.

    python examples/jax_transformer.py          # on JAX's default device (a GPU: cuflash's
                                                # kernels in bf16 on XLA's stream)
    python examples/jax_transformer.py --cpu    # JAX's CPU: cuflash's float64 reference

One pre-norm block, x + Attention(LN(x)) then x + MLP(LN(x)), with causal multi-head attention
from cuflash.jax.flash_attention, learns to imitate a fixed random teacher block of the same
shape. The whole step (forward, jax.grad through cuflash's custom VJP, a hand-written Adam
update) is one jax.jit; no training library. The loss falls by orders of magnitude.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def train(steps=200, batch=4, seqlen=256, d_model=128, heads=4, lr=3e-3, cpu=False,
          log_every=20, seed=0, verbose=True):
    """Returns the list of losses."""
    import jax
    import jax.numpy as jnp

    from cuflash.jax import flash_attention

    device = jax.devices("cpu")[0] if cpu else jax.devices()[0]
    head_dim = d_model // heads

    def init(key):
        ks = jax.random.split(key, 6)
        w = lambda k, a, b: jax.random.normal(k, (a, b)) / a ** 0.5  # noqa: E731
        return {"Wq": w(ks[0], d_model, d_model), "Wk": w(ks[1], d_model, d_model),
                "Wv": w(ks[2], d_model, d_model), "Wo": w(ks[3], d_model, d_model),
                "W1": w(ks[4], d_model, 4 * d_model), "W2": w(ks[5], 4 * d_model, d_model)}

    def norm(x):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5)

    def block(W, x):
        h = norm(x)
        split = (x.shape[0], x.shape[1], heads, head_dim)
        q, k, v = ((h @ W[n]).reshape(split).astype(jnp.bfloat16) for n in ("Wq", "Wk", "Wv"))
        a = flash_attention(q, k, v, causal=True)                 # cuflash (custom VJP)
        x = x + a.astype(jnp.float32).reshape(x.shape) @ W["Wo"]
        return x + jax.nn.gelu(norm(x) @ W["W1"]) @ W["W2"]

    def loss_fn(W, x, y):
        return jnp.mean((block(W, x) - y) ** 2)

    @jax.jit
    def step(W, m, s, t, x, y):
        loss, g = jax.value_and_grad(loss_fn)(W, x, y)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)              # Adam
        s = jax.tree.map(lambda s, g: 0.999 * s + 0.001 * g * g, s, g)
        W = jax.tree.map(lambda w, m, s: w - lr * (m / (1 - 0.9 ** t))
                         / (jnp.sqrt(s / (1 - 0.999 ** t)) + 1e-8), W, m, s)
        return W, m, s, loss

    with jax.default_device(device):
        k_teacher, k_student, k_x = jax.random.split(jax.random.PRNGKey(seed), 3)
        teacher, W = init(k_teacher), init(k_student)
        x = jax.random.normal(k_x, (batch, seqlen, d_model))
        y = block(teacher, x)
        m = jax.tree.map(jnp.zeros_like, W)
        s = jax.tree.map(jnp.zeros_like, W)
        losses = []
        t0 = time.perf_counter()
        for t in range(1, steps + 1):
            W, m, s, loss = step(W, m, s, jnp.float32(t), x, y)
            losses.append(float(loss))
            if verbose and (t == 1 or t % log_every == 0):
                print(f"step {t:4d}  loss {losses[-1]:.3e}  ({time.perf_counter() - t0:.1f} s)",
                      flush=True)
    return losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="train a small transformer block in JAX with "
                                            "cuflash attention")
    p.add_argument("--cpu", action="store_true", help="JAX's CPU (cuflash's float64 reference)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seqlen", type=int, default=256)
    args = p.parse_args(argv)
    try:
        import jax
    except ImportError:
        print('JAX is not installed: pip install "cuflash[jax]"', file=sys.stderr)
        return 2
    if not args.cpu and jax.default_backend() == "cpu":
        print("JAX sees no GPU: run with --cpu to train on cuflash's float64 reference",
              file=sys.stderr)
        return 2
    losses = train(steps=args.steps, seqlen=args.seqlen, cpu=args.cpu)
    print(f"loss {losses[0]:.3e} -> {losses[-1]:.3e} ({losses[0] / losses[-1]:.0f}x lower)")
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
