"""Shared fixtures. GPU tests use the `gpu` marker and are skipped, with the reason, where no
CUDA device of compute capability >= 8.0 is visible."""

import pytest


def _gpu_status():
    try:
        import cupy
    except ImportError as exc:
        return False, f"CuPy is not installed ({exc}); install cuflash[cuda12] or [cuda13]"
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


def pytest_collection_modifyitems(config, items):
    if GPU_AVAILABLE:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
