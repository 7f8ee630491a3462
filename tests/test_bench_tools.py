"""CPU: the bench's report tools work on a grid JSON (synthetic numbers here; the real ones
come from the H200 run under bench/results/)."""

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def grid_json(tmp_path):
    rows = []
    speed = {"cuflash": 300, "cuflash deterministic": 220, "cuflash-fa1": 120, "naive": 15,
             "torch-flash": 320, "torch-cudnn": 600}
    for which, dt, d, causal, n in itertools.product(("fwd", "bwd"), ("bf16",), (64, 128),
                                                     (False, True), (512, 1024, 2048)):
        for p, tf in speed.items():
            if which == "bwd" and p in ("cuflash-fa1", "naive"):
                continue
            flops = 4 * (16384 // n) * (2048 // d) * n * n * d / (2 if causal else 1)
            tf_here = tf * (0.85 if causal else 1)
            row = dict(provider=p, dtype=dt, headdim=d, causal=causal, seqlen=n, which=which,
                       tflops=tf_here, ms=flops / tf_here / 1e9)
            if which == "fwd":
                row["extra_bytes"] = (n * n * 64 if p == "naive" else n * 4096)
            rows.append(row)
    meta = {"device": "test GPU", "date": "2026-11-29", "command": "python bench/bench.py --grid",
            "gemm_ceiling_tflops": {"bf16": 700.0}}
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    return path


def test_claims_report_covers_every_claim(grid_json, tmp_path):
    claims = _load("claims")
    text = claims.report(json.loads(grid_json.read_text()))
    for needle in ("about 2x faster than FlashAttention-1", "5-9x faster than standard",
                   "1.7-1.8x faster than non-causal (fwd)", "1.7-1.8x faster than non-causal (bwd)",
                   "10-20x memory", "theoretical peak (fwd)", "Why the numbers"):
        assert needle in text
    assert "2.50x" in text  # 300 / 120 TFLOP/s, FA2 over FA1


def test_plot_writes_a_png(grid_json, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed (plots are optional)")
    plot = _load("plot")
    out = tmp_path / "grid.png"
    assert plot.main([str(grid_json), "--dtype", "bf16", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_has_every_point(grid_json):
    claims = _load("claims")
    text = claims.table(json.loads(grid_json.read_text()), "bf16")
    assert text.count("\n| fwd |") == 12 and text.count("\n| bwd |") == 12
    assert "0.94x" in text  # 300 / 320


def test_parity_report_lists_ratios_and_points_below_target(grid_json, tmp_path):
    parity = _load("parity")
    out = tmp_path / "parity.md"
    assert parity.main([str(grid_json), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.count("\n| fwd | bf16 |") == 12 + 2 and text.count("\n| bwd | bf16 |") == 12 + 2
    assert "**0.94x**" in text            # 300 / 320: below the 1.0x target of d 64 and 128
    assert "1.36x" in text                # deterministic 220 vs default 300 TFLOP/s: time ratio
    assert "deterministic 1.36x the default's time" in text
    assert "- none" not in text


def test_config_from_shape_reads_the_bench_notation():
    from cuflash import _plan
    fwd = _plan.config_from_shape("fwd", 96, "128x64x4x2")
    assert fwd == _plan.ForwardConfig(96, 128, 64, 4, 2)
    assert _plan.config_from_shape("fwd", 128, "64x128x4").kv_stages == 1
    bwd = _plan.config_from_shape("bwd", 128, "64x128x8x2x4x2x2", bulk=True)
    assert bwd == _plan.BackwardConfig(128, 64, 128, 8, 2, 4, 2, 2, dq_bulk=2)
    assert _plan.config_from_shape("bwd", 128, "64x128x8x2x4x2x2").dq_bulk == 0
    assert _plan.config_from_shape("bwd", 64, "128x128x8x2x4x4x2x1", bulk=True).dq_bulk == 1
    # the Hopper forward: hBcxStages, o = the overlap; the head dim padded to 64s
    assert _plan.config_from_shape("fwd", 96, "h176x2") == _plan.Sm90ForwardConfig(128, 176, 2)
    assert _plan.config_from_shape("fwd", 96, "h176x2p").pingpong
    assert _plan.config_from_shape("fwd", 64, "h128x3o").overlap
    assert _plan.config_from_shape("fwd", 256, "h64x2") == _plan.Sm90ForwardConfig(256, 64, 2)
    # l: lazy rescaling, eN: exponentials on the FMA pipe, c3: three consumer warpgroups
    three = _plan.config_from_shape("fwd", 64, "h128x4ple3c3")
    assert three == _plan.Sm90ForwardConfig(64, 128, 4, pingpong=True, lazy=True, poly=3,
                                            consumers=3)
    assert (three.B_r, three.threads) == (192, 512)
    assert three.smem_bytes == 1024 + 2 * 192 * 64 + 2 * 4 * 2 * 128 * 64 + 8 * (2 * 3 + 4 * 4) \
        + 4 * (16 + 2 * 8)  # (the mbarriers: Q_i per consumer, K/V slots; the packed tile ring)
    assert three.tile_type.endswith(", true, true, 3, 3, true>")
    # t: ping-pong's turns start afresh per tile (no hand-over across tiles)
    per_tile = _plan.config_from_shape("fwd", 256, "h64x2pt")
    assert per_tile == _plan.Sm90ForwardConfig(256, 64, 2, pingpong=True, handover=False)
    assert per_tile.tile_type.endswith(", 0, 2, false>")
    # bench rows are named by the tile: every option in the name (one row per tile)
    shapes = ("h128x4p", "h128x4pt", "h128x4pl", "h128x4plt", "h128x4pc3", "h128x4o",
              "h128x4", "h128x4pe2", "h128x3p", "h96x4p")
    labels = {_load("bench").forward_label(_plan.config_from_shape("fwd", 64, s)) for s in shapes}
    assert len(labels) == len(shapes), labels
    for bad in ("h128x3q", "h128x3pc4"):
        with pytest.raises(ValueError, match="hBcxStages"):
            _plan.config_from_shape("fwd", 64, bad)


@pytest.mark.parametrize("cmd", [
    [str(BENCH / "bench.py")],
    ["-m", "cuflash.demo"],
    ["-c", "import cuflash; cuflash.precompile()"],
    [str(BENCH / "sm90_check.py")],
    [str(BENCH / "window_bench.py")],
    [str(BENCH / "score_hook_bench.py")],
    [str(BENCH / "varlen_bench.py")],
    [str(BENCH / "decode_bench.py")],
    [str(BENCH / "jax_bench.py")],
    [str(BENCH / "ring_bench.py")],
    [str(BENCH.parent / "examples" / "ring_attention.py")],
    [str(BENCH / "tree_ab.py"), "--others", f"other={BENCH.parent}"],
    [str(BENCH / "power_probe.py"), "--points", "fwd bf16 128 2048"],
    [str(BENCH / "kernel_trace.py"), "--points", "fwd bf16 128 2048"],
], ids=["bench", "demo", "precompile", "sm90_check", "window_bench", "score_hook_bench",
        "varlen_bench", "decode_bench", "jax_bench", "ring_bench", "ring_example", "tree_ab",
        "power_probe", "kernel_trace"])
def test_no_gpu_is_said_plainly(cmd):
    """With no GPU visible (CUDA_VISIBLE_DEVICES empty), the bench, the demo and precompile()
    say "no CUDA GPU" instead of failing with a CUDA driver traceback."""
    import os
    import subprocess
    pytest.importorskip("cupy", reason="CuPy not installed: nothing to detect the GPU with")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env=env,
                         cwd=BENCH.parent, timeout=120)
    assert res.returncode != 0
    text = res.stdout + res.stderr
    assert "no CUDA GPU" in text, text[-2000:]
    assert "Traceback" not in text or "RuntimeError: no CUDA GPU" in text, text[-2000:]


def test_power_probe_reads_nvidia_smi_samples(tmp_path):
    """bench/power_probe.py: the sampler's CSV lines (timestamp, SM MHz, W, C) as numbers, the
    timestamp's fraction of a second kept; lines it cannot read (a driver's "[N/A]") left out."""
    import time

    probe = _load("power_probe")
    f = tmp_path / "s.csv"
    f.write_text("2026/12/03 21:58:01.250, 1710, 693.12, 63\n"
                 "2026/12/03 21:58:01.300, [N/A], 690.00, 63\n"
                 "2026/12/03 21:58:02.000, 1695, 691.50, 64\n")
    got = probe._read_samples(str(f))
    base = time.mktime(time.strptime("2026/12/03 21:58:01", "%Y/%m/%d %H:%M:%S"))
    assert [round(t - base, 3) for t, *_ in got] == [0.25, 1.0]
    assert [x[1:] for x in got] == [(1710.0, 693.12, 63.0), (1695.0, 691.5, 64.0)]


def test_varlen_bench_draws_a_mix_that_totals_the_tokens():
    """The variable-length bench's lengths: 64..8192 (the last one cut to fit), summing to the
    token count, and its FLOP count per sequence (4 n^2 d per head, half of it causal)."""
    vb = _load("varlen_bench")
    lengths = vb.draw_lengths(65536)
    assert sum(lengths) == 65536 and max(lengths) <= 8192
    assert all(n >= 64 for n in lengths[:-1]) and lengths[-1] >= 1
    assert len(set(lengths)) > len(lengths) // 2  # a mix, not one length
    assert vb.draw_lengths(65536) == lengths  # seeded
    assert vb.attention_flops([10, 20], 2, 8, False) == 4 * (100 + 400) * 8 * 2
    assert vb.attention_flops([10], 1, 8, True) == 4 * 100 * 8 / 2


def test_paired_median_ms_times_the_fns_in_turns(monkeypatch):
    """bench.paired_median_ms: each fn's calls between its own pair of events, the fns in
    turns (warm-up and timed calls), the L2 flushed before every call, behind one spin; the
    median per fn. median_ms is its one-fn case."""
    import types

    bench = _load("bench")
    log, clock = [], [0.0]

    class Event:
        def __init__(self):
            self.t = None
            self.done = False  # (queued behind the spin: not started when the last is queued)

        def record(self):
            self.t = clock[0]
            log.append("event")

    def elapsed(a, b):
        return b.t - a.t
    flush = types.SimpleNamespace(fill=lambda v: log.append("flush"))
    stream = types.SimpleNamespace(synchronize=lambda: None)
    cp = types.SimpleNamespace(
        uint8="u8", empty=lambda n, dtype: flush,
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=99), Event=Event,
                                   get_current_stream=lambda: stream,
                                   get_elapsed_time=elapsed))
    monkeypatch.setattr(bench, "_spin", lambda cp, ms: log.append("spin"))
    monkeypatch.setattr(bench, "_WARM_MS", 0.0)
    monkeypatch.setattr(bench, "_flush_buffers", {})

    def fn(label, ms):
        def f():
            log.append(label)
            clock[0] += ms
        return f
    got = bench.paired_median_ms(cp, {"a": fn("a", 2.0), "b": fn("b", 5.0)}, 2, 3)
    assert got == {"a": 2.0, "b": 5.0}
    calls = [x for x in log if x in ("a", "b")]
    assert calls == ["a", "b"] * 5  # (2 warm-up rounds, 3 timed)
    timed = log[log.index("spin") + 1:]
    assert timed == ["flush", "event", "a", "event", "flush", "event", "b", "event"] * 3
    log.clear()
    assert bench.median_ms(cp, fn("a", 4.0), 1, 5) == 4.0
    assert [x for x in log if x == "a"] == ["a"] * 6


def _stub_point_and_cp():
    """For bench.run_point's tests: a point whose providers "a", "b" and "naive" return calls
    labelled with their names and "c" one that fails, and a stand-in cupy with a memory pool."""
    import types

    def fn(label, fails=False):
        def f():
            if fails:
                raise RuntimeError("no kernel for this shape")
        f.label = label
        return f

    class Point:
        dtype_name, b, h, h_k, n, d, causal, which, flops = "bf16", 1, 1, 1, 8, 8, False, \
            "fwd", 2e9

        def callables(self, provider, cfg):
            return {"a": {"a": fn("a")}, "b": {"b": fn("b")}, "naive": {"naive": fn("naive")},
                    "c": {"c": fn("c", fails=True)}}[provider]
    cp = types.SimpleNamespace(get_default_memory_pool=lambda: types.SimpleNamespace(
        free_all_blocks=lambda: None))
    return Point(), cp


def test_run_point_rounds_alternates_providers_and_takes_the_median(monkeypatch):
    """bench.run_point with rounds > 1: every provider timed once per round, in turn, the
    order reversed every other round; ms is the median of its rounds; a provider that fails
    to run reports its error and no time."""
    bench = _load("bench")  # (a plain `import bench` finds the bench/ folder when run alone)
    calls, times = [], {"a": [3.0, 1.0, 2.0], "b": [5.0, 4.0, 6.0]}

    def median_ms(cp, fn, warmup, reps):
        calls.append(fn.label)
        return times[fn.label][sum(1 for c in calls if c == fn.label) - 1]
    monkeypatch.setattr(bench, "median_ms", median_ms)
    monkeypatch.setattr(bench, "host_us", lambda cp, fn, reps: 1.0)
    point, cp = _stub_point_and_cp()
    rows = bench.run_point(cp, point, ["a", "c", "b"], 20, 3, log=lambda r: None, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    by = {r["provider"]: r for r in rows}
    assert by["a"]["ms"] == 2.0 and by["a"]["ms_rounds"] == [3.0, 1.0, 2.0]
    assert by["b"]["ms"] == 5.0 and by["b"]["tflops"] == 2e9 / 5.0 / 1e9
    assert by["c"]["ms"] is None and "no kernel" in by["c"]["error"]


def test_run_point_rounds_paired_times_the_providers_call_by_call(monkeypatch):
    """bench.run_point with rounds > 1 and paired: in each round the providers that ran go to
    one paired_median_ms, in turn order (reversed every other round); a slow provider (the
    naive attention) keeps its own median_ms; a round whose paired timing fails times the
    providers one by one."""
    bench = _load("bench")
    paired_calls, single_calls = [], []

    def paired_median_ms(cp, fns, warmup, reps):
        labels = [fn.label for fn in fns.values()]
        paired_calls.append(labels)
        if len(paired_calls) == 2:
            raise RuntimeError("out of memory")
        return {k: {"a": 2.0, "b": 4.0}[fn.label] for k, fn in fns.items()}

    def median_ms(cp, fn, warmup, reps):
        single_calls.append(fn.label)
        return {"a": 3.0, "b": 5.0, "naive": 9.0}[fn.label]
    monkeypatch.setattr(bench, "paired_median_ms", paired_median_ms)
    monkeypatch.setattr(bench, "median_ms", median_ms)
    monkeypatch.setattr(bench, "host_us", lambda cp, fn, reps: 1.0)
    point, cp = _stub_point_and_cp()
    rows = bench.run_point(cp, point, ["a", "c", "naive", "b"], 20, 3, log=lambda r: None,
                           rounds=3, paired=True)
    assert paired_calls == [["a", "b"], ["b", "a"], ["a", "b"]]
    # naive on its own every round; round 2's pair failed, so a and b alone in its order
    assert single_calls == ["naive", "b", "naive", "a", "naive"]
    by = {r["provider"]: r for r in rows}
    assert by["a"]["ms_rounds"] == [2.0, 3.0, 2.0] and by["a"]["ms"] == 2.0
    assert by["b"]["ms_rounds"] == [4.0, 5.0, 4.0] and by["b"]["ms"] == 4.0
    assert by["naive"]["ms_rounds"] == [9.0] * 3
    assert by["c"]["ms"] is None and "no kernel" in by["c"]["error"]


def test_point_from_spec_reads_the_probes_notation():
    """bench.Point.from_spec: "PASS DTYPE HEADDIM SEQLEN [c]" on the standard grid (16k tokens,
    heads x d = 2048), as power_probe.py and kernel_trace.py take their points."""
    bench = _load("bench")
    p = bench.Point.from_spec(None, "bwd fp16 64 4096 c")
    assert (p.which, p.dtype_name, p.b, p.h, p.h_k, p.n, p.d, p.causal) == \
        ("bwd", "fp16", 4, 32, 32, 4096, 64, True)
    assert p.flops == 2.5 * 4 * 4 * 32 * 4096 * 4096 * 64 / 2
    q = bench.Point.from_spec(None, "fwd bf16 128 2048")
    assert (q.which, q.b, q.h, q.causal, q.flops) == ("fwd", 8, 16, False,
                                                      4 * 8 * 16 * 2048 * 2048 * 128)


def test_shards_split_the_suite_into_disjoint_parts_that_cover_it():
    """pytest --shard K/N (tests/conftest.py): the N parts share no test and together are the
    whole collection; a malformed spec is a usage error. The rule on a list, and once through
    pytest (the option is wired): on the GPU machine, under the suite's load, each pytest
    subprocess took ~20 s."""
    import importlib.util
    import subprocess

    import pytest

    root = BENCH.parent
    spec = importlib.util.spec_from_file_location("_conftest", root / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    items = list(range(10))
    parts = [conftest._shard(items, f"{k}/3") for k in (1, 2, 3)]
    assert [kept for kept, _ in parts] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert all(sorted(kept + dropped) == items for kept, dropped in parts)
    for bad in ("4/3", "0/3", "half"):
        with pytest.raises(pytest.UsageError):
            conftest._shard(items, bad)

    def collect(*extra):
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                              "-p", "no:cacheprovider", "tests/test_launch.py", *extra],
                             cwd=root, capture_output=True, text=True)
        return out.returncode, [line for line in out.stdout.splitlines() if "::" in line]
    rc, whole = collect()
    assert rc == 0 and len(whole) >= 3
    assert collect("--shard", "2/3") == (0, whole[1::3])


def test_tree_ab_loads_another_tree_beside_the_package(tmp_path):
    """bench/tree_ab.py: another copy of the package (cuflash/ and kernels/ in a folder, as
    `git archive REV cuflash kernels` makes it) imports under a name of its own beside the
    working tree's, and reads its own kernels; --others is checked before anything runs."""
    import shutil

    import cuflash
    tree_ab = _load("tree_ab")
    root = BENCH.parent
    for part in ("cuflash", "kernels"):
        shutil.copytree(root / part, tmp_path / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    assert tree_ab.parse_others(f"old={tmp_path}") == {"old": tmp_path}
    other = tree_ab.load_tree(tmp_path, "cuflash_tree_ab_test")
    try:
        assert Path(other.__file__).resolve() == (tmp_path / "cuflash" / "__init__.py").resolve()
        assert Path(other._loader.KERNEL_DIR).resolve() == (tmp_path / "kernels").resolve()
        assert Path(cuflash._loader.KERNEL_DIR).resolve() != (tmp_path / "kernels").resolve()
        assert other.forward is not cuflash.forward
    finally:
        for name in [m for m in sys.modules if m.startswith("cuflash_tree_ab_test")]:
            del sys.modules[name]
    for bad in ("old", f"new={tmp_path}", f"cudnn={tmp_path}", f"a b={tmp_path}",
                f"x={tmp_path / 'missing'}", f"x={tmp_path},x={tmp_path}"):
        with pytest.raises(ValueError, match="--others"):
            tree_ab.parse_others(bad)
