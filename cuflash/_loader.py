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
"""

from __future__ import annotations

import hashlib
import re
import threading
from functools import lru_cache
from pathlib import Path

__all__ = [
    "KERNEL_DIR",
    "KernelCompileError",
    "NVRTC_OPTIONS",
    "expand_source",
    "source_digest",
    "get_kernel",
    "first_error_location",
]

# Options shared by NVRTC (run time) and nvcc (the CPU compile check).
NVRTC_OPTIONS = ("-std=c++17",)


def _find_kernel_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise ImportError(
        "cuflash: kernel sources not found (looked in %s and %s); the installation is broken"
        % (here / "kernels", here.parent / "kernels")
    )


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


@lru_cache(maxsize=None)
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
            module = cupy.RawModule(code=source, options=opts,
                                    name_expressions=[name_expression])
            try:
                kernel = module.get_function(name_expression)
            except cupy.cuda.compiler.CompileException as exc:
                log = str(exc)
                loc = first_error_location(log)
                where = f"{loc[0]}:{loc[1]}: {loc[2]}" if loc else f"{filename}: compile failed"
                raise KernelCompileError(
                    f"{where}\n(while compiling {name_expression} from {filename}; full "
                    f"compiler log below)\n{log}", log) from None
            _cache[key] = kernel
    return kernel
