"""KV-cache decoding: cuflash.forward_kvcache (one query token per sequence against its cache)
over issue 20's grid, contiguous (batch, seqlen, heads_k, d) caches, the same over torch's
(batch, heads_k, seqlen, d) memory (cuflash-bhnd) and paged caches, against FlashAttention-2
and cuDNN through torch SDPA ((batch, heads_k, seqlen, d) caches, enable_gqa=True) where torch
is installed, in one run with kernel
timing (bench.py's median_ms: CUDA events around calls issued back to back, L2 flushed before
each). Reported: GB/s of K and V read (every key of every cache, once per KV head) and that
rate as a fraction of the HBM read bandwidth measured in the same run (a read-only kernel
streaming 4 GiB).

    python bench/decode_bench.py                                  # the full grid, d 128, bf16
    python bench/decode_bench.py --batches 16 --seqlens 32768 --json out.json
    python bench/decode_bench.py --configs 32x4x3,16x4x3   # tile shapes (B_c x warps x stages)
                                                           # side by side, as cuflash[32x4x3]
    python bench/decode_bench.py --batches 1,16 --rounds 5  # each point 5 times, alternated:
                                                            # the median (ratios near 1.0)
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402  (median_ms, no_gpu, script_results)

_READ_KERNEL = r"""
extern "C" __global__ void read_all(const float4* x, long long n, float* sink) {
    float acc = 0.f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float4 v = x[i];
        acc += v.x + v.y + v.z + v.w;
    }
    if (acc == 1.2345f) sink[0] = acc;  // (never true for the zeros read: keeps the loads)
}
"""


def hbm_read_gbs(cp, nbytes: int = 4 << 30) -> float:
    """GB/s of a read-only kernel streaming nbytes (zeros) from HBM, L2 flushed before each."""
    x = cp.zeros(nbytes // 4, dtype=cp.float32)
    sink = cp.zeros(1, dtype=cp.float32)
    kernel = cp.RawKernel(_READ_KERNEL, "read_all")
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    n = np.int64(x.size // 4)
    ms = bench.median_ms(cp, lambda: kernel((sms * 8,), (512,), (x, n, sink)), 3, 10)
    return nbytes / ms / 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--seqlens", default="1024,8192,32768,131072")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--pages", default="16,256", help="paged layouts to run besides contiguous")
    ap.add_argument("--providers", default="torch-flash,torch-cudnn")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--configs", default="",
                    help="decode tiles to run besides the planner's, B_cxWARPSxSTAGES "
                         "(comma-separated), on every cuflash layout")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run each point's layouts and providers this many times, the order "
                         "reversed every other round (each rebuilt per round), and report the "
                         "median (for ratios near 1.0)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    if bench.no_gpu("decode_bench"):
        return 2
    import cupy as cp
    import ml_dtypes

    import cuflash
    from cuflash import _plan
    dt = ml_dtypes.bfloat16 if args.dtype == "bf16" else np.float16
    h, hk, d = args.heads, args.kv_heads, args.headdim
    configs = {"": None}  # (the planner's tile, through the public API)
    for c in filter(None, args.configs.split(",")):
        B_c, warps, stages = (int(x) for x in c.split("x"))
        configs[f"[{c}]"] = _plan.DecodeConfig(_plan.head_dim_bucket(d), B_c, warps, stages)
    peak = hbm_read_gbs(cp)
    print(f"HBM read bandwidth measured: {peak:.0f} GB/s", flush=True)
    rows = []
    for batch in (int(x) for x in args.batches.split(",")):
        for n in (int(x) for x in args.seqlens.split(",")):
            kv_bytes = 2 * batch * n * hk * d * np.dtype(dt).itemsize
            if 2 * kv_bytes > 0.8 * cp.cuda.runtime.memGetInfo()[0]:
                print(f"batch {batch} n {n}: skipped (K and V need {kv_bytes / 2**30:.0f} GiB)")
                continue
            names = ["cuflash", "cuflash-bhnd"] \
                + [f"cuflash-paged{x}" for x in args.pages.split(",") if x] \
                + [x for x in args.providers.split(",") if x.startswith("torch-")]
            times: dict = {}  # provider (and tile) -> its ms, one per round
            for r in range(args.rounds):
                # one layout at a time (each its own copy of the caches, freed after)
                for name in names if r % 2 == 0 else names[::-1]:
                    _time_layout(cp, cuflash, name, batch, h, hk, n, d, dt, args, configs,
                                 times)
            for label, ms_rounds in times.items():
                ms = float(np.median(ms_rounds))
                gbs = kv_bytes / ms / 1e6
                rows.append(dict(provider=label, batch=batch, seqlen_k=n, heads=h,
                                 heads_k=hk, headdim=d, dtype=args.dtype, ms=ms,
                                 kv_gbs=gbs, of_hbm=gbs / peak,
                                 **({"ms_rounds": ms_rounds} if args.rounds > 1 else {})))
                print(f"batch {batch:3d} n {n:6d} {label:28} {ms:8.3f} ms  "
                      f"{gbs:7.0f} GB/s  {gbs / peak:5.2f} of HBM"
                      + (f"  (median of {len(ms_rounds)})" if args.rounds > 1 else ""),
                      flush=True)
    if args.json:
        bench.script_results(args.json, cp, rows, hbm_read_gbs=peak)
    return 0


def _time_layout(cp, cuflash, name, batch, h, hk, n, d, dt, args, configs, times) -> None:
    """Provider `name` at one point: its inputs built, each tile timed (kernel timing), the ms
    appended to times[label], the inputs freed."""
    try:
        fn = _layout(cp, cuflash, name, batch, h, hk, n, d, dt, args.dtype)
    except Exception as e:  # (torch missing, or the backend refuses the shape)
        print(f"  {name}: skipped ({type(e).__name__}: {e})", flush=True)
        return
    for tag, cfg in (configs if name.startswith("cuflash") else {"": None}).items():
        call = fn if cfg is None else functools.partial(fn, config=cfg)
        try:
            call()
            times.setdefault(name + tag, []).append(bench.median_ms(cp, call, 3, args.reps))
        except Exception as e:  # (a tile that does not build or launch here)
            print(f"  {name + tag}: failed ({type(e).__name__}: {e})"[:300], flush=True)
    del fn
    bench.release_memory(cp, name.startswith("torch-"))


def _randn(cp, shape, dt):
    """Standard-normal values in dtype dt, drawn one batch entry at a time (a float32 copy of
    a whole 64 x 128k cache would not fit beside it)."""
    x = cp.empty(shape, dtype=dt)
    for b in range(shape[0]):
        x[b] = cp.random.standard_normal(shape[1:], dtype=cp.float32).astype(dt)
    return x


def _layout(cp, cuflash, name, batch, h, hk, n, d, dt, dtype_name):
    """A call of provider `name` on fresh random inputs: cuflash on a contiguous cache
    (batch, seqlen, heads_k, d), or the same shape over (batch, heads_k, seqlen, d) memory
    (cuflash-bhnd, the torch rows' layout), or paged (cuflash-pagedN: pages of N keys in
    shuffled order), or torch SDPA."""
    if name.startswith("torch-"):
        return _torch_decode(name, batch, h, hk, n, d, dtype_name)
    q = _randn(cp, (batch, 1, h, d), dt)
    lens = cp.full((batch,), n, dtype=cp.int32)
    if name == "cuflash-bhnd":  # each KV head's keys one contiguous run, as the torch rows'
        kc, vc = (_randn(cp, (batch, hk, n, d), dt).transpose(0, 2, 1, 3) for _ in range(2))
    else:
        kc, vc = (_randn(cp, (batch, n, hk, d), dt) for _ in range(2))
    if name in ("cuflash", "cuflash-bhnd"):
        return lambda config=None: _call(cuflash, q, kc, vc, lens, None, config)
    page = int(name[len("cuflash-paged"):])
    per = -(-n // page)
    order = cp.asarray(np.random.default_rng(0).permutation(batch * per).astype(np.int32))
    kp, vp = (cp.zeros((batch * per, page, hk, d), dtype=dt) for _ in range(2))
    for src, dst in ((kc, kp), (vc, vp)):  # (entry b's block p in page order[b * per + p])
        for b in range(batch):  # (one entry at a time: no second copy of the whole cache)
            padded = cp.zeros((per * page, hk, d), dtype=dt)
            padded[:n] = src[b]
            dst[order[b * per:(b + 1) * per]] = padded.reshape(per, page, hk, d)
    table = order.reshape(batch, per)
    return lambda config=None: _call(cuflash, q, kp, vp, lens, table, config)


def _call(cuflash, q, kc, vc, lens, table, config):
    """forward_kvcache, or with an explicit tile (_kvcache._forward_kvcache: the tiles' hook)."""
    if config is None:
        return cuflash.forward_kvcache(q, kc, vc, lens, block_table=table)
    from cuflash import _kvcache
    return _kvcache._forward_kvcache(q, kc, vc, lens, None, None, table, False, None, (-1, -1),
                                     0.0, None, 0, False, config)


def _torch_decode(provider, batch, h, hk, n, d, dtype_name):
    """torch SDPA on one query token against a contiguous (batch, heads_k, n, d) cache."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"torch-flash": SDPBackend.FLASH_ATTENTION,
               "torch-cudnn": SDPBackend.CUDNN_ATTENTION}[provider]
    tdt = torch.bfloat16 if dtype_name == "bf16" else torch.float16
    tq = torch.randn(batch, h, 1, d, device="cuda", dtype=tdt)
    tk, tv = (torch.randn(batch, hk, n, d, device="cuda", dtype=tdt) for _ in range(2))
    # (torch draws in the target dtype: no float32 copy)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gqa = {"enable_gqa": True} if hk != h else {}

    def fn():
        with sdpa_kernel(backend), torch.no_grad():
            sdpa(tq, tk, tv, **gqa)
    return fn


if __name__ == "__main__":
    sys.exit(main())
