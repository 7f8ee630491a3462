"""cuflash against FlashAttention-2 (torch SDPA FLASH_ATTENTION) at every point of one or more
bench.py grid runs: the ratio table and the list of points below target.

    python bench/parity.py bench/results/grid_h200_parity.json \
        bench/results/buckets_h200_parity.json --out bench/results/parity_h200.md

Targets (issue 5): TFLOP/s >= 1.0x FA2 at head dims 64 and 128 (the standard grid), >= 0.9x at
the other head dims; the deterministic backward within 15% of the default's time.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

GRID_DIMS = (64, 128)
DETERMINISTIC_LIMIT = 1.15


def target(d: int) -> float:
    return 1.0 if d in GRID_DIMS else 0.9


def collect(paths):
    """{(pass, dtype, d, causal, seqlen): {provider: row}} over every file."""
    points = defaultdict(dict)
    for path in paths:
        for r in json.loads(Path(path).read_text())["rows"]:
            if r.get("ms"):
                key = (r["which"], r["dtype"], r["headdim"], r["causal"], r["seqlen"])
                points[key][r["provider"]] = r
    return points


def table(points):
    """Markdown lines: one row per point, and the points below target."""
    lines = ["| pass | dtype | d | causal | seqlen | cuflash | FA2 | ratio | target | "
             "deterministic / default time |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    below = []
    for key in sorted(points, key=lambda k: (k[0] != "fwd", k[1], k[2], k[3], k[4])):
        which, dt, d, causal, n = key
        p = points[key]
        if "cuflash" not in p or "torch-flash" not in p:
            continue
        ours, fa2 = p["cuflash"]["tflops"], p["torch-flash"]["tflops"]
        ratio = ours / fa2
        det = p.get("cuflash deterministic")
        det_ratio = det["ms"] / p["cuflash"]["ms"] if det else None
        ok = ratio >= target(d) - 1e-9
        det_ok = det_ratio is None or det_ratio <= DETERMINISTIC_LIMIT
        lines.append(f"| {which} | {dt} | {d} | {'yes' if causal else 'no'} | {n} | "
                     f"{ours:.1f} | {fa2:.1f} | {'' if ok else '**'}{ratio:.2f}x"
                     f"{'' if ok else '**'} | {target(d):.1f}x | "
                     + (f"{det_ratio:.2f}x" if det_ratio else "-") + " |")
        if not ok:
            below.append(f"{which} {dt} d={d} causal={causal} n={n}: {ratio:.2f}x "
                         f"(target {target(d):.1f}x)")
        if not det_ok:
            below.append(f"{which} {dt} d={d} causal={causal} n={n}: deterministic "
                         f"{det_ratio:.2f}x the default's time (limit {DETERMINISTIC_LIMIT})")
    return lines, below


def summary(points):
    """Lines: min / median / max ratio per (pass, dtype, d)."""
    groups = defaultdict(list)
    for (which, dt, d, _causal, _n), p in points.items():
        if "cuflash" in p and "torch-flash" in p:
            groups[(which, dt, d)].append(p["cuflash"]["tflops"] / p["torch-flash"]["tflops"])
    out = ["| pass | dtype | d | points | min | median | max |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for (which, dt, d), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != "fwd",) + kv[0]):
        rs = sorted(rs)
        out.append(f"| {which} | {dt} | {d} | {len(rs)} | {rs[0]:.2f}x | "
                   f"{rs[len(rs) // 2]:.2f}x | {rs[-1]:.2f}x |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out", help="write the markdown here (default: stdout)")
    args = ap.parse_args(argv)
    points = collect(args.json)
    rows, below = table(points)
    metas = [json.loads(Path(p).read_text())["meta"] for p in args.json]
    text = ["# cuflash vs FlashAttention-2, every measured point", "",
            "TFLOP/s from " + ", ".join(f"`{Path(p).name}` ({m.get('device')}, "
                                         f"{m.get('date')}: `{m.get('command')}`)"
                                         for p, m in zip(args.json, metas))
            + ". FA2 = torch SDPA FLASH_ATTENTION in the same run. Bold: below target.", "",
            "## Summary", "", *summary(points), "", "## Every point", "", *rows, "",
            "## Below target", ""]
    text += [f"- {b}" for b in below] or ["- none"]
    out = "\n".join(text) + "\n"
    if args.out:
        Path(args.out).write_text(out)
    else:
        print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
