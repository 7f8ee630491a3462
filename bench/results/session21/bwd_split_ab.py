"""Session 21: the Hopper backward's split tail (fa2_backward_sm90.cu) at several part costs
and off, interleaved in one timing loop (bench.paired_median_ms), beside cuDNN, over the
standard grid's points (16k tokens, heads x d = 2048), kernel timing. A variant sets
_registry.SPLIT_PART_COST (label:cost), or turns the split off (label:off).

    python bench/results/session21/bwd_split_ab.py --headdims 64,128 --rounds 2 \
        --variants "split:3,cost1:1,cost8:8,off:off"
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", default="split:3,off:off",
                    help="label:SPLIT_PART_COST or label:off, comma-separated; the first is "
                         "the speedup's numerator's, the last its denominator's")
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp

    import cuflash
    from cuflash import _registry
    cost0, max0 = _registry.SPLIT_PART_COST, _registry.SPLIT_MAX_PARTS
    variants = [v_.split(":") for v_ in args.variants.split(",")]
    rows = []
    for d in map(int, args.headdims.split(",")):
        for n in map(int, args.seqlens.split(",")):
            b, h = 16384 // n, 2048 // d
            pt = bench.Point(cp, args.dtype, b, h, n, d, args.causal, "bwd")
            q, k, v, dout = pt.inputs()
            out, lse = cuflash.forward(q, k, v, causal=args.causal)
            fns = {"cudnn": pt.callables("torch-cudnn")["torch-cudnn"]}
            for label, x in variants:
                def fn(x=x, args_=(dout, q, k, v, out, lse)):
                    _registry.SPLIT_PART_COST = cost0 if x == "off" else int(x)
                    _registry.SPLIT_MAX_PARTS = 1 if x == "off" else max0
                    return cuflash.backward(*args_, causal=args.causal)
                fns[label] = fn
            res = {k_: [] for k_ in fns}
            for _ in range(args.rounds):
                for label, ms in bench.paired_median_ms(cp, fns, 5, args.reps).items():
                    res[label].append(ms)
            _registry.SPLIT_PART_COST, _registry.SPLIT_MAX_PARTS = cost0, max0
            tiles = -(-n // 128) * h * b
            splits = {lab: (_registry._backward_split(tiles, n // 64, 132, int(x), max0)
                            if x != "off" else (tiles, 1)) for lab, x in variants}
            best = {k_: min(v_) for k_, v_ in res.items()}
            first, last = variants[0][0], variants[-1][0]
            row = {"d": d, "n": n, "batch": b, "heads": h, "causal": args.causal, "ms": res,
                   "split": splits,
                   "tflops": {k_: pt.flops / v_ / 1e9 for k_, v_ in best.items()},
                   "speedup": best[last] / best[first],
                   "vs_cudnn": {k_: best["cudnn"] / best[k_] for k_, _ in variants}}
            rows.append(row)
            print(f"d {d:3} n {n:5}: " + ", ".join(
                f"{k_} {row['tflops'][k_]:5.1f}" for k_ in res) +
                f" TFLOP/s; {last} / {first} time {row['speedup']:.3f}; vs cuDNN " + ", ".join(
                f"{k_} {x:.3f}x" for k_, x in row["vs_cudnn"].items()) +
                f"; (whole, parts) {splits}", flush=True)
    if args.json:
        bench.script_results(args.json, cp, rows, command=" ".join(sys.argv))


if __name__ == "__main__":
    main()
