"""Compile every kernel specialisation with the machine's ``nvcc`` (no GPU needed) and report
registers, shared memory and spills per kernel and architecture.

    python -m cuflash.compile_check            # sm_80 and sm_90, table on stdout
    python -m cuflash.compile_check --arch 90  # one architecture
    python -m cuflash.compile_check --no-cache # compile even if this exact tree was checked
    python -m cuflash.compile_check --write-params  # regenerate kernels/params.cuh

The CPU test suite runs the same check and fails on any compile error or register spill.
The source compiled is exactly what NVRTC compiles at run time (``_loader.expand_source``),
plus one line per specialisation that takes the kernel's address to instantiate it.

The reports of a successful check are cached (``$CUFLASH_CACHE_DIR``, default
``~/.cache/cuflash/compile_check``) under a key made of the expanded kernel sources, the list
of specialisations, the compile flags and the compiler's version: an unchanged tree compiles
once; any change to a kernel, a header, the planner's tile choices or nvcc compiles again.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import _loader, _params, _plan, _wgmma

ARCHS = ("80", "90", "90a")


def find_nvcc() -> str | None:
    for candidate in (os.environ.get("CUDACXX"), shutil.which("nvcc"),
                      "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class KernelReport:
    arch: str
    name: str           # mangled name as ptxas prints it
    registers: int
    smem_static: int
    stack: int
    spill_stores: int
    spill_loads: int
    # ptxas C7511/C7512: the wgmma instructions were serialized (each waits for the one before),
    # for want of registers: no spill, but the tile's matmuls lose their pipelining
    wgmma_serialized: bool = False
    expression: str = ""  # the planner's name expression that instantiated it


def instantiation_source(filename: str, names: list[str], asserts: list[str] = ()) -> str:
    """The kernel file as NVRTC compiles it, plus one line per specialisation that takes its
    address (instantiating it) and one static_assert per planner/traits agreement check."""
    lines = [_loader.expand_source(filename), '#line 1 "compile_check_instantiations"']
    for i, name in enumerate(names):
        lines.append(f"__device__ void* cuflash_instantiate_{i} = (void*)&{name};")
    for cond in asserts:
        lines.append(f'static_assert({cond}, "the planner (cuflash/_plan.py) and the tile '
                     f'traits disagree: {cond}");')
    return "\n".join(lines) + "\n"


_FUNC = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\w+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers.*?(?:, (\d+) bytes smem)?")
_INSTANTIATED = re.compile(r"cuflash_instantiate_(\d+) = (?:generic\()?([\w$]+)")
_SERIALIZED = re.compile(r"\(C75\d\d\) Potential Performance Loss: wgmma\.mma_async instructions "
                         r"are serialized.*?function '(?P<name>[^']+)'")


def parse_ptxas(log: str) -> list[KernelReport]:
    reports, current, stack = [], None, (0, 0, 0)
    for line in log.splitlines():
        if m := _FUNC.search(line):
            current = (m.group("arch").removeprefix("sm_"), m.group("name"))
        elif (m := _STACK.search(line)) and current:
            stack = tuple(int(x) for x in m.groups())
        elif (m := _USED.search(line)) and current:
            smem = re.search(r"(\d+) bytes smem", line)
            reports.append(KernelReport(current[0], current[1], int(m.group(1)),
                                        int(smem.group(1)) if smem else 0, *stack))
            current, stack = None, (0, 0, 0)
    serialized = {m.group("name") for m in _SERIALIZED.finditer(log)}
    for r in reports:
        r.wgmma_serialized = r.name in serialized
    return reports


def compile_file(filename: str, names: list[str], arch: str, nvcc: str) -> tuple[str, list]:
    """Compile the specialisations `names` of kernels/`filename` for sm_`arch`.
    Returns (compiler log, reports); raises RuntimeError on a compile error."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "check.cu")
        with open(src, "w") as f:
            f.write(instantiation_source(filename, names, _plan.tile_assertions(arch, filename)))
        target = _plan.SM90A_NVCC_ARCH if arch == "90a" else f"-arch=sm_{arch}"
        # (--keep: the PTX names the kernel each instantiation line took, mangled as ptxas
        # reports it)
        cmd = [nvcc, "-cubin", target, *_loader.NVRTC_OPTIONS, "-Xptxas", "-v", "--keep",
               "--keep-dir", tmp, "-o", os.path.join(tmp, "check.cubin"), src]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            loc = _loader.first_error_location(log)
            where = f"{loc[0]}:{loc[1]}: {loc[2]}" if loc else "compile failed"
            raise RuntimeError(f"nvcc sm_{arch}, kernels/{filename}: {where}\n{log}")
        with open(os.path.join(tmp, "check.ptx")) as f:
            mangled = {m.group(2): names[int(m.group(1))] for m in _INSTANTIATED.finditer(f.read())}
        reports = parse_ptxas(log)
        for r in reports:
            r.expression = mangled.get(r.name, "")
        return log, reports


def _load_nvrtc():
    """libnvrtc through ctypes (the one CuPy's [ctk] extra installs, or the system's), or
    None."""
    import ctypes
    import ctypes.util
    import glob
    candidates = []
    try:
        import nvidia.cuda_nvrtc as pkg  # the pip wheel of NVRTC (cupy-cuda12x[ctk])
        for d in pkg.__path__:
            candidates += sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    try:
        import nvidia.cu13 as pkg13  # (CUDA 13's wheels put every library in one package)
        for d in pkg13.__path__:
            candidates += sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    for path in candidates:
        if "builtins" in path or ".alt." in path:
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def nvrtc_compile(filename: str, names: list[str], arch: str) -> None:
    """Compile the specialisations `names` of kernels/`filename` with NVRTC, as CuPy does at
    run time, to PTX for compute_`arch` (no GPU needed). Raises RuntimeError with the log on
    failure, FileNotFoundError where NVRTC is not installed. nvcc and NVRTC accept slightly
    different C++ (NVRTC has no standard headers, no offsetof): this catches what only NVRTC
    refuses."""
    import ctypes
    lib = _load_nvrtc()
    if lib is None:
        raise FileNotFoundError("libnvrtc not found (pip install 'cupy-cuda12x[ctk]>=14')")
    prog = ctypes.c_void_p()
    src = _loader.expand_source(filename).encode()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, filename.encode(), 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        for name in names:
            lib.nvrtcAddNameExpression(prog, name.encode())
        # (the options CuPy's RawModule adds: -ftz=true, --device-as-default-execution-space)
        opts = [o.encode() for o in (*_loader.NVRTC_OPTIONS, f"--gpu-architecture=compute_{arch}",
                                     "-ftz=true", "--device-as-default-execution-space")]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        status = lib.nvrtcCompileProgram(prog, len(opts), arr)
        if status:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
            loc = _loader.first_error_location(log)
            where = f"{loc[0]}:{loc[1]}: {loc[2]}" if loc else "compile failed"
            raise RuntimeError(f"NVRTC compute_{arch}, kernels/{filename}: {where}\n{log}")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _template_leaves(name: str) -> list[tuple[str, str]]:
    """(position, text) of each leaf template argument of a specialisation's name, nested
    arguments included: "k<A, T<1, 2>>" gives ("0", "A"), ("1.0", "1"), ("1.1", "2")."""
    leaves = []
    index = []    # the argument's index at each open level
    nested = []   # whether the current argument of each level holds a template of its own
    start = 0
    for i, c in enumerate(name):
        if c == "<":
            if nested:
                nested[-1] = True
            index.append(0)
            nested.append(False)
        elif c in ",>":
            if not nested[-1]:
                leaves.append((".".join(map(str, index)), name[start:i].strip()))
            if c == ",":
                index[-1] += 1
                nested[-1] = False
            else:
                index.pop()
                nested.pop()
        else:
            continue
        start = i + 1
    return leaves


def covering_specialisations(names: list[str]) -> list[str]:
    """A few of `names` in which every kernel meets every value of each of its template
    arguments at least once (greedy set cover): what one specialisation per kernel misses,
    such as a code path only one score hook compiles, is compiled by some name here."""
    features = {n: {(n.split("<")[0], pos, text) for pos, text in _template_leaves(n)}
                for n in names}
    left = set().union(*features.values()) if features else set()
    chosen = []
    while left:
        best = max(names, key=lambda n: len(features[n] & left))
        chosen.append(best)
        left -= features[best]
    return chosen


def check_all(archs=ARCHS, nvcc: str | None = None) -> list[KernelReport]:
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (set CUDACXX or put nvcc on PATH)")
    by_job = defaultdict(list)
    for arch in archs:  # each architecture builds the shapes the planner picks for it
        for filename, name in _plan.all_specialisations(arch):
            by_job[filename, arch].append(name)
    # One nvcc per file and architecture, cut into pieces where there are cores to spare: the
    # largest file (the backward, 500+ kernels) alone took minutes on one core of a 16-core
    # machine while the others idled. About two pieces per core (each piece parses the
    # headers again, so a 2-core machine keeps one per file).
    cores = os.cpu_count() or 1
    size = max(16, -(-sum(map(len, by_job.values())) // (2 * cores)))
    jobs = [(f, names[i:i + size], arch) for (f, arch), names in by_job.items()
            for i in range(0, len(names), size)]
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), cores))) as pool:
        results = list(pool.map(lambda job: compile_file(*job, nvcc), jobs))
    reports = [r for _, rs in results for r in rs]
    expected = sum(len(_plan.all_specialisations(a)) for a in archs)
    if len(reports) != expected:
        raise RuntimeError(f"expected {expected} kernels in the ptxas report, got {len(reports)}")
    unnamed = [r.name for r in reports if not r.expression]
    if unnamed:
        raise RuntimeError(f"{len(unnamed)} kernels not traced to their name expressions in the "
                           f"PTX, e.g. {unnamed[0]}")
    return reports


def static_smem_overflows(reports: list[KernelReport]) -> list[tuple[KernelReport, int]]:
    """(report, room) of each kernel whose static shared memory exceeds its room beside the
    dynamic shared memory of its plans (_registry.static_smem_room): a launch of it would fail
    with "invalid argument" when its dynamic limit is raised."""
    from . import _registry
    rooms = {arch: _registry.static_smem_room(arch) for arch in {r.arch for r in reports}}
    return [(r, rooms[r.arch][r.expression]) for r in reports
            if r.expression in rooms[r.arch] and r.smem_static > rooms[r.arch][r.expression]]


def cache_key(archs, nvcc: str) -> str:
    """What the check's outcome depends on: every kernel source as compiled, the names of the
    specialisations per architecture, the flags and the compiler's version."""
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    h = hashlib.sha256()
    for part in (version, repr(_loader.NVRTC_OPTIONS), repr(tuple(archs))):
        h.update(part.encode())
    for arch in archs:
        specs = _plan.all_specialisations(arch)
        h.update(repr(specs).encode())
        for filename in sorted({f for f, _ in specs}):
            h.update(_loader.expand_source(filename).encode())
    for f in (instantiation_source, parse_ptxas, compile_file):
        h.update(f.__code__.co_code)
    return h.hexdigest()[:32]


def default_cache_dir() -> str:
    return os.environ.get("CUFLASH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cuflash",
        "compile_check")


def check_all_cached(archs=ARCHS, nvcc: str | None = None, cache_dir: str | None = None,
                     use_cache: bool = True) -> tuple[list[KernelReport], bool]:
    """check_all, or its reports from the cache when this exact tree and compiler were checked
    before. Returns (reports, from_cache). Only a complete, error-free check is cached (its
    reports are kept as they are, spills included, so a cached spill still fails)."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (set CUDACXX or put nvcc on PATH)")
    path = os.path.join(cache_dir or default_cache_dir(), cache_key(archs, nvcc) + ".json")
    # Callers that run at once (the suite's workers, the sdist's own tests beside them) take
    # turns: the first compiles, the others then read its reports instead of compiling too.
    with _file_lock(path + ".lock" if use_cache else None):
        if use_cache and os.path.isfile(path):
            try:
                with open(path) as f:
                    return [KernelReport(**r) for r in json.load(f)], True
            except (OSError, ValueError, TypeError):
                pass  # unreadable: compile again
        reports = check_all(archs, nvcc)
        try:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump([dataclasses.asdict(r) for r in reports], f)
            os.replace(tmp, path)
        except OSError:
            pass  # a cache that cannot be written only costs time
        return reports, False


@contextlib.contextmanager
def _file_lock(path: str | None):
    """An exclusive lock on `path` (created) for the block; none where path is None, where
    the folder cannot be written, or where the platform has no fcntl."""
    try:
        import fcntl
        os.makedirs(os.path.dirname(path), exist_ok=True)
        f = open(path, "a")
    except (ImportError, OSError, TypeError):
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _demangle(names: list[str]) -> dict[str, str]:
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True)
    return dict(zip(names, out.stdout.splitlines()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", help="80, 90, ... (repeatable)")
    parser.add_argument("--no-cache", action="store_true",
                        help="compile even if this exact tree and compiler were checked before")
    parser.add_argument("--write-params", action="store_true",
                        help="write kernels/params.cuh and kernels/wgmma.cuh (generated from "
                             "cuflash/_params.py and cuflash/_wgmma.py) and exit")
    args = parser.parse_args(argv)
    if args.write_params:
        for header, text in ((_params.HEADER, _params.header_text()),
                             (_wgmma.HEADER, _wgmma.header_text())):
            path = _loader.KERNEL_DIR / header
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    reports, cached = check_all_cached(tuple(args.arch or ARCHS), use_cache=not args.no_cache)
    if cached:
        print("(reports of an earlier check of this exact tree and compiler; --no-cache "
              "compiles again)")
    names = _demangle(sorted({r.name for r in reports}))
    print(f"{'arch':<6}{'regs':>5}{'stack':>7}{'spill st':>9}{'spill ld':>9}  kernel")
    bad, over = 0, {id(r) for r, _ in static_smem_overflows(reports)}
    for r in sorted(reports, key=lambda r: (names[r.name], r.arch)):
        flag = "  <-- SPILLS" if r.spill_stores or r.spill_loads else \
            "  <-- WGMMA SERIALIZED" if r.wgmma_serialized else \
            "  <-- STATIC + DYNAMIC SHARED MEMORY OVER THE LIMIT" if id(r) in over else ""
        bad += bool(flag)
        short = names[r.name].replace("void ", "").split("(")[0]
        print(f"sm_{r.arch:<3}{r.registers:>5}{r.stack:>7}{r.spill_stores:>9}{r.spill_loads:>9}"
              f"  {short}{flag}")
    print(f"{len(reports)} kernels compiled, {bad} with spills, serialized wgmma or too much "
          f"shared memory")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
