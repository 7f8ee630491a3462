"""CPU: the wheel and the sdist, built from a copy of the tree in a temporary directory (so no
build/ is left in the tree and no stale file can ship): the wheel ships the CUDA sources, the
license and py.typed, and the installed package finds its kernels; the sdist carries its own
CPU tests and they pass from the unpacked sdist."""

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_IGNORE = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".venv",
                                 ".ci-venv", ".pytest_cache", ".git", "*.tmp", ".whl", ".gl")


def _tracked_files():
    """The files git tracks or would (not ignored), in a checkout; None in an unpacked sdist
    (copy what is there)."""
    if not (ROOT / ".git").exists() or not shutil.which("git"):
        return None
    res = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True)
    return [f for f in res.stdout.decode().split("\0") if f] if res.returncode == 0 else None


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """A copy of the project's source files (tracked ones in a checkout) to build from."""
    pytest.importorskip("setuptools", reason="building needs setuptools (the test extra)")
    dst = tmp_path_factory.mktemp("src") / "cuflash"
    files = _tracked_files()
    if files is None:
        shutil.copytree(ROOT, dst, ignore=_IGNORE)
    else:
        for name in files:
            target = dst / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / name).is_file():
                shutil.copy2(ROOT / name, target)
    return dst


@pytest.fixture(scope="module")
def built(source_copy, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    had_build = (ROOT / "build").exists()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(source_copy)], check=True)
    subprocess.run([sys.executable, "-c",
                    f"from setuptools import build_meta; build_meta.build_sdist({str(out)!r})"],
                   cwd=source_copy, check=True, capture_output=True)
    assert (ROOT / "build").exists() == had_build, "building left a build/ in the tree"
    (wheel,) = out.glob("cuflash-*.whl")
    (sdist,) = out.glob("cuflash-*.tar.gz")
    return wheel, sdist


def test_wheel_ships_kernels_license_and_typing(built):
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    for src in (ROOT / "kernels").iterdir():
        if src.suffix in (".cu", ".cuh"):
            assert f"cuflash/kernels/{src.name}" in names
    assert "cuflash/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    import cuflash
    assert f"Version: {cuflash.__version__}" in text
    assert "License-Expression: MIT" in text
    assert "Environment :: GPU :: NVIDIA CUDA :: 12" in text
    assert "cupy-cuda12x[ctk]>=14" in text.replace(" ", "").replace("'", "").replace('"', "")


def test_installed_wheel_finds_its_kernels(built, tmp_path):
    wheel, _ = built
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True)
    code = ("import cuflash, cuflash._loader as l; "
            "src = l.expand_source('fa2_forward.cu'); "
            "print(l.KERNEL_DIR); assert 'fa2_forward' in src")
    env = dict(os.environ, PYTHONPATH=str(target))
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True)
    assert Path(res.stdout.strip()).resolve() == (target / "cuflash" / "kernels").resolve()


def test_sdist_runs_its_own_cpu_tests(built, tmp_path):
    _, sdist = built
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    (top,) = tmp_path.iterdir()
    for need in ("LICENSE", "tests/conftest.py", "tests/gpu_helpers.py", "bench/bench.py",
                 "examples/train_attention.py", "kernels/common.cuh", "cuflash/py.typed"):
        assert (top / need).is_file(), f"the sdist lacks {need}"
    # Everything under tests/ ships (no helper left behind).
    for src in (ROOT / "tests").glob("*.py"):
        assert (top / "tests" / src.name).is_file(), src.name
    tests = ["tests/test_reference.py", "tests/test_validation.py", "tests/test_launch.py",
             "tests/test_bench_tools.py", "tests/test_example.py", "tests/test_compile.py"]
    env = dict(os.environ, PYTHONPATH=str(top))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *tests], cwd=top, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert " passed" in res.stdout
