"""Attention speed and memory, side by side in one run on one GPU.

    python bench/bench.py                          # one point: forward, bf16, d 128, batch 4,
                                                   # 16 heads, seqlen 4096 (the issues' point)
    python bench/bench.py --pass bwd --causal --json bench/results/x.json
    python bench/bench.py --grid --json bench/results/grid.json     # the standard grid
    python bench/bench.py --grid --dtypes bf16 --headdims 128 --seqlens 1024,4096 --passes fwd
    python bench/bench.py --configs 128x32x4,64x64x4                 # FA2 forward tile shapes
    python bench/bench.py --configs h128x2p,h176x2p,h128x2           # Hopper forward tiles
    python bench/bench.py --pass bwd --configs 64x128x8x2x4x2x2      # FA2 backward tile shapes
    python bench/bench.py --pass bwd --configs h2,64x128x8x2x4x2x2   # Hopper against portable

Providers (--providers): cuflash (FA2), cuflash-fa1 (FlashAttention-1 loop order, forward
only), naive (CuPy in the same dtype, S and P materialised; forward only), and, when torch is
importable, torch-flash (SDPA FLASH_ATTENTION: FlashAttention-2's kernels) and torch-cudnn
(SDPA CUDNN_ATTENTION). The backward also times cuflash with deterministic=True.

The standard grid (shared/guides/benchmarking.md): batch * seqlen = 16384 tokens, heads * d =
2048, seqlen 512..16384, d 64 and 128, causal off and on, fp16 and bf16, forward and backward.
FLOPs: forward 4 * b * h * n^2 * d, halved when causal; backward 2.5x the forward's.
Times are kernel times (shared/guides/benchmarking.md): the median over --reps calls of the
GPU time between CUDA events recorded around each call, with the L2 cache flushed before each
and the host issuing the calls back to back behind a kernel that holds the GPU until they
are all queued (the GPU stays busy, so the host's launch preparation is not counted:
triton.testing.do_bench's method, with nvbench's blocking kernel). The host time each call
spends before it returns is a second, separate figure (host_us, median). --rounds N times
the providers of each point N times in turn (order reversed every other round) and reports
the median of the rounds (for ratios near 1.0, where one run of each moves by a few %);
--paired with it takes each round's calls of the providers in turns, call by call, so that
all run under the same clock (at the H200's power limit the clock follows the load).
Compilation is excluded. Memory: the peak device memory a call allocates beyond its
inputs. --kv-heads runs GQA/MQA (torch: enable_gqa=True). bench/plot.py and bench/claims.py
turn the JSON into the figure and the seed-claims report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ALL_PROVIDERS = "cuflash,cuflash-fa1,naive,torch-flash,torch-cudnn"

# cuBLAS data types (cudaDataType) and compute type, for gemmStridedBatchedEx.
_CUDA_R = {"float16": 2, "bfloat16": 14}
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1


_L2_FLUSH_BYTES = 256 << 20  # more than any GPU's L2 (H200: 50 MB)
_flush_buffers: dict = {}


_WARM_MS = 25.0  # (triton.testing.do_bench's default warm-up)


_SPIN_KERNEL = r"""
extern "C" __global__ void spin(long long ns) {  // holds the stream for ns of GPU time
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""
_spin_kernels: dict = {}


def _spin(cp, ms):
    """Keep the current stream busy for `ms` of GPU time (one thread spinning on the global
    timer), so that the host can queue what follows before the GPU reaches it."""
    device = cp.cuda.Device().id
    if device not in _spin_kernels:
        _spin_kernels[device] = cp.RawKernel(_SPIN_KERNEL, "spin")
    _spin_kernels[device]((1,), (1,), (np.int64(ms * 1e6),))


def median_ms(cp, fn, warmup, reps):
    """Kernel time of fn() in ms: the median over `reps` calls of the GPU time between events
    recorded on the current stream around each call, the L2 cache flushed (a 256 MiB memset)
    before each. The host queues all the calls behind a kernel that holds the GPU for longer
    than the queueing takes (nvbench's blocking kernel), so no call waits for the host: host
    overhead is not counted, even for calls whose Python takes longer than their GPU time.
    (Without it, batch-1 decode steps of 15-25 us measured 70 us, the host's pace per call:
    PERFORMANCE.md, session 6.) Warm-up: `warmup` calls and at least _WARM_MS of
    flushes and calls, so that a GPU that sat idle (its SM clock falls to 345 MHz on the H200)
    is back at its clock before the first timed call; a few calls of a 30 us kernel alone do
    not get it there."""
    return paired_median_ms(cp, {None: fn}, warmup, reps)[None]


def paired_median_ms(cp, fns: dict, warmup, reps) -> dict:
    """{label: kernel time in ms} of each fn of `fns`, as median_ms times one, with the
    calls of the fns taken in turns (A, B, A, B, ...; the warm-up too): for A/B comparisons,
    where the GPU's clock drifting between separate timings moved one variant's median by up
    to 5% (session 20), more than the effect measured."""
    device = cp.cuda.Device().id
    if device not in _flush_buffers:  # (one per GPU, made once: not 256 MiB per call)
        _flush_buffers[device] = cp.empty(_L2_FLUSH_BYTES, dtype=cp.uint8)
    flush = _flush_buffers[device]
    stream = cp.cuda.get_current_stream()
    t0, calls = time.perf_counter(), 0
    issued = []  # host time to issue each flush and call (the median: not a first compile)
    while calls < warmup or (time.perf_counter() - t0) * 1e3 < _WARM_MS:
        for fn in fns.values():
            t1 = time.perf_counter()
            flush.fill(0)
            fn()
            issued.append((time.perf_counter() - t1) * 1e3)
        calls += 1
        if calls % 4 == 0:  # (wall time follows the GPU's, not the host's queueing)
            stream.synchronize()
    stream.synchronize()
    events = {k: [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)] for k in fns}
    first = events[next(iter(fns))][0][0]
    hold_ms = 1.0 + 2.0 * reps * len(fns) * float(np.median(issued))
    for _ in range(3):  # (a longer hold where the host took longer than the hold to queue)
        _spin(cp, hold_ms)
        t1 = time.perf_counter()
        for r in range(reps):
            for k, fn in fns.items():
                start, end = events[k][r]
                flush.fill(0)
                start.record()
                fn()
                end.record()
        if not first.done:
            break  # (the first call had not started when the last was queued)
        stream.synchronize()
        hold_ms = 4 * max(hold_ms, (time.perf_counter() - t1) * 1e3)
    stream.synchronize()
    return {k: float(np.median([cp.cuda.get_elapsed_time(s, e) for s, e in ev]))
            for k, ev in events.items()}


def host_us(cp, fn, reps):
    """Host time per call in us: the median wall time fn() takes to return (its launches are
    asynchronous), synchronising after each so that queues never fill."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        cp.cuda.Device().synchronize()
    return float(np.median(times)) * 1e6


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


def gemm_ceiling(cp, dtype, n=8192, reps=10):
    """TFLOP/s of one n^3 16-bit GEMM through cuBLAS, measured in this run."""
    a = cp.random.standard_normal((1, n, n), dtype=cp.float32).astype(dtype)
    b = cp.random.standard_normal((1, n, n), dtype=cp.float32).astype(dtype)
    c = cp.empty((1, n, n), dtype)
    ms = median_ms(cp, lambda: _gemm_rowmajor(cp, a, b, c, False), 3, reps)
    return 2 * n ** 3 / ms / 1e9


class Point:
    """One problem: inputs for every provider, timed and measured on demand."""

    def __init__(self, cp, dtype_name, b, h, n, d, causal, which, h_k=None):
        import ml_dtypes
        self.cp, self.which = cp, which
        self.dtype_name, self.b, self.h, self.n, self.d, self.causal = (
            dtype_name, b, h, n, d, causal)
        self.h_k = h_k or h  # kv heads (GQA / MQA when fewer than h)
        self.dtype = ml_dtypes.bfloat16 if dtype_name == "bf16" else np.float16
        self.scale = 1.0 / math.sqrt(d)
        fwd_flops = 4 * b * h * n * n * d / (2 if causal else 1)
        self.flops = fwd_flops * (2.5 if which == "bwd" else 1)

    @classmethod
    def from_spec(cls, cp, spec: str, tokens: int = 16384, width: int = 2048):
        """The standard grid's point named "PASS DTYPE HEADDIM SEQLEN [c]" ("bwd bf16 128
        16384 c": batch x seqlen = tokens, heads x d = width; c: causal)."""
        which, dtype, d, n, *mask = spec.split()
        d, n = int(d), int(n)
        return cls(cp, dtype, tokens // n, width // d, n, d, bool(mask), which)

    def call(self, provider):
        """The provider's own call at this point (cuflash's backward: the default mode)."""
        got = self.callables(provider)
        return got.get(provider) or next(iter(got.values()))

    def inputs(self):
        """q, k, v (and dout for the backward), (batch, seqlen, heads, d)."""
        cp = self.cp
        heads = [self.h, self.h_k, self.h_k] + ([self.h] if self.which == "bwd" else [])
        return [cp.random.standard_normal((self.b, self.n, h, self.d),
                                          dtype=cp.float32).astype(self.dtype)
                for h in heads]

    def callables(self, provider, cfg=None):
        """{label: fn} for a provider at this point (empty if it does not apply)."""
        import cuflash
        from cuflash import _api, _plan
        cp, causal = self.cp, self.causal
        if provider == "cuflash" and self.which == "fwd":
            q, k, v = self.inputs()
            return {forward_label(cfg):
                    lambda: _api._forward(q, k, v, causal, None, None, None, "fa2", False,
                                          cfg)}
        if provider == "cuflash" and self.which == "bwd":
            q, k, v, dout = self.inputs()
            out, lse = cuflash.forward(q, k, v, causal=causal)
            if isinstance(cfg, _plan.Sm90BackwardConfig):
                return {f"cuflash-sm90 bwd {cfg.B_r}x{cfg.B_c} s{cfg.stages}":
                        lambda: _api._backward(dout, q, k, v, out, lse, causal, None, False,
                                               None, None, None, cfg)}
            if cfg is not None:
                return {f"cuflash {cfg.B_r}x{cfg.B_c}x{cfg.nwarps}w {cfg.wm_sdp}/{cfg.wm_dkv}/"
                        f"{cfg.wm_dq} q{cfg.qstages} dq{cfg.dq_bulk}":
                        lambda: _api._backward(dout, q, k, v, out, lse, causal, None, False,
                                               None, None, None, cfg)}
            return {label: (lambda det=det: cuflash.backward(
                        dout, q, k, v, out, lse, causal=causal, deterministic=det))
                    for label, det in (("cuflash", False), ("cuflash deterministic", True))}
        if provider == "cuflash-fa1" and self.which == "fwd":
            q, k, v = self.inputs()
            return {"cuflash-fa1": lambda: cuflash.forward(q, k, v, causal=causal,
                                                           algorithm="fa1")}
        if provider == "naive" and self.which == "fwd":
            b, n, h, d = self.b, self.n, self.h, self.d
            need = b * h * n * n * 14  # S (16-bit) + two float32 copies + P (16-bit)
            free = cp.cuda.runtime.memGetInfo()[0]
            if need > 0.6 * free:
                raise MemoryError(f"skipped: S and P need ~{need / 2**30:.0f} GiB "
                                  f"({free / 2**30:.0f} GiB free)")
            qh, kh, vh = (x.transpose(0, 2, 1, 3).reshape(b * h, n, d) for x in self.inputs())
            return {"naive": lambda: naive_cupy(cp, qh, kh, vh, causal, self.scale)}
        if provider.startswith("torch-"):
            return self._torch(provider)
        return {}

    def _torch(self, provider):
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"torch-flash": SDPBackend.FLASH_ATTENTION,
                   "torch-cudnn": SDPBackend.CUDNN_ATTENTION}[provider]
        tdt = torch.bfloat16 if self.dtype_name == "bf16" else torch.float16
        grad = self.which == "bwd"
        tq, tk, tv = (torch.randn(self.b, h, self.n, self.d, device="cuda", dtype=tdt,
                                  requires_grad=grad) for h in (self.h, self.h_k, self.h_k))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        gqa = {"enable_gqa": True} if self.h_k != self.h else {}
        if not grad:
            def fn():
                with sdpa_kernel(backend), torch.no_grad():
                    sdpa(tq, tk, tv, is_causal=self.causal, **gqa)
            return {provider: fn}
        tdo = torch.randn_like(tq)
        with sdpa_kernel(backend):
            to = sdpa(tq, tk, tv, is_causal=self.causal, **gqa)
        return {provider: lambda: torch.autograd.grad(to, (tq, tk, tv), tdo, retain_graph=True)}

    def peak_extra_bytes(self, provider, fn):
        """Device memory a call allocates beyond what exists before it (CuPy's pool for the
        CuPy providers, torch's allocator for torch)."""
        if provider.startswith("torch-"):
            import torch
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - base
        pool = self.cp.get_default_memory_pool()
        self.cp.cuda.Device().synchronize()
        pool.free_all_blocks()
        base = pool.total_bytes()
        fn()
        self.cp.cuda.Device().synchronize()
        return pool.total_bytes() - base


def run_point(cp, point, providers, reps, warmup, configs=None, measure_memory=False,
              log=print, rounds=1, paired=False):
    """Rows for `point`, one per provider (and tile): kernel time (median_ms), TFLOP/s, host
    time per call. rounds > 1: every provider's inputs are made first, then the providers are
    timed `rounds` times in turn (the order reversed every other round), and ms is the median
    of the rounds' medians (ms_rounds lists them): a point's ratio then rests on alternated
    runs, not on one run of each provider a few seconds apart. paired (with rounds > 1): in
    each round the providers' calls go in turns, call by call (paired_median_ms), so that
    every provider is timed under the same clock: at the H200's power limit the clock follows
    the load, and one provider's rounds spread by 3-20% (PERFORMANCE.md, session 29). The slow
    providers (naive, FA1) keep their own timing."""
    if rounds > 1:
        return _run_point_rounds(cp, point, providers, reps, warmup, configs, measure_memory,
                                 log, rounds, paired)
    rows = []
    for provider, fns in _set_up(point, providers, configs, rows, log):
        for label, fn in fns.items():
            row = _new_row(point, label)
            try:
                fn()  # compile and warm outside the timing
                row["ms"] = _median(cp, fn, label, reps, warmup)
                _finish(cp, point, row, fn, measure_memory)
            except Exception as exc:  # a provider that cannot run this point: say so
                _failed(row, exc)
            rows.append(row)
            log(row)
            del fn
        del fns
        release_memory(cp, provider.startswith("torch-"))
    return rows


def release_memory(cp, torch_too: bool) -> None:
    """CuPy's pooled blocks, and torch's cached ones where a torch provider ran, given back
    before the next point or layout (each makes inputs of its own)."""
    cp.get_default_memory_pool().free_all_blocks()
    if torch_too:
        import torch
        torch.cuda.empty_cache()


def _run_point_rounds(cp, point, providers, reps, warmup, configs, measure_memory, log,
                      rounds, paired=False):
    """run_point with rounds > 1 (see there)."""
    rows, timed = [], []  # timed: (row, fn) of each provider that ran once
    for _, fns in _set_up(point, providers, configs, rows, log):
        for label, fn in fns.items():
            row = _new_row(point, label)
            try:
                fn()  # compile and warm outside the timing
                timed.append((row, fn))
            except Exception as exc:
                rows.append(_failed(row, exc))
                log(row)
    for r in range(rounds):
        turn = timed if r % 2 == 0 else timed[::-1]
        together = [(row, fn) for row, fn in turn
                    if paired and "error" not in row and not _slow(row["provider"])]
        done = set()  # (ids of the rows timed together this round)
        if len(together) > 1:
            try:  # (keyed by position in the turn)
                got = paired_median_ms(cp, {i: fn for i, (_, fn) in enumerate(together)},
                                       warmup, reps)
                for i, (row, _) in enumerate(together):
                    row.setdefault("ms_rounds", []).append(got[i])
                    done.add(id(row))
            except Exception:  # (one failed: time them one by one, which says which)
                pass
        for row, fn in turn:
            if "error" in row or id(row) in done:
                continue
            try:
                row.setdefault("ms_rounds", []).append(
                    _median(cp, fn, row["provider"], reps, warmup))
            except Exception as exc:
                _failed(row, exc)
    for row, fn in timed:
        if "error" not in row:
            row["ms"] = float(np.median(row["ms_rounds"]))
            _finish(cp, point, row, fn, measure_memory)
        rows.append(row)
        log(row)
    del timed
    release_memory(cp, any(p.startswith("torch-") for p in providers) and "torch" in sys.modules)
    return rows


def forward_label(cfg) -> str:
    """A forward row's provider name: "cuflash", or the tile it was given (each of its options
    named, so that two tiles never share a row)."""
    from cuflash import _plan
    if cfg is None:
        return "cuflash"
    if isinstance(cfg, _plan.Sm90ForwardConfig):
        return (f"cuflash-sm90 {cfg.B_r}x{cfg.B_c} s{cfg.stages}"
                + (" overlap" if cfg.overlap else "")
                + (" pingpong" if cfg.pingpong else "")
                + (" turns" if cfg.pingpong and not cfg.handover else "")
                + (" lazy" if cfg.lazy else "")
                + (f" exp-poly/{cfg.poly}" if cfg.poly else ""))
    return f"cuflash {cfg.B_r}x{cfg.B_c}x{cfg.nwarps}w kv{cfg.kv_stages}"


def _new_row(point, label):
    return dict(provider=label, dtype=point.dtype_name, batch=point.b, heads=point.h,
                kv_heads=point.h_k, seqlen=point.n, headdim=point.d, causal=point.causal,
                which=point.which)


def _set_up(point, providers, configs, rows, log):
    """(provider, {label: call}) of each provider at a point, cuflash once per tile of
    `configs` if given; for one that cannot set the point up (the naive attention would not
    fit, ...), a row saying why, appended to `rows` and logged."""
    for provider in providers:
        try:
            if not configs or provider != "cuflash":
                fns = point.callables(provider, None)
            else:  # (one row per tile: two tiles with one label would share a row)
                fns = {}
                for cfg in configs:
                    for label, fn in point.callables(provider, cfg).items():
                        if label in fns:
                            raise ValueError(f"two tiles are both labelled {label!r}")
                        fns[label] = fn
        except Exception as exc:
            rows.append(_failed(_new_row(point, provider), exc))
            log(rows[-1])
            continue
        yield provider, fns


def _slow(label) -> bool:
    return label in ("naive", "cuflash-fa1")  # (timed with fewer calls)


def _median(cp, fn, label, reps, warmup) -> float:
    """median_ms of a provider's call, the slow ones with fewer calls."""
    slow = _slow(label)
    return median_ms(cp, fn, 1 if slow else warmup, max(3, reps // 5) if slow else reps)


def _finish(cp, point, row, fn, measure_memory) -> None:
    """TFLOP/s of row["ms"], the host time per call and, if asked, the memory a call takes."""
    row["tflops"] = point.flops / row["ms"] / 1e9
    row["host_us"] = host_us(cp, fn, 3 if _slow(row["provider"]) else 10)
    if measure_memory:
        row["extra_bytes"] = point.peak_extra_bytes(row["provider"], fn)


def _failed(row, exc) -> dict:
    """A provider's row that has no time, with what went wrong (returned)."""
    row.update(ms=None, tflops=None, error=f"{type(exc).__name__}: {str(exc)[:160]}")
    return row


def _fmt(row):
    if row.get("ms") is None:
        return f"  {row['provider']:<24}{'failed':>30}  {row.get('error', '')}"
    mem = f"  {row['extra_bytes'] / 2**20:9.0f} MiB" if "extra_bytes" in row else ""
    return (f"  {row['provider']:<24}{row['ms']:9.3f} ms {row['tflops']:8.1f} TFLOP/s"
            f"  host {row['host_us']:7.1f} us{mem}")


def no_gpu(script: str) -> bool:
    """True, after saying why on stderr, where no CUDA GPU is usable (the bench scripts then
    exit with status 2 instead of failing in the driver)."""
    from cuflash._api import gpu_missing
    if gpu_missing():
        print(f"{script}: {gpu_missing()}. Nothing was run.", file=sys.stderr)
        return True
    return False


def write_results(path: str, meta: dict, rows: list) -> None:
    """The bench scripts' JSON: {"meta": ..., "rows": [...]}, its folder made if missing."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def script_results(path: str, cp, rows: list, **meta) -> None:
    """write_results for the feature benches (window_bench.py and the others): the GPU's name
    and the command line that ran, then `meta`."""
    write_results(path, {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                         "command": " ".join(["python"] + sys.argv), **meta}, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="key/value heads (GQA/MQA; default: --heads)")
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--pass", dest="which", choices=["fwd", "bwd"], default="fwd")
    ap.add_argument("--providers", default=ALL_PROVIDERS)
    ap.add_argument("--configs", default="",
                    help="FA2 tile shapes, comma-separated: forward BrxBcxWarps[xKVstages], "
                         "backward BrxBcxWarpsxWMsdpxWMdkvxWMdqxQstages[xDQbulk] (DQbulk: 0 "
                         "atomics, 1 or 2 bulk-reduced dQ tiles; default 2 where the GPU has "
                         "the bulk copy engine, sm_90+, else 0)")
    ap.add_argument("--grid", action="store_true", help="run the standard grid")
    ap.add_argument("--dtypes", default="fp16,bf16", help="grid: dtypes")
    ap.add_argument("--headdims", default="64,128", help="grid: head dims")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384", help="grid: seqlens")
    ap.add_argument("--masks", default="off,on", help="grid: causal off, on")
    ap.add_argument("--passes", default="fwd,bwd", help="grid: fwd, bwd")
    ap.add_argument("--tokens", type=int, default=16384, help="grid: batch * seqlen")
    ap.add_argument("--width", type=int, default=2048, help="grid: heads * headdim")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every provider this many times in turn at each point and "
                         "report the median (run_point)")
    ap.add_argument("--paired", action="store_true",
                    help="with --rounds: in each round, time the providers call by call in "
                         "turns, so that all run under the same clock (run_point)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    if no_gpu("bench"):
        return 2

    import cupy as cp

    import cuflash
    from cuflash import _plan

    props = cp.cuda.runtime.getDeviceProperties(0)
    meta = {"device": props["name"].decode(),
            "date": datetime.datetime.now().isoformat(" ", "seconds"),
            "command": " ".join(["python"] + sys.argv), "cupy": cp.__version__,
            "python": platform.python_version()}
    try:
        import torch
        meta["torch"] = torch.__version__
    except ImportError:
        print("(torch not importable: torch providers skipped)")
    providers = [p for p in args.providers.split(",")
                 if not p.startswith("torch-") or "torch" in meta]

    if not args.grid:
        point = Point(cp, args.dtype, args.batch, args.heads, args.seqlen, args.headdim,
                      args.causal, args.which, args.kv_heads)
        configs = None
        if args.configs:
            bulk = _plan.has_bulk_copy(int(cp.cuda.Device().compute_capability))
            configs = [_plan.config_from_shape(args.which, args.headdim, c, bulk)
                       for c in args.configs.split(",")]
        print(f"{meta['device']}: {args.which} {args.dtype} b={args.batch} h={args.heads} "
              f"h_k={args.kv_heads or args.heads} n={args.seqlen} d={args.headdim} "
              f"causal={args.causal} (kernel timing)")
        rows = run_point(cp, point, providers, args.reps, args.warmup, configs,
                         log=lambda r: print(_fmt(r), flush=True), rounds=args.rounds,
                         paired=args.paired)
        ours = next((r for r in rows if r["provider"].startswith("cuflash") and r["ms"]), None)
        if ours:
            print("ratios (cuflash TFLOP/s / provider TFLOP/s):")
            for r in rows:
                if r["ms"] and not r["provider"].startswith("cuflash"):
                    r["cuflash_ratio"] = ours["tflops"] / r["tflops"]
                    print(f"  vs {r['provider']:<25} {r['cuflash_ratio']:6.2f}x")
        det = next((r for r in rows if r["provider"] == "cuflash deterministic" and r["ms"]),
                   None)
        if ours and det:
            print(f"deterministic backward: {det['ms'] / ours['ms']:.2f}x the time of the "
                  "default")
        meta["problem"] = dict(dtype=args.dtype, batch=args.batch, heads=args.heads,
                               kv_heads=args.kv_heads or args.heads, seqlen=args.seqlen,
                               headdim=args.headdim, causal=args.causal, which=args.which)
    else:
        points = [(which, dt, d, n, mask == "on")
                  for which in args.passes.split(",") for dt in args.dtypes.split(",")
                  for d in map(int, args.headdims.split(","))
                  for mask in args.masks.split(",") for n in map(int, args.seqlens.split(","))]
        import ml_dtypes
        meta["gemm_ceiling_tflops"] = {
            dt: gemm_ceiling(cp, ml_dtypes.bfloat16 if dt == "bf16" else np.float16)
            for dt in args.dtypes.split(",")}
        print(f"{meta['device']}: {len(points)} grid points x providers {providers}; "
              f"16-bit GEMM ceiling here: "
              + ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in meta["gemm_ceiling_tflops"].items()))
        cuflash.precompile(dtypes=[("bfloat16" if dt == "bf16" else "float16")
                                   for dt in args.dtypes.split(",")],
                           head_dims=[int(d) for d in args.headdims.split(",")],
                           backward="bwd" in args.passes, fa1="cuflash-fa1" in providers)
        rows, t0 = [], time.perf_counter()
        for idx, (which, dt, d, n, causal) in enumerate(points):
            b, h = args.tokens // n, args.width // d
            done = idx / len(points)
            elapsed = time.perf_counter() - t0
            eta = elapsed / done * (1 - done) if done else 0
            bar = "#" * int(30 * done)
            print(f"[{bar:<30}] {idx + 1}/{len(points)} {which} {dt} d={d} n={n} "
                  f"causal={causal} (elapsed {elapsed:.0f} s, eta {eta:.0f} s)", flush=True)
            point = Point(cp, dt, b, h, n, d, causal, which)
            rows += run_point(cp, point, providers, args.reps, args.warmup,
                              measure_memory=which == "fwd",
                              log=lambda r: print(_fmt(r), flush=True), rounds=args.rounds,
                         paired=args.paired)
            if args.json:  # after every point, so an interrupted run keeps what it measured
                write_results(args.json, meta, rows)
        print(f"[{'#' * 30}] done in {time.perf_counter() - t0:.0f} s")
    if args.json:
        write_results(args.json, meta, rows)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
