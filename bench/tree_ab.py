"""A/B of source trees: the working tree's cuflash against other copies of the package, loaded
side by side in one process, timed in turns in one loop (bench.paired_median_ms) beside cuDNN,
at the standard grid's points (batch x seqlen = 16k tokens, heads x d = 2048), kernel timing.

An "other" tree is a folder that holds cuflash/ and kernels/, for instance a commit's:

    git archive HEAD cuflash kernels | tar -x -C /tmp/head     # (an empty folder)
    python bench/tree_ab.py --others head=/tmp/head --pass bwd --headdims 128 --masks off,on

Each tree is imported under a module name of its own (cuflash_<name>) and compiles its own
kernels (its loader reads the kernels/ beside it), so a kernel change and its parent run in
the same process, on the same inputs, in the same timing loop: the GPU's clock drifting
between separate runs moved one variant's median by up to 5% (session 20), more than most
effects measured. Every point also prints the largest difference between each tree's
results and the working tree's (0 for bitwise equal; the default backward adds in an order
that varies from run to run, so there it is a few units in the last place).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402


def parse_others(text: str) -> dict:
    """"name=folder,..." as {name: Path}; each folder must hold cuflash/__init__.py."""
    others = {}
    for item in filter(None, text.split(",")):
        name, sep, path = item.partition("=")
        if not sep or not name.isidentifier() or name in ("new", "cudnn") or name in others:
            raise ValueError(f"--others: {item!r} is not name=folder with a new identifier "
                             "for a name (not 'new' or 'cudnn')")
        folder = Path(path)
        if not (folder / "cuflash" / "__init__.py").is_file():
            raise ValueError(f"--others: {folder} holds no cuflash/__init__.py")
        others[name] = folder
    return others


def load_tree(folder, alias: str):
    """The cuflash package of `folder` imported as module `alias` (its own kernels/)."""
    pkg = Path(folder).resolve() / "cuflash"
    spec = importlib.util.spec_from_file_location(alias, pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[alias] = mod
    spec.loader.exec_module(mod)
    return mod


def _max_diff(cp, got, ref) -> float:
    return max(float(cp.abs(x.astype(cp.float32) - y.astype(cp.float32)).max())
               for x, y in zip(got, ref))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--others", required=True, help="name=folder,... (see above)")
    ap.add_argument("--pass", dest="which", choices=["fwd", "bwd"], default="bwd")
    ap.add_argument("--headdims", default="128")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--masks", default="off", help="causal off, on")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--rounds", type=int, default=2, help="timing loops per point (best kept)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    others = parse_others(args.others)
    if bench.no_gpu("tree_ab"):
        return 2

    from concurrent.futures import ThreadPoolExecutor

    import cupy as cp

    import cuflash
    trees = {"new": cuflash}
    for name, folder in others.items():
        trees[name] = load_tree(folder, f"cuflash_{name}")
        if Path(trees[name].__file__).resolve() == Path(cuflash.__file__).resolve():
            raise SystemExit(f"tree_ab: {folder} is the working tree itself")
    dtypes = args.dtypes.split(",")
    masks = [m == "on" for m in args.masks.split(",")]
    headdims = [int(d) for d in args.headdims.split(",")]
    # every tree's kernels for these points first, the trees in parallel
    with ThreadPoolExecutor(len(trees)) as pool:
        list(pool.map(lambda mod: mod.precompile(
            dtypes=["bfloat16" if dt == "bf16" else "float16" for dt in dtypes],
            head_dims=headdims, causal=masks, backward=args.which == "bwd", max_workers=4),
            trees.values()))
    rows = []
    for dt in dtypes:
        for d in headdims:
            for causal in masks:
                for n in map(int, args.seqlens.split(",")):
                    rows.append(_point(cp, cuflash, trees, args, dt, d, causal, n))
    if args.json:
        bench.script_results(args.json, cp, rows)
        print(f"wrote {args.json}")
    return 0


def _point(cp, cuflash, trees, args, dt, d, causal, n) -> dict:
    b, h = 16384 // n, 2048 // d
    pt = bench.Point(cp, dt, b, h, n, d, causal, args.which)
    fns = {"cudnn": pt.callables("torch-cudnn")["torch-cudnn"]}
    if args.which == "fwd":
        q, k, v = pt.inputs()
        for name, mod in trees.items():
            fns[name] = lambda mod=mod: mod.forward(q, k, v, causal=causal)
    else:
        q, k, v, dout = pt.inputs()
        out, lse = cuflash.forward(q, k, v, causal=causal)
        for name, mod in trees.items():
            fns[name] = lambda mod=mod: mod.backward(dout, q, k, v, out, lse, causal=causal)
    ref = fns["new"]()
    diff = {name: _max_diff(cp, fns[name](), ref) for name in trees if name != "new"}
    res = {label: [] for label in fns}
    for _ in range(args.rounds):
        for label, ms in bench.paired_median_ms(cp, fns, 5, args.reps).items():
            res[label].append(ms)
    best = {label: min(times) for label, times in res.items()}
    row = {"which": args.which, "dtype": dt, "d": d, "n": n, "batch": b, "heads": h,
           "causal": causal, "ms": res,
           "tflops": {label: pt.flops / ms / 1e9 for label, ms in best.items()},
           "time_over_new": {name: best[name] / best["new"] for name in trees},
           "cudnn_time_over": {name: best["cudnn"] / best[name] for name in trees},
           "max_diff_from_new": diff}
    print(f"{args.which} {dt} d {d:3} n {n:5}{' causal' if causal else '       '}: "
          + ", ".join(f"{label} {row['tflops'][label]:5.1f}" for label in res)
          + " TFLOP/s; time / new's: "
          + ", ".join(f"{name} {r:.3f}" for name, r in row["time_over_new"].items()
                      if name != "new")
          + "; cuDNN's time / ours: "
          + ", ".join(f"{name} {r:.3f}" for name, r in row["cudnn_time_over"].items())
          + "; max diff from new: " + ", ".join(f"{name} {x:.3g}" for name, x in diff.items()),
          flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
