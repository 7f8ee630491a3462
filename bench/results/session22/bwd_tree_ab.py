"""Session 22: the backward of several source trees in one process, interleaved in one timing
loop (bench.paired_median_ms), beside cuDNN, at the standard grid's points (16k tokens, heads
x d = 2048), kernel timing: the working tree's cuflash ("new") against other trees, each
loaded under a module name of its own (its kernels are its own: _loader finds them beside
it). Session 21's tree_ab.py with any number of other trees and both dtypes.

    python bench/results/session22/bwd_tree_ab.py --others head=bench/results/session22/trees/head \
        --headdims 128 --masks off,on --dtypes bf16
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
    ap.add_argument("--others", required=True, help="name=path,...")
    ap.add_argument("--headdims", default="128")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--masks", default="off")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import cupy as cp

    import cuflash
    trees = {"new": cuflash}
    for item in args.others.split(","):
        name, path = item.split("=")
        trees[name] = load_tree(path, f"cuflash_{name}")
        assert trees[name].__file__ != cuflash.__file__
    # every tree's kernels for these points compiled first, the trees in parallel
    from concurrent.futures import ThreadPoolExecutor
    dtypes = ["bfloat16" if dt == "bf16" else "float16" for dt in args.dtypes.split(",")]
    masks = [m == "on" for m in args.masks.split(",")]
    with ThreadPoolExecutor(len(trees)) as pool:
        list(pool.map(lambda mod: mod.precompile(
            dtypes=dtypes, head_dims=[int(d) for d in args.headdims.split(",")],
            causal=masks, max_workers=4), trees.values()))
    rows = []
    for dt in args.dtypes.split(","):
        for d in map(int, args.headdims.split(",")):
            for causal in [m == "on" for m in args.masks.split(",")]:
                for n in map(int, args.seqlens.split(",")):
                    b, h = 16384 // n, 2048 // d
                    pt = bench.Point(cp, dt, b, h, n, d, causal, "bwd")
                    q, k, v, dout = pt.inputs()
                    out, lse = cuflash.forward(q, k, v, causal=causal)
                    a = (dout, q, k, v, out, lse)
                    fns = {"cudnn": pt.callables("torch-cudnn")["torch-cudnn"]}
                    for name, mod in trees.items():
                        fns[name] = lambda a=a, mod=mod, c=causal: mod.backward(*a, causal=c)
                    ref = fns["new"]()
                    diff = {name: max(float(cp.abs(x.astype(cp.float32) -
                                                   y.astype(cp.float32)).max())
                                      for x, y in zip(fns[name](), ref))
                            for name in trees if name != "new"}
                    res = {k_: [] for k_ in fns}
                    for _ in range(args.rounds):
                        for label, ms in bench.paired_median_ms(cp, fns, 5, args.reps).items():
                            res[label].append(ms)
                    best = {k_: min(v_) for k_, v_ in res.items()}
                    row = {"dtype": dt, "d": d, "n": n, "batch": b, "heads": h,
                           "causal": causal, "ms": res,
                           "tflops": {k_: pt.flops / v_ / 1e9 for k_, v_ in best.items()},
                           "over_new": {k_: best[k_] / best["new"] for k_ in trees},
                           "vs_cudnn": {k_: best["cudnn"] / best[k_] for k_ in trees},
                           "max_diff_from_new": diff}
                    rows.append(row)
                    print(f"{dt} d {d:3} n {n:5}{' causal' if causal else '       '}: "
                          + ", ".join(f"{k_} {row['tflops'][k_]:5.1f}" for k_ in res)
                          + " TFLOP/s; time / new: "
                          + ", ".join(f"{k_} {v_:.3f}" for k_, v_ in row["over_new"].items()
                                      if k_ != "new")
                          + "; vs cuDNN: "
                          + ", ".join(f"{k_} {v_:.3f}x" for k_, v_ in row["vs_cudnn"].items())
                          + f"; max diff {diff}", flush=True)
    if args.json:
        bench.script_results(args.json, cp, rows, command=" ".join(sys.argv))


if __name__ == "__main__":
    main()
