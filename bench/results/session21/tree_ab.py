"""Session 21: the backward of two source trees in one process, interleaved in one timing
loop (bench.paired_median_ms), beside cuDNN, over the standard grid's points (16k tokens,
heads x d = 2048), kernel timing: the working tree's cuflash against another tree's, loaded
under another module name (its kernels are its own: _loader finds them beside it).

    python bench/results/session21/tree_ab.py --other bench/results/session21/head_tree \
        --headdims 64,128 --causal
"""
import argparse
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench  # noqa: E402


def load_tree(path, alias):
    pkg = Path(path) / "cuflash"
    spec = importlib.util.spec_from_file_location(alias, pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[alias] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True)
    ap.add_argument("--headdims", default="64,128")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp

    import cuflash
    other = load_tree(args.other, "cuflash_other")
    assert other.__file__ != cuflash.__file__
    rows = []
    for d in map(int, args.headdims.split(",")):
        for n in map(int, args.seqlens.split(",")):
            b, h = 16384 // n, 2048 // d
            pt = bench.Point(cp, args.dtype, b, h, n, d, args.causal, "bwd")
            q, k, v, dout = pt.inputs()
            out, lse = cuflash.forward(q, k, v, causal=args.causal)
            a = (dout, q, k, v, out, lse)
            fns = {"cudnn": pt.callables("torch-cudnn")["torch-cudnn"],
                   "new": lambda a=a: cuflash.backward(*a, causal=args.causal),
                   "other": lambda a=a: other.backward(*a, causal=args.causal)}
            ref = fns["other"]()
            got = fns["new"]()
            diff = max(float(cp.abs(x.astype(cp.float32) - y.astype(cp.float32)).max())
                       for x, y in zip(got, ref))
            res = {k_: [] for k_ in fns}
            for _ in range(args.rounds):
                for label, ms in bench.paired_median_ms(cp, fns, 5, args.reps).items():
                    res[label].append(ms)
            best = {k_: min(v_) for k_, v_ in res.items()}
            row = {"d": d, "n": n, "batch": b, "heads": h, "causal": args.causal, "ms": res,
                   "tflops": {k_: pt.flops / v_ / 1e9 for k_, v_ in best.items()},
                   "other_over_new": best["other"] / best["new"], "max_diff": diff,
                   "vs_cudnn": {k_: best["cudnn"] / best[k_] for k_ in ("new", "other")}}
            rows.append(row)
            print(f"d {d:3} n {n:5}{' causal' if args.causal else ''}: " + ", ".join(
                f"{k_} {row['tflops'][k_]:5.1f}" for k_ in res) +
                f" TFLOP/s; other / new time {row['other_over_new']:.3f}; vs cuDNN new "
                f"{row['vs_cudnn']['new']:.3f}x, other {row['vs_cudnn']['other']:.3f}x; "
                f"max |new - other| {diff:.3g}", flush=True)
    if args.json:
        bench.script_results(args.json, cp, rows, command=" ".join(sys.argv))


if __name__ == "__main__":
    main()
