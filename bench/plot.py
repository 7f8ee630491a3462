"""Plot a grid run of bench/bench.py like the FlashAttention papers' figures: TFLOP/s against
sequence length, one panel per (pass, head dim, mask), one line per provider.

    python bench/plot.py bench/results/grid_h200.json --dtype bf16 \
        --out bench/results/grid_h200_bf16.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STYLE = {  # provider: (label, color, marker)
    "cuflash": ("cuflash FA2", "tab:red", "o"),
    "cuflash deterministic": ("cuflash FA2 (deterministic)", "tab:pink", "o"),
    "cuflash-fa1": ("cuflash FA1", "tab:orange", "s"),
    "naive": ("naive CuPy", "tab:gray", "x"),
    "torch-flash": ("FlashAttention-2 (torch SDPA)", "tab:blue", "^"),
    "torch-cudnn": ("cuDNN (torch SDPA)", "tab:green", "v"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(args.json).read_text())
    rows = [r for r in data["rows"] if r["dtype"] == args.dtype and r.get("tflops")]
    panels = sorted({(r["which"], r["headdim"], r["causal"]) for r in rows},
                    key=lambda p: (p[0] != "fwd", p[1], p[2]))
    ncols = len({(p[1], p[2]) for p in panels}) or 1
    nrows = len({p[0] for p in panels}) or 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.6 * nrows), squeeze=False)
    for ax, (which, d, causal) in zip(axes.flat, panels):
        for provider, (label, color, marker) in STYLE.items():
            pts = sorted((r["seqlen"], r["tflops"]) for r in rows
                         if (r["which"], r["headdim"], r["causal"], r["provider"]) ==
                         (which, d, causal, provider))
            if pts:
                ax.plot(*zip(*pts), marker=marker, color=color, label=label, linewidth=1.5)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{'forward' if which == 'fwd' else 'backward'}, d={d}, "
                     f"{'causal' if causal else 'non-causal'}", fontsize=10)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for ax in axes.flat[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    fig.suptitle(f"{data['meta']['device']}, {args.dtype}, batch x seqlen = 16k tokens, "
                 "heads x d = 2048", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
