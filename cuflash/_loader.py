"""Kernel loader: the one place that turns ``kernels/*.cu`` into launchable CuPy kernels.

* Sources are read from the ``kernels`` directory (top-level in a source checkout, shipped as
  ``cuflash/kernels`` inside a wheel).
* ``#include "x.cuh"`` lines are inlined here, each file framed by ``#line`` directives, so
  1. the compiled string contains every header (CuPy's on-disk cache keys on the source
     string, not on included files: a header edit must change the key), and
  2. compiler messages still name the real file and line.
* Templates are specialised through ``name_expressions`` (one module per specialisation,
  compiled by NVRTC on first use for the current device's architecture) and cached per
  device, file, specialisation and source digest.
* Compile errors become :class:`KernelCompileError`, whose message starts with
  ``file:line: error text``.
* :class:`Launcher` launches a compiled kernel with its parameter struct packed in a
  :class:`ParamBuffer` (one launch path for every kernel).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import threading
import warnings
from functools import cache
from pathlib import Path

__all__ = [
    "KERNEL_DIR",
    "KernelCompileError",
    "NVRTC_OPTIONS",
    "expand_source",
    "source_digest",
    "get_kernel",
    "first_error_location",
    "ParamBuffer",
    "Launcher",
]

# Options shared by NVRTC (run time) and nvcc (the CPU compile check).
NVRTC_OPTIONS = ("-std=c++17",)


def _find_kernel_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise ImportError(f"cuflash: kernel sources not found (looked in {here / 'kernels'} and "
                      f"{here.parent / 'kernels'}); the installation is broken")


KERNEL_DIR = _find_kernel_dir()

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


class KernelCompileError(RuntimeError):
    """A kernel failed to compile. ``str(err)`` starts with ``file:line: message``."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


def expand_source(filename: str, kernel_dir: Path | None = None) -> str:
    """Return ``filename`` with every quoted ``#include`` inlined (each header once)."""
    kernel_dir = Path(kernel_dir) if kernel_dir is not None else KERNEL_DIR
    seen: set[str] = set()
    out: list[str] = []

    def emit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        path = kernel_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"cuflash kernel source {path} not found")
        out.append(f'#line 1 "{name}"')
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            match = _INCLUDE.match(line)
            if match:
                emit(match.group(1))
                out.append(f'#line {lineno + 1} "{name}"')
            elif line.strip() == "#pragma once":
                out.append("")  # keeps the line count; inlining already includes once
            else:
                out.append(line)

    emit(filename)
    return "\n".join(out) + "\n"


def source_digest(filename: str, kernel_dir: Path | None = None) -> str:
    return hashlib.sha256(expand_source(filename, kernel_dir).encode()).hexdigest()[:16]


# "fa2_forward.cu(123): error: ..." (NVRTC and nvcc both write this form)
_ERROR = re.compile(r"^(?P<file>[^\s()]+)\((?P<line>\d+)\): (?P<kind>error|catastrophic error)"
                    r"[^:]*: (?P<text>.*)$", re.MULTILINE)


def first_error_location(log: str):
    """(file, line, text) of the first error in a compiler log, or None."""
    match = _ERROR.search(log)
    if not match:
        return None
    return match.group("file"), int(match.group("line")), match.group("text").strip()


_cache: dict = {}
_key_locks: dict = {}
_key_locks_guard = threading.Lock()


@cache
def _expanded(filename: str, kernel_dir: Path) -> tuple[str, str]:
    src = expand_source(filename, kernel_dir)
    return src, hashlib.sha256(src.encode()).hexdigest()[:16]


def get_kernel(filename: str, name_expression: str, options: tuple = ()):
    """The compiled ``name_expression`` (a template specialisation) of ``kernels/filename``,
    for the current CUDA device, compiled on first use and cached. Thread-safe; different
    specialisations compile in parallel."""
    import cupy

    device = cupy.cuda.Device()
    source, digest = _expanded(filename, KERNEL_DIR)
    opts = NVRTC_OPTIONS + tuple(options)
    key = (device.id, filename, name_expression, opts, digest)
    kernel = _cache.get(key)
    if kernel is not None:
        return kernel
    with _key_locks_guard:
        lock = _key_locks.setdefault(key, threading.Lock())
    with lock:
        kernel = _cache.get(key)
        if kernel is None:
            kernel = _cache[key] = _compile(cupy, source, opts, filename, name_expression)
    return kernel


def _compile(cupy, source: str, opts: tuple, filename: str, name_expression: str):
    """NVRTC through cupy.RawModule (CuPy keeps the binary in its disk cache). Where that
    cache cannot be used (CUPY_CACHE_DIR read-only, full or missing), compile again without it,
    keeping the kernel in this process only, and warn once."""
    try:
        if not _disk_cache_failed:
            return _get_function(cupy, source, opts, filename, name_expression)
    except OSError as exc:
        _disk_cache_unusable(exc)
    with _in_memory_lock:  # CuPy reads this variable at each compile
        saved = os.environ.get("CUPY_CACHE_IN_MEMORY")
        os.environ["CUPY_CACHE_IN_MEMORY"] = "1"
        try:
            return _get_function(cupy, source, opts, filename, name_expression)
        finally:
            if saved is None:
                del os.environ["CUPY_CACHE_IN_MEMORY"]
            else:
                os.environ["CUPY_CACHE_IN_MEMORY"] = saved


def _get_function(cupy, source, opts, filename, name_expression):
    module = cupy.RawModule(code=source, options=opts, name_expressions=[name_expression])
    try:
        return module.get_function(name_expression)
    except cupy.cuda.compiler.CompileException as exc:
        log = str(exc)
        loc = first_error_location(log)
        where = f"{loc[0]}:{loc[1]}: {loc[2]}" if loc else f"{filename}: compile failed"
        raise KernelCompileError(
            f"{where}\n(while compiling {name_expression} from {filename}; full "
            f"compiler log below)\n{log}", log) from None


_disk_cache_failed = False
_in_memory_lock = threading.Lock()


def _disk_cache_unusable(exc: OSError) -> None:
    global _disk_cache_failed
    with _in_memory_lock:
        if _disk_cache_failed:
            return
        _disk_cache_failed = True
    warnings.warn(f"cuflash: CuPy's kernel cache directory cannot be used ({exc}); compiled "
                  "kernels are kept in memory for this process only (set CUPY_CACHE_DIR to a "
                  "writable directory to keep them across processes)", RuntimeWarning,
                  stacklevel=4)


class ParamBuffer:
    """The bytes of one kernel parameter struct (``_params.Struct``), and the ``void**``
    through which ``cuLaunchKernel`` reads them (every cuflash kernel takes one struct).
    ``pack(**values)`` writes a call's values by field name. The buffer is read at launch:
    one packing can serve several launches in a row (the backward's three kernels). Whoever
    packs and launches holds ``lock`` meanwhile, so that threads do not interleave."""

    def __init__(self, struct):
        self.struct = struct
        self.buf = bytearray(struct.size)
        base = ctypes.addressof((ctypes.c_char * struct.size).from_buffer(self.buf))
        self.slots = (ctypes.c_void_p * 1)(base)
        self.params = ctypes.addressof(self.slots)
        self.lock = threading.Lock()
        self.pack = functools.partial(struct.pack_into, self.buf)


# cuLaunchKernelEx's arguments (cuda.h, CUDA 12.0+): the launch, and one attribute.
class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig: 56 bytes
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, 4 bytes of padding, a union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION

# Dependent launches (Launcher(dependent=True)) on GPUs of compute capability 9.0 and up; off,
# every launch waits for the one before it as usual (an A/B switch for the bench, not an API).
DEPENDENT_LAUNCHES = True


@cache
def _launch_kernel_ex():
    """The driver's cuLaunchKernelEx through ctypes (libcuda, which CuPy has loaded), or None
    where the driver has none."""
    try:
        fn = getattr(ctypes.CDLL("libcuda.so.1"), "cuLaunchKernelEx", None)
    except OSError:  # (a driver library under another name: ordinary launches only)
        return None
    if fn is not None:
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 4
    return fn


class Launcher:
    """A kernel launched through ``cuLaunchKernel`` with a packed parameter struct
    (:class:`ParamBuffer`). CuPy's ``RawKernel.__call__`` turns every argument into a C value
    object on each call; here a launch is one driver call on bytes packed once.

    ``dependent=True`` launches it as a programmatic dependent of the kernel before it in the
    stream (``cuLaunchKernelEx``, sm_90+): it may start while that one finishes, and holds in
    ``grid_dependency_wait()`` (kernels/common.cuh) until that one's writes are visible. Only a
    kernel that calls it before its first global access may be launched so; below sm_90 it is
    an ordinary launch.

    Build it with the kernel's device current, and call it with that device current: it launches
    in that device's primary context, on the stream whose handle is passed. Thread-safe."""

    def __init__(self, kernel):
        from cupy.cuda import driver, runtime

        self.kernel = kernel  # (holds the module that the CUfunction below belongs to)
        self._launch = driver.launchKernel
        self._current_context = driver.ctxGetCurrent
        self._set_device = runtime.setDevice
        self._init_context = lambda: runtime.free(0)  # cudaFree(0): binds the context
        self._func = kernel.kernel.ptr  # the CUfunction of the current device (loads it there)
        self._device = runtime.getDevice()
        # That device's primary context, bound to this thread first: a thread that has made no
        # CUDA runtime call yet (a fresh one, after precompile() loaded every kernel elsewhere)
        # has no context current at all, and 0 must not be taken for the context.
        self._bind_context()
        self._context = driver.ctxGetCurrent()
        major = runtime.getDeviceProperties(self._device)["major"]
        self._set_up_dependent(_launch_kernel_ex() if major >= 9 else None)

    def _set_up_dependent(self, launch_ex) -> None:
        """Dependent launches through `launch_ex` (cuLaunchKernelEx; None: none), with one
        launch config per (grid, block, shared memory, stream) built on first use: a decode
        loop repeats a few, and filling a ctypes struct per launch cost microseconds."""
        self._launch_ex = launch_ex
        self._ex_configs = {}

    def _ex_config(self, key) -> int:
        """The address of the launch config of `key` (grid, block, shared memory, stream),
        with its one attribute (programmatic stream serialization, on); built once."""
        made = self._ex_configs.get(key)
        if made is None:
            grid, block, shared_mem, stream = key
            attr = _LaunchAttribute(_PROGRAMMATIC_STREAM_SERIALIZATION)
            attr.value[0] = 1
            config = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(block, 1, 1),
                                   shared_mem, stream or None, ctypes.addressof(attr), 1)
            if len(self._ex_configs) >= 64:  # (a bound: streams come and go)
                self._ex_configs = {}
            made = self._ex_configs[key] = (ctypes.addressof(config), config, attr)
        return made[0]

    def _bind_context(self) -> None:
        """Make the device's primary context current on this thread. The runtime binds it
        lazily, and CuPy's memory pool may have served every allocation of a thread without
        a CUDA call. The caller has made this device current already, so the thread's device
        does not change."""
        self._set_device(self._device)
        if not self._current_context():  # (runtimes that bind only on first use)
            self._init_context()

    def is_current(self) -> bool:
        """Whether this thread has the kernel's context current (a launch needs nothing else)."""
        return self._current_context() == self._context

    def bind_thread(self) -> None:
        """Make sure this thread has the kernel's context current (a thread's first launch
        binds it; driver calls made before the launch, such as encoding a tensor map, need it
        too)."""
        if self._current_context() != self._context:
            self._bind_context()

    def __call__(self, grid, block: int, shared_mem: int, stream: int,
                 params: ParamBuffer, dependent: bool = False) -> None:
        self.bind_thread()
        if not (dependent and self._launch_ex is not None and DEPENDENT_LAUNCHES):
            self._launch(self._func, grid[0], grid[1], grid[2], block, 1, 1, shared_mem,
                         stream, params.params, 0)
            return
        rc = self._launch_ex(self._ex_config((tuple(grid), block, shared_mem, stream)),
                             self._func, params.params, None)
        if rc:
            raise RuntimeError(f"cuLaunchKernelEx failed (CUresult {rc}) for grid {tuple(grid)}"
                               f", {block} threads, {shared_mem} bytes of shared memory")
