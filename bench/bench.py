"""Attention speed, side by side in one run on one GPU.

    python bench/bench.py                        # forward at the issues' point: bf16, d 128,
                                                 # batch 4, 16 heads, seqlen 4096
    python bench/bench.py --pass bwd --causal --json bench/results/x.json
    python bench/bench.py --configs 128x32x4,64x64x4   # cuflash forward tile shapes to try

Providers: cuflash (FA2 kernels; the backward also with deterministic=True), naive CuPy in the
same dtype (S and P materialised; forward only), and, when torch is importable, torch SDPA
with the FLASH_ATTENTION (FlashAttention-2's kernels) and CUDNN_ATTENTION backends.
FLOPs: forward 4 * b * h * n^2 * d, halved when causal; backward 2.5x the forward's.
Times: CUDA events, median of --reps runs after warm-up (compilation excluded).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def median_ms(cp, fn, warmup, reps):
    for _ in range(warmup):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


# cuBLAS data types (cudaDataType) and compute type, for gemmStridedBatchedEx.
_CUDA_R = {"float16": 2, "bfloat16": 14}
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1


def _gemm_rowmajor(cp, A, B, C, transpose_b):
    """C = A @ B (or A @ B^T) for row-major batches (batch, M, K) x (batch, K, N), in the
    arrays' dtype with fp32 accumulation, through cuBLAS (CuPy's matmul has no bfloat16)."""
    from cupy_backends.cuda.libs import cublas

    batch, M, K = A.shape
    N = C.shape[2]
    dt = _CUDA_R[np.dtype(A.dtype).name]
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    # Row-major X is column-major X^T, so C^T = op(B)^T A^T is what cuBLAS computes.
    cublas.gemmStridedBatchedEx(
        cp.cuda.device.get_cublas_handle(),
        cublas.CUBLAS_OP_T if transpose_b else cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N,
        N, M, K, one.ctypes.data,
        B.data.ptr, dt, K if transpose_b else N, B.shape[1] * B.shape[2],
        A.data.ptr, dt, K, M * K,
        zero.ctypes.data, C.data.ptr, dt, N, M * N,
        batch, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)
    return C


def naive_cupy(cp, q, k, v, causal, scale):
    """Standard attention with CuPy in the inputs' dtype: S = Q K^T and O = P V as 16-bit
    GEMMs (fp32 accumulate), S and P materialised in HBM, softmax in fp32.
    q, k, v: contiguous (b * h, n, d)."""
    BH, n_q, d = q.shape
    n_k = k.shape[1]
    S = _gemm_rowmajor(cp, q, k, cp.empty((BH, n_q, n_k), q.dtype), transpose_b=True)
    S = S.astype(cp.float32) * scale
    if causal:
        S = cp.where(cp.tri(n_q, n_k, n_k - n_q, dtype=bool), S, -cp.inf)
    S -= S.max(axis=-1, keepdims=True)
    P = cp.exp(S, out=S)
    P /= P.sum(axis=-1, keepdims=True)
    P = P.astype(q.dtype)
    return _gemm_rowmajor(cp, P, v, cp.empty((BH, n_q, d), q.dtype), transpose_b=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--pass", dest="which", choices=["fwd", "bwd"], default="fwd")
    ap.add_argument("--providers", default="cuflash,naive,torch-flash,torch-cudnn")
    ap.add_argument("--configs", default="", help="cuflash tile shapes BrxBcxWarps, comma-sep")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import cupy as cp
    import ml_dtypes

    import cuflash
    from cuflash import _plan

    dtype = ml_dtypes.bfloat16 if args.dtype == "bf16" else np.float16
    b, h, n, d, causal = args.batch, args.heads, args.seqlen, args.headdim, args.causal
    scale = 1.0 / math.sqrt(d)
    flops = 4 * b * h * n * n * d / (2 if causal else 1) * (2.5 if args.which == "bwd" else 1)
    providers = args.providers.split(",")
    props = cp.cuda.runtime.getDeviceProperties(0)
    meta = {
        "device": props["name"].decode(), "date": datetime.datetime.now().isoformat(" ", "seconds"),
        "command": " ".join(["python"] + sys.argv), "cupy": cp.__version__,
        "python": platform.python_version(),
        "problem": dict(dtype=args.dtype, batch=b, heads=h, seqlen=n, headdim=d, causal=causal,
                        which=args.which),
    }
    rows = []

    def record(provider, ms, note=""):
        tf = flops / ms / 1e9 if ms else None
        rows.append(dict(provider=provider, ms=ms, tflops=tf, note=note))
        shown = f"{ms:9.3f} ms {tf:8.1f} TFLOP/s" if ms else f"{'-':>30}"
        print(f"  {provider:<28}{shown}  {note}", flush=True)

    print(f"{meta['device']}: {args.which} {args.dtype} b={b} h={h} n={n} d={d} causal={causal}")
    q, k, v = (cp.random.standard_normal((b, n, h, d), dtype=cp.float32).astype(dtype)
               for _ in range(3))
    if "cuflash" in providers and args.which == "bwd":
        dout = cp.random.standard_normal((b, n, h, d), dtype=cp.float32).astype(dtype)
        out, lse = cuflash.forward(q, k, v, causal=causal)
        for det in (False, True):
            label = "cuflash" + (" deterministic" if det else "")
            fn = lambda det=det: cuflash.backward(dout, q, k, v, out, lse,  # noqa: E731
                                                  causal=causal, deterministic=det)
            fn()
            record(label, median_ms(cp, fn, args.warmup, args.reps))
        del dout, out, lse
    if "cuflash" in providers and args.which == "fwd":
        configs = [None]
        if args.configs:
            HD = _plan.head_dim_bucket(d)
            configs = [_plan.ForwardConfig(HD, *map(int, c.split("x")))
                       for c in args.configs.split(",")]
        for cfg in configs:
            label = "cuflash" if cfg is None else f"cuflash {cfg.B_r}x{cfg.B_c}x{cfg.nwarps}w"
            try:
                fn = lambda: cuflash.forward(q, k, v, causal=causal, _config=cfg)  # noqa: E731
                fn()  # compile outside the timing
                record(label, median_ms(cp, fn, args.warmup, args.reps))
            except Exception as exc:  # a config that does not fit: report, go on
                record(label, None, f"failed: {type(exc).__name__}: {str(exc)[:120]}")
    if "naive" in providers and args.which == "fwd":
        qh, kh, vh = (x.transpose(0, 2, 1, 3).reshape(b * h, n, d) for x in (q, k, v))
        try:
            fn = lambda: naive_cupy(cp, qh, kh, vh, causal, scale)  # noqa: E731
            o_naive = fn().reshape(b, h, n, d).transpose(0, 2, 1, 3)
            o_ours, _ = cuflash.forward(q, k, v, causal=causal)
            diff = float(cp.abs(o_naive.astype(cp.float32) - o_ours.astype(cp.float32)).max())
            del o_naive, o_ours
            record(f"naive cupy ({args.dtype})", median_ms(cp, fn, 2, max(3, args.reps // 5)),
                   f"max |naive - cuflash| = {diff:.1e}")
        except Exception as exc:
            record(f"naive cupy ({args.dtype})", None, f"failed: {type(exc).__name__}: {exc}")
        del qh, kh, vh
        cp.get_default_memory_pool().free_all_blocks()
    torch_wanted = [p for p in providers if p.startswith("torch-")]
    if torch_wanted:
        try:
            import torch
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:
            print("  (torch not importable: torch providers skipped)")
            torch_wanted = []
        else:
            meta["torch"] = torch.__version__
            tdt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
            tq, tk, tv = (torch.randn(b, h, n, d, device="cuda", dtype=tdt,
                                      requires_grad=args.which == "bwd") for _ in range(3))
            tdo = torch.randn(b, h, n, d, device="cuda", dtype=tdt)
            backends = {"torch-flash": SDPBackend.FLASH_ATTENTION,
                        "torch-cudnn": SDPBackend.CUDNN_ATTENTION}
            for name in torch_wanted:
                if args.which == "fwd":
                    def fn(be=backends[name]):
                        with sdpa_kernel(be), torch.no_grad():
                            torch.nn.functional.scaled_dot_product_attention(
                                tq, tk, tv, is_causal=causal)
                else:
                    with sdpa_kernel(backends[name]):
                        to = torch.nn.functional.scaled_dot_product_attention(
                            tq, tk, tv, is_causal=causal)

                    def fn(to=to):
                        torch.autograd.grad(to, (tq, tk, tv), tdo, retain_graph=True)
                try:
                    fn()
                    torch.cuda.synchronize()
                    record(name, median_ms(cp, fn, args.warmup, args.reps))
                except Exception as exc:
                    record(name, None, f"failed: {type(exc).__name__}: {str(exc)[:120]}")

    ours = next((r for r in rows if r["provider"].startswith("cuflash") and r["ms"]), None)
    if ours:
        print("ratios (cuflash TFLOP/s / provider TFLOP/s):")
        for r in rows:
            if r["ms"] and not r["provider"].startswith("cuflash"):
                r["cuflash_ratio"] = ours["tflops"] / r["tflops"]
                print(f"  vs {r['provider']:<25} {r['cuflash_ratio']:6.2f}x")
    det = next((r for r in rows if r["provider"] == "cuflash deterministic" and r["ms"]), None)
    if ours and det:
        print(f"deterministic backward: {det['ms'] / ours['ms']:.2f}x the time of the default")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
