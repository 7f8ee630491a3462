"""Session 22: the Hopper forward's tile (the planner's) with one Q_i slot against the same
tile with two (q_stages=1, 2), interleaved in one timing loop (bench.paired_median_ms), beside
cuDNN, at the standard grid's points (16k tokens, heads x d = 2048), kernel timing. Only the
points whose tile has room for a second Q_i slot.

    python bench/results/session22/q_ab.py --headdims 64,128 --dtypes bf16,fp16
"""
import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench  # noqa: E402

SMEM_LIMIT = 232448


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--masks", default="off,on")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp

    from cuflash import _api, _loader, _plan, _registry
    points = []
    for dt in args.dtypes.split(","):
        for d in map(int, args.headdims.split(",")):
            for causal in [m == "on" for m in args.masks.split(",")]:
                for n in map(int, args.seqlens.split(",")):
                    cfg = dataclasses.replace(_plan.sm90_forward_config(d, causal, n),
                                              q_stages=1)
                    two = dataclasses.replace(cfg, q_stages=2)
                    if two.smem_bytes <= SMEM_LIMIT:
                        points.append((dt, d, causal, n, cfg, two))
    # both tiles' kernels compiled first, in parallel
    var = _registry.FA2_FORWARD_SM90
    names = {(var.source, _plan.sm90_forward_kernel_name(
        "bfloat16" if dt == "bf16" else "float16", c, causal), var.options)
        for dt, d, causal, n, cfg, two in points for c in (cfg, two)}
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda x: _loader.get_kernel(*x), names))
    print(f"{len(names)} kernels compiled", flush=True)
    rows = []
    for dt, d, causal, n, cfg, two in points:
        b, h = 16384 // n, 2048 // d
        pt = bench.Point(cp, dt, b, h, n, d, causal, "fwd")
        q, k, v = pt.inputs()
        fns = {"cudnn": pt.callables("torch-cudnn")["torch-cudnn"]}
        for label, c in (("q1", cfg), ("q2", two)):
            fns[label] = (lambda c=c, a=(q, k, v, causal): _api._forward(
                *a, None, None, None, "fa2", False, c))
        o1, l1 = fns["q1"]()
        o2, l2 = fns["q2"]()
        same = bool((o1 == o2).all()) and bool((l1 == l2).all())
        res = {k_: [] for k_ in fns}
        for _ in range(args.rounds):
            for label, ms in bench.paired_median_ms(cp, fns, 5, args.reps).items():
                res[label].append(ms)
        best = {k_: min(v_) for k_, v_ in res.items()}
        row = {"dtype": dt, "d": d, "n": n, "batch": b, "heads": h,
               "causal": causal, "tile": cfg.tile_type, "ms": res,
               "tflops": {k_: pt.flops / v_ / 1e9 for k_, v_ in best.items()},
               "q1_over_q2": best["q1"] / best["q2"], "bitwise_same": same,
               "vs_cudnn": {k_: best["cudnn"] / best[k_] for k_ in ("q1", "q2")}}
        rows.append(row)
        print(f"{dt} d {d:3} n {n:5}{' causal' if causal else '       '}: "
              + ", ".join(f"{k_} {row['tflops'][k_]:5.1f}" for k_ in res)
              + f" TFLOP/s; q1 / q2 time {row['q1_over_q2']:.3f}; vs cuDNN q1 "
              f"{row['vs_cudnn']['q1']:.3f}x, q2 {row['vs_cudnn']['q2']:.3f}x; "
              f"bitwise same {same}", flush=True)
    if args.json:
        bench.script_results(args.json, cp, rows, command=" ".join(sys.argv))


if __name__ == "__main__":
    main()
