"""CPU: the kernels' parameter structs (cuflash/_params.py, kernels/params.cuh) and the packing
the launches use.

The host packs each call's values into the bytes of a C struct; if the two disagreed on a
field's place, every kernel would read wrong sizes or pointers: a silent wrong answer. The C
side checks each offset against cuflash/_params.py in static_asserts (compiled by the compile
check); these tests check that the committed header is the generated one, that every kernel
takes its family's struct, and that packing puts each value where the header says."""

import ctypes
import re
import struct

import pytest
from param_helpers import member_value

from cuflash import _loader, _params, _plan, _wgmma

# The backward's two passes take their family's struct as a template parameter (BwdParams or
# Sm90BwdParams, which holds every BwdParams field: the Sm90 struct is checked for that below).
BACKWARD_PASSES_FILE = "backward_passes.cuh"
_EITHER_BWD = type("Template", (), {"name": "Params"})

# (file, kernel function, struct)
KERNELS = [
    (_plan.FORWARD_FILE, "fa2_forward", _params.FWD),
    (_plan.FA1_FILE, "fa1_forward", _params.FWD),
    (_plan.FA1_FILE, "fa1_finalize", _params.FWD),
    (BACKWARD_PASSES_FILE, "fa2_backward_preprocess", _EITHER_BWD),
    (_plan.BACKWARD_FILE, "fa2_backward", _params.BWD),
    (BACKWARD_PASSES_FILE, "fa2_backward_dq", _EITHER_BWD),
    (BACKWARD_PASSES_FILE, "fa2_backward_dq_bulk", _EITHER_BWD),
    (_plan.SM90_FORWARD_FILE, "fa2_forward_sm90", _params.SM90_FWD),
    (_plan.SM90_BACKWARD_FILE, "fa2_backward_sm90", _params.SM90_BWD),
]


def test_hopper_backward_struct_holds_every_backward_field():
    """The passes read BwdParams' fields by name from either struct."""
    names = {f.name: f.kind for f in _params.SM90_BWD.fields}
    assert all(names.get(f.name) == f.kind for f in _params.BWD.fields)


def test_committed_header_is_the_generated_one():
    committed = (_loader.KERNEL_DIR / _params.HEADER).read_text()
    assert committed == _params.header_text(), (
        "kernels/params.cuh is stale: run python -m cuflash.compile_check --write-params")


def test_committed_wgmma_header_is_the_generated_one():
    committed = (_loader.KERNEL_DIR / _wgmma.HEADER).read_text()
    assert committed == _wgmma.header_text(), (
        "kernels/wgmma.cuh is stale: run python -m cuflash.compile_check --write-params")


@pytest.mark.parametrize("filename,function,params", KERNELS, ids=[k for _, k, _ in KERNELS])
def test_every_kernel_takes_its_familys_struct(filename, function, params):
    src = (_loader.KERNEL_DIR / filename).read_text()
    match = re.search(r"\b" + function + r"\(([^)]*)\)\s*\{", src)
    assert match, f"{function} not found in {filename}"
    # (by value; the Hopper kernels' struct as __grid_constant__: TMA reads its tensor maps)
    assert match.group(1).split() in (["const", params.name, "p"],
                                      ["const", "__grid_constant__", params.name, "p"])
    assert f'#include "{_params.HEADER}"' in src


def test_every_global_kernel_is_listed():
    for filename in (_plan.FORWARD_FILE, _plan.FA1_FILE, _plan.BACKWARD_FILE,
                     BACKWARD_PASSES_FILE, _plan.SM90_FORWARD_FILE, _plan.SM90_BACKWARD_FILE):
        src = (_loader.KERNEL_DIR / filename).read_text()
        found = set(re.findall(r"__global__ void __launch_bounds__\([^;{]*?\)\s*(\w+)\(", src,
                               re.S))
        assert found == {k for f, k, _ in KERNELS if f == filename}


@pytest.mark.parametrize("params", _params.STRUCTS, ids=lambda s: s.name)
def test_packing_puts_each_value_at_its_offset(params):
    values, expect = {}, {}
    for i, f in enumerate(params.fields):
        if f.kind == "ptr":
            values[f.name] = 0x1000_0000_0000 + 16 * i
        elif f.kind == "strides":
            values[f.name] = (-(2**40) - i, 3 * i + 1, 2**33 + i)
        elif f.kind == "i32":
            values[f.name] = -7 * i - 1
        elif f.kind == "u32":
            values[f.name] = 2**32 - 7 * i - 1
        elif f.kind == "tmap":
            values[f.name] = bytes((i * 37 + j) % 256 for j in range(128))
        else:
            values[f.name] = 0.25 * i + 0.5
    for f in params.fields:
        if f.kind == "strides":
            for axis, v in zip("bsh", values[f.name]):
                expect[f"{f.name[:-len('_strides')]}_stride_{axis}"] = v
        else:
            expect[f.name] = values[f.name]
    buf = _loader.ParamBuffer(params)
    buf.pack(**values)
    assert len(buf.buf) == params.size
    for name, ctype, _, offset in params.members:
        got = member_value(ctype, buf.buf, offset)
        if isinstance(got, bytes):
            assert got == expect[name] and offset % 64 == 0, name  # (CUtensorMap: 64-aligned)
        else:
            assert got == pytest.approx(expect[name]), name
    # the launch reads the struct through a one-element void** holding the buffer's address
    slot = ctypes.c_void_p.from_address(buf.params).value
    assert slot == ctypes.addressof((ctypes.c_char * params.size).from_buffer(buf.buf))


def test_packing_refuses_missing_and_unknown_fields():
    buf = _loader.ParamBuffer(_params.FWD)
    with pytest.raises(TypeError, match="missing"):
        buf.pack(q=0, k=0)
    full = {f.name: (0, 0, 0) if f.kind == "strides" else 0 for f in _params.FWD.fields}
    buf.pack(**full)
    with pytest.raises(TypeError, match="unexpected"):
        buf.pack(**full, bogus=1)
    with pytest.raises(struct.error):  # out of range for int32: refused, not truncated
        buf.pack(**{**full, "seqlen_q": 2**31})
