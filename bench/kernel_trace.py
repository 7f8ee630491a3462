"""Where a call's GPU time goes, kernel by kernel, under sustained load: each provider's calls
run back to back for `--warm` seconds (the card reaches its power-limited clock), then
`--calls` more run under torch's profiler (CUPTI traces every kernel in the process, CuPy's
too), and each kernel's mean duration per call is printed beside the span of one call (first
kernel's start to last kernel's end, over the calls). Needs torch (bench only).

    python bench/kernel_trace.py --points "bwd bf16 128 16384 c,bwd bf16 128 16384"

A point is "PASS DTYPE HEADDIM SEQLEN [c]" on the standard grid (bench.Point.from_spec).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def _short(name: str) -> str:
    """A kernel's name cut to something readable (templates dropped)."""
    name = name.split("<")[0].split("(")[0]
    return name[:70]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", required=True)
    ap.add_argument("--providers", default="cuflash,torch-cudnn")
    ap.add_argument("--warm", type=float, default=1.0)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if bench.no_gpu("kernel_trace"):
        return 2
    import cupy as cp
    import torch
    from torch.profiler import ProfilerActivity, profile

    out = []
    for spec in args.points.split(","):
        point = bench.Point.from_spec(cp, spec)
        for provider in args.providers.split(","):
            fn = point.call(provider)
            fn()
            cp.cuda.Device().synchronize()
            t0 = time.time()
            while time.time() - t0 < args.warm:
                for _ in range(4):
                    fn()
                cp.cuda.Device().synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    fn()
                cp.cuda.Device().synchronize()
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
            per = defaultdict(float)
            for e in kernels:
                per[_short(e.name)] += e.time_range.elapsed_us() / args.calls
            starts = [e.time_range.start for e in kernels]
            ends = [e.time_range.end for e in kernels]
            span = (max(ends) - min(starts)) / args.calls if kernels else 0.0
            busy = sum(per.values())
            print(f"{spec:<22} {provider:<12} per call: span {span:8.1f} us, kernels "
                  f"{busy:8.1f} us ({point.flops / busy / 1e6:6.1f} TFLOP/s on kernel time)",
                  flush=True)
            for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
                print(f"    {us:8.1f} us  {name}", flush=True)
            out.append(dict(point=spec, provider=provider, span_us=span, kernels_us=dict(per)))
            del fn
        del point
        bench.release_memory(cp, True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
