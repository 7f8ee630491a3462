"""Compare the JSON of bench/ab.sh: per point, cuflash's TFLOP/s new / old in each round, and
the same ratio for the control provider (FA2), which should be ~1.00.

    python bench/ab_compare.py DIR     # DIR holds ab_{old,new}_{1,2}.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path) -> dict:
    rows = json.loads(path.read_text())["rows"]
    return {(r["provider"], r["which"], r["dtype"], r["headdim"], r["seqlen"], r["causal"]):
            r["tflops"] for r in rows if r.get("tflops")}


def main(argv: list[str]) -> int:
    d = Path(argv[1] if len(argv) > 1 else "gpu-logs")
    runs = {(s, r): load(d / f"ab_{s}_{r}.json") for s in ("old", "new") for r in (1, 2)}
    keys = sorted(k for k in runs["old", 1] if k[0] == "cuflash")
    print(f"{'point':34s} {'old TFLOP/s':>12s} {'new TFLOP/s':>12s}  new/old r1   r2   "
          f"FA2 new/old r1   r2")
    worst = 9.0
    for k in keys:
        _, which, dtype, hd, n, causal = k
        ctl = ("torch-flash",) + k[1:]
        ratios = [runs["new", r].get(k, 0) / runs["old", r][k] for r in (1, 2)]
        ctl_r = [runs["new", r].get(ctl, 0) / runs["old", r].get(ctl, float("nan"))
                 for r in (1, 2)]
        worst = min(worst, max(ratios))
        name = f"{which} {dtype} d{hd} n{n}{' causal' if causal else ''}"
        print(f"{name:34s} {runs['old', 1][k]:12.1f} {runs['new', 1].get(k, 0):12.1f}  "
              f"{ratios[0]:10.3f} {ratios[1]:5.3f}  {ctl_r[0]:14.3f} {ctl_r[1]:5.3f}")
    print(f"lowest new/old (the better round of each point): {worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
