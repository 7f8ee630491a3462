"""Session 29, call 7: is the backward slower with its dependent launches on? Under torch's
profiler (call 6) our causal d 128 n 16k call took 5.07 ms a call back to back, against
5.50 ms without the profiler (call 5), while cuDNN's took 5.25 and 5.35. At backward points,
ours with dependent launches (pdl) and without (serial: cuflash._loader.DEPENDENT_LAUNCHES
off for the call) beside cuDNN: kernel timing (bench.paired_median_ms, the L2 flushed before
each call, the three taken in turns), 3 rounds; then back to back (no flush) for ~1 s each,
2 turns, with the time per call from two events around the window."""
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, "bench")
import bench  # noqa: E402
from cuflash import _loader  # noqa: E402


def serial(fn):
    def call():
        _loader.DEPENDENT_LAUNCHES = False
        try:
            fn()
        finally:
            _loader.DEPENDENT_LAUNCHES = True
    return call


def window(fn, est_ms, seconds=1.0):
    calls = max(3, int(seconds * 1e3 / est_ms))
    s, e = cp.cuda.Event(), cp.cuda.Event()
    cp.cuda.Device().synchronize()
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    e.synchronize()
    return cp.cuda.get_elapsed_time(s, e) / calls


for spec in sys.argv[1].split(","):
    which, dtype, d, n, *mask = spec.split()
    d, n = int(d), int(n)
    point = bench.Point(cp, dtype, 16384 // n, 2048 // d, n, d, bool(mask), which)
    ours = point.callables("cuflash")["cuflash"]
    cudnn = point.callables("torch-cudnn")["torch-cudnn"]
    fns = {"pdl": ours, "serial": serial(ours), "cudnn": cudnn}
    for fn in fns.values():
        fn()
    rounds = [bench.paired_median_ms(cp, fns, 5, 30) for _ in range(3)]
    med = {k: float(np.median([r[k] for r in rounds])) for k in fns}
    sus = {k: [] for k in fns}
    for turn in range(2):
        for k in (list(fns) if turn == 0 else list(fns)[::-1]):
            sus[k].append(window(fns[k], med[k]))
    smed = {k: float(np.median(v)) for k, v in sus.items()}
    for label, m in (("kernel timing", med), ("back to back", smed)):
        print(f"{spec:<22} {label:<13} ms: " + ", ".join(f"{k} {v:.3f}" for k, v in m.items())
              + f" | cudnn/pdl {m['cudnn'] / m['pdl']:.3f}, cudnn/serial "
              f"{m['cudnn'] / m['serial']:.3f}, serial/pdl {m['serial'] / m['pdl']:.3f}",
              flush=True)
    del fns, ours, point
    bench.release_memory(cp, True)
