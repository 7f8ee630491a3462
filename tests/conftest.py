"""Shared fixtures. GPU tests use the `gpu` marker and are skipped, with the reason, where no
CUDA device of compute capability >= 8.0 is visible; `slow` tests run only with --slow."""

import os

import pytest

# JAX (tests/test_jax.py) would otherwise reserve most of the GPU's memory when it starts,
# leaving CuPy, which the kernels' scratch comes from, too little.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from cuflash._api import INSTALL_HINT


def _gpu_status():
    try:
        import cupy
    except ImportError as exc:
        return False, f"CuPy is not installed ({exc}); {INSTALL_HINT}"
    try:
        if not cupy.cuda.is_available():
            return False, "no CUDA GPU visible (cupy.cuda.is_available() is False)"
        cc = int(cupy.cuda.Device().compute_capability)
    except Exception as exc:  # driver missing or broken
        return False, f"CUDA is not usable here: {exc}"
    if cc < 80:
        return False, f"GPU compute capability {cc / 10:.1f} < 8.0"
    return True, ""


GPU_AVAILABLE, GPU_SKIP_REASON = _gpu_status()


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (minutes each on an H200)")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason=GPU_SKIP_REASON)
    skip_slow = pytest.mark.skip(reason="slow test: run with pytest --slow")
    run_slow = config.getoption("--slow")
    for item in items:
        if "gpu" in item.keywords and not GPU_AVAILABLE:
            item.add_marker(skip_gpu)
        elif "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
