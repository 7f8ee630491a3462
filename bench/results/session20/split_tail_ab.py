"""Session 20: the Hopper forward's split tail (fa2_forward_sm90.cu) on and off, in turns,
beside cuDNN, over the standard grid's non-causal points (bf16, 16k tokens, heads x d = 2048),
kernel timing (bench.median_ms). Each variant sets _registry.SPLIT_TAIL_MIN_BLOCKS (past
any tile's column blocks: off), the grids recomputed; best of the rounds.

    python bench/results/session20/split_tail_ab.py --headdims 64,128,256 --rounds 3 \
        --variants "tail:2,planner:16,no tail:1000000000"
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", default="tail:2,no tail:1000000000",
                    help="label:SPLIT_TAIL_MIN_BLOCKS, comma-separated; the first is the "
                         "speedup's numerator, the last its denominator")
    ap.add_argument("--paired", action="store_true",
                    help="the variants' calls interleaved in one timing loop "
                         "(bench.paired_median_ms)")
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp

    import cuflash
    from cuflash import _api, _registry
    on_blocks = _registry.SPLIT_TAIL_MIN_BLOCKS
    rows = []
    for d in map(int, args.headdims.split(",")):
        for n in map(int, args.seqlens.split(",")):
            b, h = 16384 // n, 2048 // d
            pt = bench.Point(cp, "bf16", b, h, n, d, False, "fwd")
            q, k, v = pt.inputs()
            fns = {"cudnn": pt.callables("torch-cudnn")["torch-cudnn"]}
            variants = [(lab, int(x)) for lab, x in
                        (v_.split(":") for v_ in args.variants.split(","))]
            for label, blocks in variants:
                def fn(blocks=blocks, q=q, k=k, v=v):
                    if _registry.SPLIT_TAIL_MIN_BLOCKS != blocks:
                        _registry.SPLIT_TAIL_MIN_BLOCKS = blocks
                        _api._sm90_grids.clear()
                        _api._repeats.clear()
                    return cuflash.forward(q, k, v)
                fns[label] = fn
            res = {k_: [] for k_ in fns}
            for _ in range(args.rounds):
                if args.paired:
                    for label, ms in bench.paired_median_ms(cp, fns, 5, args.reps).items():
                        res[label].append(ms)
                    continue
                for label, fn in fns.items():
                    fn()
                    res[label].append(bench.median_ms(cp, fn, 5, args.reps))
            _registry.SPLIT_TAIL_MIN_BLOCKS = on_blocks
            _api._sm90_grids.clear()
            _api._repeats.clear()
            best = {k_: min(v_) for k_, v_ in res.items()}
            first, last = variants[0][0], variants[-1][0]
            row = {"d": d, "n": n, "batch": b, "heads": h, "ms": res,
                   "tflops": {k_: pt.flops / v_ / 1e9 for k_, v_ in best.items()},
                   "speedup": best[last] / best[first],
                   "vs_cudnn": {k_: best["cudnn"] / best[k_] for k_, _ in variants}}
            rows.append(row)
            print(f"d {d:3} n {n:5}: " + ", ".join(
                f"{k_} {row['tflops'][k_]:5.1f} TFLOP/s" for k_ in res) +
                f"; {first} / {last} {row['speedup']:.3f}x; vs cuDNN " + ", ".join(
                f"{k_} {x:.3f}x" for k_, x in row["vs_cudnn"].items()) +
                f"  ms {[[round(x, 4) for x in v_] for v_ in res.values()]}", flush=True)
    if args.json:
        bench.script_results(args.json, cp, rows, command=" ".join(sys.argv))


if __name__ == "__main__":
    main()
