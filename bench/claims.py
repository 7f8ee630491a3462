"""The seed document's speed and memory claims, each next to what a grid run of bench/bench.py
measured on this GPU.

    python bench/claims.py bench/results/grid_h200.json --out bench/results/seed_claims.md

Every number is computed from the JSON; where a measurement falls outside the claim the report
says so and why (the explanations name the mechanism; the numbers show it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

H100_H200_DENSE_BF16_TFLOPS = 989.4  # NVIDIA datasheet, SXM, dense (no sparsity)


def _index(rows):
    by = {}
    for r in rows:
        if r.get("ms"):
            by[(r["provider"], r["which"], r["dtype"], r["headdim"], r["seqlen"],
                r["causal"])] = r
    return by


def _span(values):
    values = sorted(values)
    if not values:
        return "n/a", None
    med = statistics.median(values)
    return f"{med:.2f}x (range {values[0]:.2f}-{values[-1]:.2f}x over {len(values)} points)", med


def _by_seqlen(pairs):
    """{seqlen: [ratio...]} -> 'n=512: 1.2x, ...' (median per seqlen)."""
    out = defaultdict(list)
    for n, ratio in pairs:
        out[n].append(ratio)
    return ", ".join(f"n={n}: {statistics.median(v):.1f}x" for n, v in sorted(out.items()))


def _speedups(by, keys, other):
    """(seqlen, cuflash TFLOP/s / other's) for every forward point where both ran."""
    return [(k[4], by[k]["tflops"] / by[(other,) + k[1:]]["tflops"])
            for k in keys if k[1] == "fwd" and (other,) + k[1:] in by]


def report(data) -> str:
    meta, by = data["meta"], _index(data["rows"])
    keys = [k for k in by if k[0] == "cuflash"]
    lines = [f"# Seed claims, measured ({meta['device']}, {meta['date']})", "",
             f"Source: `{meta['command']}`; JSON next to this file. Grid: batch x seqlen = "
             "16k tokens, heads x d = 2048, d 64/128, fp16/bf16, causal off/on. Ratios are "
             "medians over the grid points where both sides ran.", "",
             "| claim (seed document) | measured | agrees? |", "| --- | --- | --- |"]
    notes = []

    # 1. FA2 vs FA1
    pairs = _speedups(by, keys, "cuflash-fa1")
    text, med = _span([p[1] for p in pairs])
    ok = med is not None and 1.5 <= med <= 3
    lines.append(f"| FlashAttention-2 is about 2x faster than FlashAttention-1 | forward "
                 f"{text}; by seqlen: {_by_seqlen(pairs)} | {'yes' if ok else 'no'} |")
    notes.append(
        "**FA2 vs FA1.** Both run on the same mma.sync primitives, so the ratio measures the "
        "algorithm: FA1 gives one thread block per (batch, head) and sends O, l, m through HBM "
        "at every inner step; FA2 gives one per (row block, head, batch) and keeps them in "
        "registers. The grid holds the tokens fixed, so batch x heads falls as seqlen grows "
        "(512 -> 16 blocks at seqlen 16384, d 128): FA1 then occupies a fraction of the "
        "GPU's SMs while FA2 still has seqlen / B_r row blocks per head. That is why the "
        "ratio grows with seqlen instead of staying near the seed's 2x, which was measured "
        "on A100 at shorter sequences. Where FA1 does fill the GPU (seqlen 512: batch x heads "
        "= 512 or more blocks) the gap that remains is the HBM round trip itself: every inner "
        "step reads and writes O_i (float32, B_r x d) and l_i, m_i, i.e. T_c times the "
        "output's size in traffic, and rescales O_i with non-matmul FLOPs at every step, "
        "where FA2 rescales in registers and divides once.")

    # 2. FA2 vs standard attention
    pairs = _speedups(by, keys, "naive")
    text, med = _span([p[1] for p in pairs])
    ok = med is not None and 5 <= med <= 9
    lines.append(f"| FA2 is 5-9x faster than standard attention | forward {text}; by seqlen: "
                 f"{_by_seqlen(pairs)} | {'yes' if ok else 'no'} |")
    notes.append(
        "**FA2 vs standard attention.** The baseline materialises S and P: two cuBLAS GEMMs in "
        "the input dtype plus CuPy's softmax passes over an N x N float32 matrix. Its time is "
        "dominated by those memory-bound passes, whose cost grows like the FLOPs but at HBM "
        "speed, so the ratio depends on seqlen and on how well the baseline fuses; the seed's "
        "5-9x compares against PyTorch's own (partly fused) attention on A100. Points where "
        "S and P would not fit in memory are skipped.")

    # 3. causal speed-up
    for which in ("fwd", "bwd"):
        pairs = [(k[4], by[k[:5] + (False,)]["ms"] / by[k]["ms"]) for k in keys
                 if k[1] == which and k[5] and k[:5] + (False,) in by]
        text, med = _span([p[1] for p in pairs])
        ok = med is not None and 1.6 <= med <= 1.9
        lines.append(f"| causal is 1.7-1.8x faster than non-causal ({which}) | {text}; by "
                     f"seqlen: {_by_seqlen(pairs)} | {'yes' if ok else 'no'} |")
    notes.append(
        "**Causal speed-up.** Skipping the blocks above the diagonal halves the FLOPs, so 2x is "
        "the ceiling; the blocks on the diagonal are computed in full and masked, which costs "
        "relatively more at short sequences (fewer blocks per row), and the first row blocks "
        "have little work to hide latency. The ratio therefore approaches 2x as seqlen grows.")

    # 4. memory
    pairs = [(k[4], by[("naive",) + k[1:]]["extra_bytes"] / by[k]["extra_bytes"])
             for k in keys if k[1] == "fwd" and ("naive",) + k[1:] in by
             and by[k].get("extra_bytes")]
    text, med = _span([p[1] for p in pairs])
    ok = med is not None and 10 <= med <= 20
    lines.append(f"| FlashAttention saves 10-20x memory over standard attention | "
                 f"{text}; by seqlen: {_by_seqlen(pairs)} | {'yes' if ok else 'no'} |")
    notes.append(
        "**Memory.** Measured as the device memory a forward call allocates beyond its inputs: "
        "cuflash allocates O and the log-sum-exp (linear in seqlen), the standard attention S "
        "and P (quadratic). The ratio is therefore not a constant: it grows about linearly with "
        "seqlen. The seed's 10-20x is the saving at the sequence lengths of the original "
        "paper's experiments; at 16k tokens per batch the measured range above is what holds.")

    # 5. fraction of peak
    ceiling = meta.get("gemm_ceiling_tflops", {})
    for which in ("fwd", "bwd"):
        vals = [by[k]["tflops"] for k in keys if k[1] == which]
        if not vals:
            continue
        best, med = max(vals), statistics.median(vals)
        gemm = max(ceiling.values()) if ceiling else None
        peak = H100_H200_DENSE_BF16_TFLOPS
        lines.append(
            f"| FA2 reaches 25-40% (FA1) / ~35% on H100 of the theoretical peak ({which}) | "
            f"median {med:.0f}, best {best:.0f} TFLOP/s = {100 * med / peak:.0f}% / "
            f"{100 * best / peak:.0f}% of {peak:.0f}"
            + (f"; {100 * best / gemm:.0f}% of the {gemm:.0f} TFLOP/s cuBLAS GEMM measured in "
               "the same run" if gemm else "") + " | "
            + ("yes" if 0.25 <= best / peak <= 0.45 else "no") + " |")
    notes.append(
        "**Fraction of peak.** The H100/H200 datasheet's dense 16-bit peak (989 TFLOP/s) is "
        "reachable only with Hopper's wgmma instructions; these kernels use the portable "
        "mma.sync path (sm_80+), which on Hopper tops out well below it, as FlashAttention-2's "
        "own kernels do. The seed's 35% on H100 describes exactly this situation for the "
        "forward; FlashAttention-3 and cuDNN (see the JSON) use wgmma to go further. cuflash's "
        "backward is below the claim: it reaches about 0.6-0.8x of FlashAttention-2's backward "
        "(float32 dQ atomics with B_c = 64, P and dS through shared memory; see PERFORMANCE.md).")

    return "\n".join(lines + ["", "## Why the numbers fall where they do", ""]
                     + [n + "\n" for n in notes])


def table(data, dtype="bf16") -> str:
    """Markdown table: TFLOP/s per provider at every grid point of one dtype."""
    rows = [r for r in data["rows"] if r["dtype"] == dtype]
    providers = [p for p in ("cuflash", "cuflash deterministic", "cuflash-fa1", "naive",
                             "torch-flash", "torch-cudnn") if any(r["provider"] == p for r in rows)]
    by = {(r["which"], r["headdim"], r["causal"], r["seqlen"], r["provider"]): r for r in rows}
    keys = sorted({k[:4] for k in by}, key=lambda k: (k[0] != "fwd", k[1], k[2], k[3]))
    out = [f"TFLOP/s, {dtype}, {data['meta']['device']} (one run; '-' = not run or not "
           "applicable; vs FA2 = cuflash / torch-flash)", "",
           "| pass | d | causal | seqlen | " + " | ".join(providers) + " | vs FA2 |",
           "| --- " * (5 + len(providers)) + "|"]
    for k in keys:
        cells = []
        for p in providers:
            r = by.get(k + (p,))
            cells.append(f"{r['tflops']:.0f}" if r and r.get("tflops") else "-")
        ours, fa2 = by.get(k + ("cuflash",)), by.get(k + ("torch-flash",))
        ratio = (f"{ours['tflops'] / fa2['tflops']:.2f}x"
                 if ours and fa2 and ours.get("tflops") and fa2.get("tflops") else "-")
        out.append(f"| {k[0]} | {k[1]} | {'yes' if k[2] else 'no'} | {k[3]} | "
                   + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--table-out", help="also write the per-point TFLOP/s table here")
    ap.add_argument("--dtype", default="bf16", help="dtype of the table")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.json).read_text())
    text = report(data)
    Path(args.out).write_text(text)
    print(text)
    if args.table_out:
        Path(args.table_out).write_text(table(data, args.dtype))
        print(f"wrote {args.table_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
