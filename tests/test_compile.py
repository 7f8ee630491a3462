"""CPU: every kernel specialisation compiles with no register spills for the architecture
class it is planned for (sm_80 / sm_90 / sm_90a, _plan.ARCH_SMEM), the Hopper kernels on wgmma, the
loader inlines headers so that the cache key follows them, and compile errors name the file
and line. Uses the machine's nvcc (no GPU needed)."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from cuflash import _loader, _plan, _registry, compile_check

NVCC = compile_check.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (set CUDACXX or PATH)")


@pytest.fixture(scope="module")
def reports():
    # Cached by the expanded sources, the specialisation list, the flags and nvcc's version:
    # an unchanged tree compiles once (compile_check.check_all_cached).
    return compile_check.check_all_cached(compile_check.ARCHS, NVCC)[0]


@needs_nvcc
def test_every_specialisation_compiles_without_spills(reports):
    assert len(reports) == sum(len(_plan.all_specialisations(a)) for a in compile_check.ARCHS)
    spills = [r for r in reports if r.spill_stores or r.spill_loads or r.stack]
    assert not spills, "register spills / stack use:\n" + "\n".join(map(str, spills))
    serialized = [r for r in reports if r.wgmma_serialized]
    assert not serialized, "wgmma serialized (ptxas C75xx: registers, dependences):\n" + \
        "\n".join(map(str, serialized))
    assert all(r.registers <= 255 for r in reports)


@needs_nvcc
def test_static_and_dynamic_shared_memory_fit_every_planned_launch(reports):
    """Each kernel's static shared memory (ptxas) fits beside the dynamic shared memory its
    plans launch it with, on every device limit planned for (a static __shared__ variable in a
    kernel with a 1024-aligned dynamic layout is padded to 1024 bytes; the Hopper backward's
    d 128 3-slot tile had 456 bytes to spare and failed to launch)."""
    for arch in compile_check.ARCHS:
        room = _registry.static_smem_room(arch)
        traced = {r.expression for r in reports if r.arch == arch}
        assert set(room) <= traced, "planned kernels missing from the report"
    over = compile_check.static_smem_overflows(reports)
    assert not over, "static + dynamic shared memory over the limit:\n" + \
        "\n".join(f"{r.expression}: {r.smem_static} static bytes, room {room}" for r, room in over)


def test_static_smem_overflow_is_flagged_against_the_planned_dynamic_size():
    cfg = _plan.Sm90BackwardConfig(128, 3)
    name = _plan.sm90_backward_names("bfloat16", cfg, False, ordered=True)["main"]
    room = _registry.static_smem_room("90a")[name]
    assert room == 227 * 1024 - cfg.smem_bytes
    fits, over = (compile_check.KernelReport("90a", "k", 168, static, 0, 0, 0, expression=name)
                  for static in (room, room + 1))
    assert compile_check.static_smem_overflows([fits, over]) == [(over, room)]


@needs_nvcc
def test_specialisations_cover_every_bucket_dtype_and_mask(reports):
    names = {n for _, n in _plan.all_specialisations()}
    for dtype in _plan.ELEMENT_TAGS:
        for HD in _plan.HEAD_DIM_BUCKETS:
            for causal in (False, True):
                name = _plan.forward_kernel_name(dtype, _plan.forward_config(HD, causal), causal)
                assert name in names


def _write_kernels(tmp_path, header_body):
    (tmp_path / "common.cuh").write_text("#pragma once\n" + header_body)
    (tmp_path / "k.cu").write_text('#include "common.cuh"\n'
                                   "__global__ void k(float* x) { x[0] = helper(); }\n")
    return tmp_path


def test_expand_source_inlines_headers_with_line_markers(tmp_path):
    _write_kernels(tmp_path, "__device__ float helper() { return 1.f; }\n")
    src = _loader.expand_source("k.cu", tmp_path)
    assert '#line 1 "k.cu"' in src and '#line 1 "common.cuh"' in src
    assert '#line 2 "k.cu"' in src and "helper()" in src and "#include" not in src


def test_digest_changes_when_a_header_changes(tmp_path):
    _write_kernels(tmp_path, "__device__ float helper() { return 1.f; }\n")
    before = _loader.source_digest("k.cu", tmp_path)
    _write_kernels(tmp_path, "__device__ float helper() { return 2.f; }\n")
    assert _loader.source_digest("k.cu", tmp_path) != before


def test_real_kernels_expand():
    src = _loader.expand_source(_plan.FORWARD_FILE)
    assert '#line 1 "common.cuh"' in src and '#line 1 "block_range.cuh"' in src


@needs_nvcc
def test_compile_error_names_file_and_line(tmp_path, monkeypatch):
    # line 3 of the header is broken
    _write_kernels(tmp_path, "__device__ float helper() {\n  return undefined_name;\n}\n")
    monkeypatch.setattr(_loader, "KERNEL_DIR", tmp_path)
    with pytest.raises(RuntimeError) as err:
        compile_check.compile_file("k.cu", [], "80", NVCC)
    assert "common.cuh:3:" in str(err.value) and "undefined_name" in str(err.value)


def test_first_error_location_parses_nvrtc_logs():
    log = ('fa2_forward.cu(123): warning #177-D: unused\n'
           'common.cuh(45): error: identifier "x" is undefined\n')
    assert _loader.first_error_location(log) == ("common.cuh", 45, 'identifier "x" is undefined')


@needs_nvcc
def test_compile_check_cache_key_follows_sources_and_planner(tmp_path, monkeypatch):
    key = compile_check.cache_key(("80",), NVCC)
    assert key == compile_check.cache_key(("80",), NVCC)
    assert key != compile_check.cache_key(("90",), NVCC)
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for src in _loader.KERNEL_DIR.iterdir():
        if src.suffix in (".cu", ".cuh"):
            (kernels / src.name).write_text(src.read_text())
    monkeypatch.setattr(_loader, "KERNEL_DIR", kernels)
    assert compile_check.cache_key(("80",), NVCC) == key
    (kernels / "common.cuh").write_text((kernels / "common.cuh").read_text() + "\n// edit\n")
    assert compile_check.cache_key(("80",), NVCC) != key  # a header edit misses the cache


def test_ptxas_report_flags_serialized_wgmma():
    """ptxas names the function whose wgmma it serialized (C7511/C7512, an "info" line, no
    spill): the report carries it, and only for that function."""
    log = """ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are \
serialized due to insufficient register resources for the function '_Z1av'
ptxas info    : Compiling entry function '_Z1av' for 'sm_90a'
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 16 barriers
ptxas info    : Compiling entry function '_Z1bv' for 'sm_90a'
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers
"""
    a, b = compile_check.parse_ptxas(log)
    assert (a.name, a.wgmma_serialized, a.spill_stores) == ("_Z1av", True, 0)
    assert (b.name, b.wgmma_serialized, b.registers) == ("_Z1bv", False, 168)
    # (C7514, C7520: accumulators read, or a compiler-inserted arrive, where ptxas cannot
    # prove the wgmma retired: serialized too)
    for code, why in (("C7514", "non wgmma instructions reading accumulator registers of  a "
                       "wgmma between start and end of the pipeline stage"),
                      ("C7520", "program dependence on compiler-inserted WG.AR in divergent "
                       "path")):
        line = (f"ptxas info    : ({code}) Potential Performance Loss: wgmma.mma_async "
                f"instructions are serialized due to {why} in the function '_Z1bv'\n")
        a, b = compile_check.parse_ptxas(line + log)
        assert (a.wgmma_serialized, b.wgmma_serialized) == (True, True), code


def test_compile_check_cache_round_trip(tmp_path, monkeypatch):
    """A cached check returns the same reports, spills included, without compiling."""
    fake = [compile_check.KernelReport("80", "k", 255, 0, 8, 8, 8)]
    calls = []
    monkeypatch.setattr(compile_check, "check_all", lambda archs, nvcc: calls.append(1) or fake)
    monkeypatch.setattr(compile_check, "cache_key", lambda archs, nvcc: "key")
    first, cached1 = compile_check.check_all_cached(("80",), "nvcc", str(tmp_path))
    again, cached2 = compile_check.check_all_cached(("80",), "nvcc", str(tmp_path))
    assert (cached1, cached2, len(calls)) == (False, True, 1)
    assert again == fake and again[0].spill_stores == 8


def test_compile_checks_run_at_once_compile_once(tmp_path, monkeypatch):
    """Two checks of one tree at the same time (the suite's compile test and the sdist's own,
    on two workers): the second waits for the first's reports instead of compiling too."""
    fake = [compile_check.KernelReport("90a", "k", 168, 0, 0, 0, 0)]
    calls = []

    def slow_check(archs, nvcc):
        calls.append(1)
        time.sleep(0.5)
        return fake
    monkeypatch.setattr(compile_check, "check_all", slow_check)
    monkeypatch.setattr(compile_check, "cache_key", lambda archs, nvcc: "key")
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda _: compile_check.check_all_cached(("90a",), "nvcc",
                                                                     str(tmp_path)), range(2)))
    assert len(calls) == 1
    assert sorted(cached for _, cached in got) == [False, True]
    assert all(reports == fake for reports, _ in got)


def test_planner_and_tile_traits_are_checked_for_every_tile():
    """The compile check static_asserts, for every planned tile, that the kernel's traits give
    the planner's shared-memory size and register workarounds (one formula each, proven
    equal)."""
    for arch in compile_check.ARCHS:
        for filename in (_plan.FORWARD_FILE, _plan.BACKWARD_FILE, _plan.FA1_FILE):
            conds = _plan.tile_assertions(arch, filename)
            tiles = {c.split("::SMEM_BYTES")[0] for c in conds if "::SMEM_BYTES" in c}
            names = [n for f, n in _plan.all_specialisations(arch) if f == filename]
            for name in names:
                if "Tile<" in name:
                    assert any(t in name for t in tiles), name


def _nvrtc_or_skip():
    if compile_check._load_nvrtc() is None:
        pytest.skip("libnvrtc not found (it comes with cupy-cuda12x[ctk])")


KERNEL_FILES = sorted({f for arch in compile_check.ARCHS
                       for f, _ in _plan.all_specialisations(arch)})


def test_every_kernel_file_is_planned():
    """The NVRTC test below takes its files from the planner: every kernels/*.cu is among
    them (a file the planner never names would escape it, as the Hopper backward once did)."""
    assert KERNEL_FILES == sorted(p.name for p in _loader.KERNEL_DIR.glob("*.cu"))


@pytest.mark.parametrize("filename", KERNEL_FILES)
def test_kernels_compile_under_nvrtc(filename):
    """What CuPy compiles at run time compiles: NVRTC (no GPU needed for PTX) takes, per
    architecture class that launches the file, a few specialisations in which every kernel
    meets every value of each template argument (nvcc alone missed a construct NVRTC refuses:
    INFINITY, which NVRTC does not define, in the score hook's path of the Hopper backward)."""
    _nvrtc_or_skip()
    classes = 0
    for arch in compile_check.ARCHS:
        names = [n for f, n in _plan.all_specialisations(arch) if f == filename]
        if names:
            compile_check.nvrtc_compile(filename, compile_check.covering_specialisations(names),
                                        arch)
            classes += 1
    assert classes


def test_covering_specialisations_meet_every_template_argument():
    names = ["k<A, T<1, 2>>", "k<A, T<1, 3>>", "k<B, T<1, 3>>", "k<B, T<1, 2>>", "j<A>"]
    chosen = compile_check.covering_specialisations(names)
    assert chosen == ["k<A, T<1, 2>>", "k<B, T<1, 3>>", "j<A>"]
    assert compile_check._template_leaves("k<B, T<1, U<x>>>") == [
        ("0", "B"), ("1.0", "1"), ("1.1.0", "x")]


def test_nvrtc_check_reports_errors(tmp_path, monkeypatch):
    _nvrtc_or_skip()
    (tmp_path / "common.cuh").write_text("#pragma once\n__device__ float helper() {\n"
                                         "  return undefined_name;\n}\n")
    (tmp_path / "k.cu").write_text('#include "common.cuh"\n'
                                   'extern "C" __global__ void k(float* x) { x[0] = helper(); }\n')
    monkeypatch.setattr(_loader, "KERNEL_DIR", tmp_path)
    with pytest.raises(RuntimeError, match=r"common.cuh:3: .*undefined_name"):
        compile_check.nvrtc_compile("k.cu", [], "80")


def _cuobjdump():
    import os
    import shutil
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found and NVCC:
        beside = os.path.join(os.path.dirname(NVCC), "cuobjdump")
        found = beside if os.path.isfile(beside) else None
    return found


# The Hopper families' main kernels, and the wgmma instructions each issues at least (the
# forward: S and P~V; the backward: S^T, dP^T, dV, dK, dQ).
HOPPER_KERNELS = [(_plan.SM90_FORWARD_FILE, "fa2_forward_sm90<", 2),
                  (_plan.SM90_BACKWARD_FILE, "fa2_backward_sm90<", 5)]


def _hopper_source(tmp_path, filename, kernel):
    names = [n for f, n in _plan.all_specialisations("90a")
             if f == filename and kernel in n and "bf16" in n and "<false>" in n]
    assert names
    src = tmp_path / "k.cu"
    src.write_text(compile_check.instantiation_source(filename, names))
    return src, names


def _nvcc(*args):
    import subprocess
    subprocess.run([NVCC, *args, _plan.SM90A_NVCC_ARCH, *_loader.NVRTC_OPTIONS], check=True,
                   capture_output=True)


@needs_nvcc
@pytest.mark.parametrize("filename,kernel,products", HOPPER_KERNELS, ids=["forward", "backward"])
def test_hopper_kernels_use_wgmma_and_tma(tmp_path, filename, kernel, products):
    """The Hopper kernels' PTX (the bf16 non-causal specialisations) has their matmuls on
    wgmma.mma_async, their loads on cp.async.bulk.tensor, and no mma.sync."""
    import re
    src, names = _hopper_source(tmp_path, filename, kernel)
    _nvcc("-ptx", "-o", str(tmp_path / "k.ptx"), str(src))
    text = (tmp_path / "k.ptx").read_text()
    assert len(re.findall(r"\.visible \.entry \w+\(", text)) == len(names)  # (definitions)
    assert text.count("wgmma.mma_async") >= products * len(names)
    assert "cp.async.bulk.tensor.4d" in text and "mma.sync" not in text


@needs_nvcc
@pytest.mark.parametrize("filename,kernel,products", HOPPER_KERNELS, ids=["forward", "backward"])
def test_hopper_sass_is_hgmma(tmp_path, filename, kernel, products):
    """Where a cuobjdump is found (PATH, beside nvcc, or $CUOBJDUMP): the SASS of the Hopper
    kernels has HGMMA and no HMMA (mma.sync) at all."""
    import subprocess
    cuobjdump = _cuobjdump()
    if cuobjdump is None:
        pytest.skip("no cuobjdump here (PATH, beside nvcc, $CUOBJDUMP): SASS not read")
    src, names = _hopper_source(tmp_path, filename, kernel)
    _nvcc("-cubin", "-o", str(tmp_path / "k.cubin"), str(src))
    sass = subprocess.run([cuobjdump, "-sass", str(tmp_path / "k.cubin")], check=True,
                          capture_output=True, text=True).stdout
    assert sass.count("HGMMA") >= products * len(names) and " HMMA" not in sass
