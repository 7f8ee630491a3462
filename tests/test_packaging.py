"""CPU: a non-editable wheel ships the CUDA sources and the installed package finds them."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    setuptools = pytest.importorskip("setuptools", reason="building the wheel needs setuptools")
    major_minor = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
    if major_minor < (70, 1):
        pytest.importorskip("wheel", reason="an offline wheel build needs setuptools>=70.1 "
                            "or the wheel package (the test extra installs setuptools>=70.1)")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(ROOT)], check=True)
    (path,) = out.glob("cuflash-*.whl")
    return path


def test_wheel_ships_kernel_sources(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for src in (ROOT / "kernels").iterdir():
        if src.suffix in (".cu", ".cuh"):
            assert f"cuflash/kernels/{src.name}" in names


def test_installed_wheel_finds_its_kernels(wheel, tmp_path):
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
