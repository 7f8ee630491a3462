"""CPU: the packed launches (cuflash/_loader.PackedLaunch) pass what the kernels declare.

_api packs each kernel's arguments by a signature string (one letter per parameter); a letter
that disagreed with the kernel's parameter list would shift every later argument: a silent
wrong answer. These tests read the parameter lists from kernels/*.cu and compare."""

import ctypes
import re
import struct

import pytest

from cuflash import _api, _loader, _plan

# (file, kernel function, signature used by _api)
LAUNCHES = [
    (_plan.FORWARD_FILE, "fa2_forward", _api._FORWARD_ARGS),
    (_plan.BACKWARD_FILE, "fa2_backward_preprocess", _api._PREPROCESS_ARGS),
    (_plan.BACKWARD_FILE, "fa2_backward", _api._BACKWARD_ARGS),
    (_plan.BACKWARD_FILE, "fa2_backward_dq", _api._DQ_ARGS),
    (_plan.BACKWARD_FILE, "fa2_backward_dq_bulk", _api._DQ_BULK_ARGS),
]


def declared_signature(filename: str, function: str) -> str:
    """The PackedLaunch letters of `function`'s parameter list in kernels/filename."""
    src = (_loader.KERNEL_DIR / filename).read_text()
    match = re.search(r"\b" + function + r"\(([^)]*)\)\s*\{", src)
    assert match, f"{function} not found in {filename}"
    letters = ""
    for param in match.group(1).split(","):
        words = param.split()
        if "*" in param:
            letters += "P"
        elif words[:2] == ["long", "long"]:
            letters += "q"
        elif words[0] in ("int", "float"):
            letters += words[0][0]
        else:
            raise AssertionError(f"{function}: no PackedLaunch letter for parameter {param!r}")
    return letters


@pytest.mark.parametrize("filename,function,signature", LAUNCHES,
                         ids=[f for _, f, _ in LAUNCHES])
def test_signature_matches_kernel_source(filename, function, signature):
    assert signature == declared_signature(filename, function)


def test_slots_hold_each_argument_as_its_c_type():
    args = _loader.ArgSlots("PiqfP")
    values = (0xDEADBEEF00000010, -7, -(2**40), 0.1, 0)
    args.pack(*values)
    addr = list(args.slots)
    assert ctypes.addressof(args.slots) == args.params
    assert ctypes.c_uint64.from_address(addr[0]).value == values[0]
    assert ctypes.c_int32.from_address(addr[1]).value == -7
    assert ctypes.c_int64.from_address(addr[2]).value == -(2**40)
    assert ctypes.c_float.from_address(addr[3]).value == pytest.approx(0.1, rel=1e-7)
    assert ctypes.c_uint64.from_address(addr[4]).value == 0
    with pytest.raises(struct.error):  # out of range for int32: refused, not truncated
        args.pack(0, 2**31, 0, 0.0, 0)
    with pytest.raises(struct.error):  # a missing argument: refused
        args.pack(0, 1, 2, 3.0)
