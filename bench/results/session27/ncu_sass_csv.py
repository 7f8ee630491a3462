"""Per-kernel totals of an ncu SASS export (ncu -i REP --page source --print-source sass --csv,
gzipped): executed instructions and stall samples by opcode.

    python ncu_sass_csv.py call2/sass_d64_n512_c1.csv.gz
"""
import collections
import csv
import gzip
import sys


def load(path):
    """[{'name', 'rows': [{column: value}]}] per kernel of the export."""
    kernels, cur, hdr = [], None, None
    with gzip.open(path, "rt") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                cur, hdr = {"name": row[1], "rows": []}, None
                kernels.append(cur)
            elif row[0] == "Address":
                hdr = row
            elif hdr:
                cur["rows"].append(dict(zip(hdr, row)))
    return kernels


def opcode(source):
    tokens = source.split()
    if not tokens:
        return ""
    return (tokens[1] if tokens[0].startswith("@") else tokens[0]).split(".")[0]


def main(path):
    for k in load(path):
        executed, stalls = collections.Counter(), collections.Counter()
        for r in k["rows"]:
            op = opcode(r["Source"])
            executed[op] += int(r["Instructions Executed"] or 0)
            stalls[op] += int(r["Warp Stall Sampling (All Samples)"] or 0)
        print("==", k["name"][:150])
        print("instructions", sum(executed.values()), "stall samples", sum(stalls.values()))
        print(" ".join(f"{o}:{n / 1e3:.0f}k" for o, n in executed.most_common(30)))
        print("stalls by opcode", " ".join(f"{o}:{n}" for o, n in stalls.most_common(20)))


if __name__ == "__main__":
    main(sys.argv[1])
