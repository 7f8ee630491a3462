"""CPU test helpers for the kernels' parameter structs as packed (cuflash/_params.py)."""

import struct


def member_value(ctype: str, buf, offset: int):
    """The value of a struct member of C type `ctype` packed at `offset` in `buf` (little-
    endian): pointers and integers as ints, a TensorMap as its 128 bytes, a float as a float.
    Read independently of the packer's own table of types."""
    fmt = "<Q" if "*" in ctype else "<q" if ctype == "long long" else \
        "<i" if ctype == "int" else "<I" if ctype == "unsigned" else \
        "<128s" if ctype == "TensorMap" else "<f"
    return struct.unpack_from(fmt, buf, offset)[0]
