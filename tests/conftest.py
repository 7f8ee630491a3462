"""Shared fixtures. GPU tests use the `gpu` marker and are skipped, with the reason, where no
CUDA device of compute capability >= 8.0 is visible; `slow` tests run only with --slow."""

import os
import zlib

import numpy as np
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


@pytest.fixture(autouse=True)
def _seeded_generators(request):
    """Seed NumPy's and CuPy's global generators from the test's id before each test, so that a
    test draws the same inputs whichever worker runs it and whatever ran before: an input near
    the accuracy rule's limit then fails every time or never, not now and then."""
    seed = zlib.crc32(request.node.nodeid.encode())
    np.random.seed(seed)
    if GPU_AVAILABLE:
        import cupy
        cupy.random.seed(seed)


@pytest.fixture(params=["default", "portable"])
def family(request):
    """A GPU test that takes it runs on both kernel families: as forward() and backward()
    dispatch (the Hopper family on an sm_90 GPU, where it covers the call) and under
    cuflash.portable_kernels() (the mma.sync kernels)."""
    if request.param == "portable":
        import cupy

        import cuflash
        if cupy.cuda.Device().compute_capability != "90":
            pytest.skip("on this GPU the default family is the portable one (tested as default)")
        with cuflash.portable_kernels():
            yield request.param
    else:
        yield request.param


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (minutes each on an H200)")
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run the K-th of N parts of the collected tests (1 <= K <= N; every "
                          "N-th test in collection order, so each part gets some of every file): "
                          "the full GPU suite takes longer than one device call allows")


def _shard(items, spec):
    """(kept, deselected): spec "K/N" keeps the items at collection index i with i % N == K - 1."""
    try:
        k, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes K/N, such as 1/2; got {spec!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard {spec}: K must be between 1 and N")
    return ([it for i, it in enumerate(items) if i % n == k - 1],
            [it for i, it in enumerate(items) if i % n != k - 1])


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason=GPU_SKIP_REASON)
    skip_slow = pytest.mark.skip(reason="slow test: run with pytest --slow")
    run_slow = config.getoption("--slow")
    if config.getoption("--shard"):
        items[:], deselected = _shard(items, config.getoption("--shard"))
        config.hook.pytest_deselected(items=deselected)
    for item in items:
        if "gpu" in item.keywords and not GPU_AVAILABLE:
            item.add_marker(skip_gpu)
        elif "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
