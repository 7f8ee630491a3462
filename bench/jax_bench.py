"""cuflash inside jax.jit against JAX's own attention, in one run on one GPU.

    python bench/jax_bench.py                                   # the standard grid's d 128
    python bench/jax_bench.py --seqlens 1024,4096 --masks on --passes fwd --json out.json

Providers, each inside one jax.jit: cuflash (cuflash.jax.flash_attention: the kernels on XLA's
stream through a buffer callback), cuflash-cb (the same with command_buffer=True: XLA captures
the launches into its CUDA graphs and replays them without Python), jax-cudnn
(jax.nn.dot_product_attention, implementation="cudnn") and jax-xla (implementation=None:
XLA's choice). Passes: fwd (out) and
fwd+bwd (jax.value_and_grad of sum(out * dout): the forward, then dq, dk, dv).

Time per call: the GPU's time per call with the host issuing jitted calls back to back (wall
time of --reps calls ended by block_until_ready, divided by --reps; median of 5 rounds): the
host's work per call is hidden wherever the GPU is the slower side, as in a training loop.
Beside it, cuflash's own kernel time (from CuPy, CUDA events, the L2 cache left warm as in the
jitted calls) at the same point: the issue's target is the JAX call within 5% plus the
callback's overhead of that kernel time.

Overhead per call (the "floor" rows; --no-floor skips them): at a tiny shape where the
kernels take a few microseconds, the wall time of one call until its result is ready, from an
idle GPU, median of 200: a jitted one-kernel program (jax-noop: JAX's dispatch, which any
jitted call pays), cuflash inside jit, an empty buffer callback inside jit (JAX's own
dispatch and callback cost), the same with the forward's five buffers (empty-callback-5),
a callback doing cuflash.jax's plumbing only (XLA's stream made current, a CuPy view of each
buffer: callback-plumbing), jax-cudnn inside jit, cuflash.forward called from CuPy (its own
host time plus the kernel) and the same call's host time alone (cuflash-host-only). The
callback's overhead is cuflash-in-jit minus cuflash-from-CuPy. cuflash-in-jit minus jax-noop
is what the callback and cuflash's host code add to a jitted call; less cuflash-host-only, the
callback's own part.

Shapes follow the standard grid (shared/guides/benchmarking.md): batch * seqlen = 16384
tokens, heads * d = 2048, bf16. FLOPs: forward 4 b h n^2 d, halved when causal; fwd+bwd 3.5x
the forward's.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # (CuPy shares the GPU)

import numpy as np  # noqa: E402

from bench import no_gpu, script_results  # noqa: E402


def per_call_ms(jax, fn, args, reps: int, rounds: int = 5) -> float:
    jax.block_until_ready(fn(*args))  # (compiled and warm)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        outs = [fn(*args) for _ in range(reps)]
        jax.block_until_ready(outs)
        times.append((time.perf_counter() - t0) / reps * 1e3)
    return statistics.median(times)


def idle_us(block, fn, args, reps: int = 200) -> float:
    """Wall time of one call until its result is ready, from an idle GPU (median)."""
    block(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        block(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def warm_ms(cp, fn, warmup: int = 3, reps: int = 20) -> float:
    """Kernel time of fn() in ms, issued back to back from CuPy (CUDA events around each
    call, median), the L2 cache left as the previous call left it: as the jitted calls run
    (bench.py's median_ms flushes it before each call)."""
    for _ in range(warmup):
        fn()
    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    events[-1][1].synchronize()
    return float(np.median([cp.cuda.get_elapsed_time(s, e) for s, e in events]))


def kernel_ms(cp, jnp, q, k, v, dout, causal: bool, which: str) -> float:
    """cuflash's own kernel time at this point, called from CuPy."""
    import cuflash

    Q, K, V, dO = (cp.asarray(np.asarray(x.astype(jnp.float32))).astype(q.dtype)
                   for x in (q, k, v, dout))
    if which == "fwd":
        return warm_ms(cp, lambda: cuflash.forward(Q, K, V, causal=causal))

    def fwd_bwd():
        O, L = cuflash.forward(Q, K, V, causal=causal)
        cuflash.backward(dO, Q, K, V, O, L, causal=causal)
    return warm_ms(cp, fwd_bwd)


def providers(jax, jnp, causal: bool, which: str):
    """name -> jitted fn(q, k, v, dout)."""
    from cuflash.jax import flash_attention

    attn = {
        "cuflash": lambda q, k, v: flash_attention(q, k, v, causal=causal),
        "cuflash-cb": lambda q, k, v: flash_attention(q, k, v, causal=causal,
                                                      command_buffer=True),
        "jax-cudnn": lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, implementation="cudnn"),
        "jax-xla": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal),
    }
    out = {}
    for name, f in attn.items():
        if which == "fwd":
            out[name] = jax.jit(lambda q, k, v, dout, f=f: f(q, k, v))
        else:
            def loss(q, k, v, dout, f=f):
                return jnp.sum(f(q, k, v).astype(jnp.float32) * dout.astype(jnp.float32))
            out[name] = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    return out


def floor_rows(jax, jnp, cp, d: int) -> list:
    """The per-call overhead figures at a tiny shape (see the module's docstring)."""
    from jax.experimental.buffer_callback import buffer_callback

    import cuflash

    shape = (1, 128, 1, d)
    key = jax.random.PRNGKey(0)
    q, k, v = (jax.random.normal(kk, shape).astype(jnp.bfloat16)
               for kk in jax.random.split(key, 3))
    empty = jax.jit(buffer_callback(lambda ctx, out, q: None,
                                    jax.ShapeDtypeStruct(shape, jnp.bfloat16)))
    # the forward's buffers (q, k, v in; out, lse out), as cuflash's callback has them
    outs = (jax.ShapeDtypeStruct(shape, jnp.bfloat16),
            jax.ShapeDtypeStruct((1, 1, 128), jnp.float32))
    empty5 = jax.jit(buffer_callback(lambda ctx, out, q, k, v: None, outs))
    from cuflash import jax as cjax
    opts = cjax._options(q, k, v, False, None, (-1, -1), 0.0, None, False, "fa2")
    plumbing = cjax._on_xla_stream(_plumbing_body)  # (the callbacks' own prologue)
    views = jax.jit(buffer_callback(functools.partial(plumbing, opts), outs))
    fns = providers(jax, jnp, False, "fwd")
    noop = jax.jit(lambda q: q * 2)  # (one XLA kernel: what any jitted call pays)
    rows = []
    for name, fn, args in (("jax-noop", lambda q, k, v, d: noop(q), (q, k, v, q)),
                           ("cuflash", fns["cuflash"], (q, k, v, q)),
                           ("cuflash-cb", fns["cuflash-cb"], (q, k, v, q)),
                           ("empty-callback", lambda q, k, v, d: empty(q), (q, k, v, q)),
                           ("empty-callback-5", lambda q, k, v, d: empty5(q, k, v), (q, k, v, q)),
                           ("callback-plumbing", lambda q, k, v, d: views(q, k, v), (q, k, v, q)),
                           ("jax-cudnn", fns["jax-cudnn"], (q, k, v, q))):
        try:
            us = idle_us(jax.block_until_ready, fn, args)
        except Exception as e:  # (one row failing leaves the others)
            rows.append({"floor": name, "shape": shape, "error": f"{type(e).__name__}: {e}"})
            continue
        rows.append({"floor": name, "shape": shape, "us": us})
    Q, K, V = (cp.asarray(np.asarray(x.astype(jnp.float32))).astype(q.dtype)
               for x in (q, k, v))
    rows.append({"floor": "cuflash-from-cupy", "shape": shape,
                 "us": idle_us(lambda r: cp.cuda.Device().synchronize(),
                               lambda: cuflash.forward(Q, K, V), ())})
    rows.append({"floor": "cuflash-host-only", "shape": shape,  # (the call, not the kernel)
                 "us": idle_us(lambda r: None, lambda: cuflash.forward(Q, K, V), ())})
    cp.cuda.Device().synchronize()
    return rows


def _plumbing_body(opts, view, outputs, q, k, v):
    """cuflash.jax's forward callback without its call of cuflash.forward: the real callback's
    prologue (_on_xla_stream: XLA's stream made current on the buffers' GPU) and a CuPy view
    of each buffer (the floor's callback-plumbing row)."""
    for buf in (q, k, v, outputs[0]):
        view(buf)
    view(outputs[1], "float32", 3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--masks", default="off,on", help="causal off, on")
    ap.add_argument("--passes", default="fwd,fwdbwd")
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-floor", action="store_true", help="skip the overhead rows")
    ap.add_argument("--xla-graph-min-size", type=int,
                    help="XLA's --xla_gpu_graph_min_graph_size: programs of this many ops and "
                         "up run as CUDA graphs (1: the floor's one-op programs too, so that "
                         "cuflash-cb's callback is replayed without Python)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if no_gpu("jax_bench.py"):
        return 2
    if args.xla_graph_min_size is not None:  # (read when JAX's GPU backend starts)
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_gpu_graph_min_graph_size={args.xla_graph_min_size}")
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print('jax_bench.py: JAX is not installed (pip install "cuflash[jax]"). Nothing was '
              'run.', file=sys.stderr)
        return 2
    if jax.default_backend() != "gpu":
        print("jax_bench.py: JAX sees no GPU (install jax[cuda12] or jax[cuda13]). Nothing "
              "was run.", file=sys.stderr)
        return 2
    import cupy as cp

    import cuflash

    d, rows = args.headdim, []
    heads = args.width // d
    for which in args.passes.split(","):
        for mask in args.masks.split(","):
            causal = mask == "on"
            fns = providers(jax, jnp, causal, which)
            for n in (int(s) for s in args.seqlens.split(",") if s):  # ("": the floor only)
                b = max(1, args.tokens // n)
                key = jax.random.PRNGKey(n)
                q, k, v, dout = (jax.random.normal(kk, (b, n, heads, d)).astype(jnp.bfloat16)
                                 for kk in jax.random.split(key, 4))
                flops = 4 * b * heads * n * n * d * (0.5 if causal else 1.0)
                flops *= 3.5 if which == "fwdbwd" else 1.0
                row = {"pass": which, "causal": causal, "batch": b, "seqlen": n,
                       "heads": heads, "headdim": d, "dtype": "bf16"}
                for name, fn in fns.items():
                    try:
                        ms = per_call_ms(jax, fn, (q, k, v, dout), args.reps)
                        row[name] = {"ms": ms, "tflops": flops / ms / 1e9}
                    except Exception as exc:  # a peer that does not run here says why
                        row[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                kern = kernel_ms(cp, jnp, q, k, v, dout, causal, which)
                row["cuflash-kernel"] = {"ms": kern, "tflops": flops / kern / 1e9}
                ref = row["jax-cudnn"].get("ms")
                if ref and "ms" in row["cuflash"]:
                    row["cuflash_vs_cudnn"] = ref / row["cuflash"]["ms"]
                    row["kernel_vs_cudnn"] = ref / kern
                rows.append(row)
                cells = "  ".join(
                    f"{name} {row[name]['ms']:.3f} ms ({row[name]['tflops']:.0f})"
                    if "ms" in row[name] else f"{name} failed"
                    for name in (*fns, "cuflash-kernel"))
                print(f"{which:6s} causal={mask:3s} n={n:5d} b={b:2d}  {cells}  "
                      f"jit/cudnn {row.get('cuflash_vs_cudnn', float('nan')):.2f}x", flush=True)
    if not args.no_floor:
        for r in floor_rows(jax, jnp, cp, d):
            rows.append(r)
            cell = f"{r['us']:7.1f} us per call" if "us" in r else f"failed ({r['error']})"
            print(f"floor {r['floor']:18s} {cell} (idle GPU, {r['shape']})", flush=True)
    if args.json:
        script_results(args.json, cp, rows, jax=jax.__version__, cuflash=cuflash.__version__,
                       xla_flags=os.environ.get("XLA_FLAGS", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
