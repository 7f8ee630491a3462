"""Session 11 microbenchmark (throw-away, kept with its log): the packed special-function forms
on sm_90a. Run on the H200 beside mufu.cubin (nvcc -cubin -arch=sm_90a -O3 mufu.cu)."""
import subprocess

import cupy as cp
import numpy as np

m = cp.RawModule(path="mufu.cubin")
out = cp.empty(132 * 8 * 1024, cp.float32)
ev = [cp.cuda.Event() for _ in range(2)]
grid, block, args = (132 * 8,), (1024,), (out, np.float32(1.0))
for name in ("f32_ex2", "h2_ex2", "b2_ex2", "f32_tanh", "h2_tanh", "b2_tanh"):
    k = m.get_function(name)
    for _ in range(2):
        k(grid, block, args)
    ev[0].record()
    k(grid, block, args)
    ev[1].record()
    ev[1].synchronize()
    ms = cp.cuda.get_elapsed_time(*ev)
    elems = 132 * 8 * 1024 * 2048 * 8
    print(f"{name:9s} {ms:8.3f} ms  {elems / ms / 1e6 / 132 / 1.98e3:6.2f} elements/clk/SM "
          "(at 1.98 GHz)")
acc = m.get_function("acc")
rng = np.random.default_rng(0)
cases = ((0, "ex2 f32", -20, 0, np.exp2), (2, "ex2 f16x2", -20, 0, np.exp2),
         (3, "ex2 bf16x2", -20, 0, np.exp2), (1, "tanh f32", -6, 6, np.tanh),
         (4, "tanh f16x2", -6, 6, np.tanh), (5, "tanh bf16x2", -6, 6, np.tanh))
for op, name, lo, hi, ref in cases:
    x = rng.uniform(lo, hi, 1 << 20).astype(np.float32)
    y = cp.empty(x.shape, cp.float32)
    acc(((1 << 19) // 256,), (256,), (cp.asarray(x), y, np.int32(1 << 20), np.int32(op)))
    r = ref(x.astype(np.float64))
    e = np.abs(cp.asnumpy(y) - r)
    rel = (e / np.maximum(np.abs(r), 1e-30)).max()
    print(f"{name:12s} max abs err {e.max():.2e}  max rel err {rel:.2e} "
          f"(on [{lo},{hi}], f32 input)")
# SASS: per kernel, how many of each special-function (and packing) instruction
awk = ("/Function/{f=$3} /MUFU|HADD2|HMUL2|PRMT|F2FP/{match($0,/(MUFU|HADD2|HMUL2|PRMT|F2FP)"
       "[.A-Z0-9_]*/); c[f \" \" substr($0,RSTART,RLENGTH)]++} END{for(k in c) print c[k], k}")
print(subprocess.run(f"cuobjdump -sass mufu.cubin | awk '{awk}' | sort -k2", shell=True,
                     capture_output=True, text=True).stdout)
