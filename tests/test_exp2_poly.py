"""CPU: exp2_poly (kernels/common.cuh), the FMA-pipe 2^x that the Hopper forward's softmax can
use for part of its exponentials, emulated step for step in float32 with the constants read
from the header: relative error within the documented 7.7e-5 over a softmax's range, exact 0
for masked scores (-inf) and below 2^-125, NaN kept (the GPU's own NaN, 0x7fffffff, too)."""

import re
from pathlib import Path

import numpy as np

HEADER = Path(__file__).resolve().parent.parent / "kernels" / "common.cuh"


def _exp2_poly(x: np.ndarray) -> np.ndarray:
    body = HEADER.read_text().split("float exp2_poly(float x) {", 1)[1].split("\n}", 1)[0]
    magic = np.float32(float(re.search(r"x \+ ([\d.]+)f;", body)[1]))
    c3, c2, c1, c0 = (np.float32(float(c)) for c in re.findall(r"(0\.\d+)f", body))
    cutoff = np.float32(float(re.search(r"x < (-[\d.]+)f", body)[1]))
    x = x.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        t = x + magic
        f = x - (t - magic)
        p = ((c3 * f + c2) * f + c1) * f + c0  # (fmaf rounds once; the bound has room)
        bits = ((t.view(np.uint32).astype(np.uint64) << 23) + 0x3F800000) & 0xFFFFFFFF
        y = p * bits.astype(np.uint32).view(np.float32)
    return np.where(x < cutoff, np.float32(0), y)


def test_exp2_poly_matches_exp2():
    x = np.concatenate([np.linspace(-125, 0, 2_000_001, dtype=np.float32),
                        np.float32([-0.5, 0.5, -1e-8, 0.0, 1e-3])])
    rel = np.abs(_exp2_poly(x).astype(np.float64) / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() <= 8e-5, rel.max()


def test_exp2_poly_edges():
    gpu_nan = np.uint32([0x7FFFFFFF]).view(np.float32)[0]  # what CUDA arithmetic makes
    y = _exp2_poly(np.float32([-np.inf, -126.0, -200.0, np.nan, gpu_nan]))
    assert y[0] == 0 and y[1] == 0 and y[2] == 0 and np.isnan(y[3]) and np.isnan(y[4])
