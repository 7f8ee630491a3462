"""The GPU's SM clock and power while one provider runs back to back, against another's at
the same point: does a provider lose because it does more work per cycle, or because it runs
at a lower clock (the card's power limit) than its peer?

For each point, the providers take turns (`--turns` windows each, the order reversed every
other turn); in each window one provider's calls run back to back for `--window` seconds of
GPU time, with nvidia-smi sampling clocks.sm, power.draw and temperature every 50 ms beside
it. Per window: the time per call (events around the whole window, no L2 flush: this is a
sustained load, not the headline kernel timing) and the median clock and power over the
window's second half.

    python bench/power_probe.py --points "bwd bf16 128 16384 c,fwd fp16 128 2048"

A point is "PASS DTYPE HEADDIM SEQLEN [c]" on the standard grid (bench.Point.from_spec).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu"


def _sampler(path):
    """nvidia-smi writing one line every 50 ms to path (the process, to stop later)."""
    return subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={_FIELDS}", "--format=csv,noheader,nounits",
         "-lms", "50", "-f", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _read_samples(path):
    """[(unix time, SM MHz, W, C)] from the sampler's file."""
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            t = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            t += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            out.append((t, float(parts[1]), float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return out


def _window(cp, fn, seconds, est_ms):
    """(ms per call, host start, host end) of back-to-back calls of fn for ~seconds."""
    calls = max(3, int(seconds * 1e3 / est_ms))
    start, end = cp.cuda.Event(), cp.cuda.Event()
    cp.cuda.get_current_stream().synchronize()
    t0 = time.time()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    t1 = time.time()
    return cp.cuda.get_elapsed_time(start, end) / calls, t0, t1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", required=True)
    ap.add_argument("--providers", default="cuflash,torch-cudnn")
    ap.add_argument("--window", type=float, default=1.5)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if bench.no_gpu("power_probe"):
        return 2
    import cupy as cp

    rows = []
    fd, path = tempfile.mkstemp(suffix=".csv")
    os.close(fd)
    sampler = _sampler(path)
    try:
        for spec in args.points.split(","):
            point = bench.Point.from_spec(cp, spec)
            fns = {provider: point.call(provider) for provider in args.providers.split(",")}
            est = {}
            for provider, fn in fns.items():  # compile, warm, and a first time per call
                fn()
                est[provider] = bench.median_ms(cp, fn, 3, 5)
            order = list(fns)
            for turn in range(args.turns):
                for provider in order if turn % 2 == 0 else order[::-1]:
                    ms, t0, t1 = _window(cp, fns[provider], args.window, est[provider])
                    rows.append(dict(point=spec, provider=provider, turn=turn, ms=ms,
                                     tflops=point.flops / ms / 1e9, t0=t0, t1=t1))
            del fns
            bench.release_memory(cp, True)
            time.sleep(0.3)
    finally:
        time.sleep(0.2)
        sampler.terminate()
        sampler.wait()
    samples = _read_samples(path)
    for row in rows:
        mid = (row["t0"] + row["t1"]) / 2
        got = [s for s in samples if mid <= s[0] <= row["t1"]]
        row["samples"] = len(got)
        if got:
            row["sm_mhz"] = float(np.median([s[1] for s in got]))
            row["watts"] = float(np.median([s[2] for s in got]))
            row["temp_c"] = max(s[3] for s in got)
        print(f"{row['point']:<22} {row['provider']:<12} turn {row['turn']}: "
              f"{row['ms']:7.3f} ms {row['tflops']:6.1f} TFLOP/s  "
              f"SM {row.get('sm_mhz', 0):6.0f} MHz  {row.get('watts', 0):5.0f} W  "
              f"{row.get('temp_c', 0):3.0f} C  ({row['samples']} samples)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, samples=samples), f, indent=1)
    os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
