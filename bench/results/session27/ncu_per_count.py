"""The instructions of an ncu SASS export grouped by how often each executed: at d 64 causal
n 512 (session 27) 81920 = column-block steps x consumer warps, 32768 = tiles x consumer warps,
so the groups are the work per step and per tile.

    python ncu_per_count.py call2/sass_d64_n512_c1.csv.gz
"""
import collections
import sys

from ncu_sass_csv import load, opcode


def main(path):
    for k in load(path):
        count, ops = collections.Counter(), collections.defaultdict(collections.Counter)
        for r in k["rows"]:
            n = int(r["Instructions Executed"] or 0)
            if n:
                count[n] += 1
                ops[n][opcode(r["Source"])] += 1
        total = sum(n * m for n, m in count.items())
        print("==", k["name"][:100])
        for n, m in sorted(count.items(), key=lambda x: -x[0] * x[1])[:12]:
            mix = " ".join(f"{o}:{v}" for o, v in ops[n].most_common(8))
            print(f"  count {n:9d}: {m:5d} instructions, {n * m / total * 100:5.1f}%; {mix}")


if __name__ == "__main__":
    main(sys.argv[1])
