import cupy as cp, numpy as np, subprocess
m = cp.RawModule(path="mufu.cubin")
out = cp.empty(132 * 8 * 1024, cp.float32)
ev = [cp.cuda.Event() for _ in range(2)]
for name in ("f32_ex2", "h2_ex2", "b2_ex2", "f32_tanh", "h2_tanh", "b2_tanh"):
    k = m.get_function(name)
    for _ in range(2): k((132 * 8,), (1024,), (out, np.float32(1.0)))
    ev[0].record(); k((132 * 8,), (1024,), (out, np.float32(1.0))); ev[1].record(); ev[1].synchronize()
    ms = cp.cuda.get_elapsed_time(*ev)
    elems = 132 * 8 * 1024 * 2048 * 8
    print(f"{name:9s} {ms:8.3f} ms  {elems / ms / 1e6 / 132 / 1.98e3:6.2f} elements/clk/SM (at 1.98 GHz)")
acc = m.get_function("acc")
rng = np.random.default_rng(0)
for op, name, lo, hi, ref in ((0, "ex2 f32", -20, 0, np.exp2), (2, "ex2 f16x2", -20, 0, np.exp2), (3, "ex2 bf16x2", -20, 0, np.exp2),
                              (1, "tanh f32", -6, 6, np.tanh), (4, "tanh f16x2", -6, 6, np.tanh), (5, "tanh bf16x2", -6, 6, np.tanh)):
    x = rng.uniform(lo, hi, 1 << 20).astype(np.float32)
    y = cp.empty_like(cp.asarray(x)); acc(((1 << 19) // 256,), (256,), (cp.asarray(x), y, np.int32(1 << 20), np.int32(op)))
    r = ref(x.astype(np.float64)); e = np.abs(cp.asnumpy(y) - r)
    print(f"{name:12s} max abs err {e.max():.2e}  max rel err {(e / np.maximum(np.abs(r), 1e-30)).max():.2e} (on [{lo},{hi}], f32 input)")
print(subprocess.run("cuobjdump -sass mufu.cubin | awk '/Function/{f=$3} /MUFU|HADD2|HMUL2|PRMT|F2FP/{match($0,/(MUFU|HADD2|HMUL2|PRMT|F2FP)[.A-Z0-9_]*/); c[f \" \" substr($0,RSTART,RLENGTH)]++} END{for(k in c) print c[k], k}' | sort -k2", shell=True, capture_output=True, text=True).stdout)
