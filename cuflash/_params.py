"""The kernels' parameter structs, one per kernel family, described once here.

Every kernel takes one struct by value (``const FwdParams p``) instead of a long positional
list. From these descriptions come both

* the C structs, ``kernels/params.cuh`` (``python -m cuflash.compile_check --write-params``
  writes it; a CPU test checks that the committed header is what this file generates, and the
  header's static_asserts check each offset against the compiler's), and
* the host-side packing: :class:`Struct` packs a call's values, given by field name, into
  the same bytes (``_loader.ParamBuffer``; ``_loader.Launcher`` hands them to
  ``cuLaunchKernel``).

Fields are laid out in the order given, each at its natural alignment (the descriptions put
the widest fields first, so there is no padding inside a struct); the size is rounded up to
the largest alignment (8 bytes, 64 with a tensor map). A stride field is three int64 members
in C (``q_stride_b``, ``q_stride_s``, ``q_stride_h``) and one (batch, seq, head) tuple on the
host (``q_strides``). A field with a default may be left out by a launch that does not use
it (the kernels that read it say so); every other field must be given.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# kind -> (C type, struct codes, size of one member, members, alignment)
_KINDS = {
    "ptr": (None, "Q", 8, 1, 8),        # the C type is given per field
    "i64": ("long long", "q", 8, 1, 8),
    "strides": ("long long", "q", 8, 3, 8),  # (batch, sequence, head) strides in elements
    "i32": ("int", "i", 4, 1, 4),
    "u32": ("unsigned", "I", 4, 1, 4),
    "f32": ("float", "f", 4, 1, 4),
    "tmap": ("TensorMap", "128s", 128, 1, 64),  # a TMA tensor map (hopper.cuh), 128 bytes
}
_STRIDE_AXES = (("b", "batch"), ("s", "sequence"), ("h", "head"))


@dataclass(frozen=True)
class Field:
    name: str
    kind: str           # ptr, i64, i32, u32, f32
    doc: str
    ctype: str = ""     # for pointers: the C pointer type
    default: object = None


def _strides(prefix: str, what: str) -> Field:
    return Field(f"{prefix}_strides", "strides", what)


class Struct:
    """A C struct described field by field, and the packing of its values."""

    def __init__(self, name: str, doc: str, fields: list[Field]):
        self.name, self.doc, self.fields = name, doc, fields
        # C members: (name, C type, doc, offset)
        self.members, pos, codes, self.align = [], 0, "", 8
        for f in fields:
            ctype, code, size, count, align = _KINDS[f.kind]
            self.align = max(self.align, align)
            aligned = (pos + align - 1) // align * align
            codes += "x" * (aligned - pos) + code * count
            pos = aligned
            names = ([(f"{f.name[:-len('_strides')]}_stride_{a}", f"{f.doc}: {b} stride in "
                       "elements") for a, b in _STRIDE_AXES] if f.kind == "strides"
                     else [(f.name, f.doc)])
            for name, doc in names:
                self.members.append((name, f.ctype if f.kind == "ptr" else ctype, doc, pos))
                pos += size
        self.size = (pos + self.align - 1) // self.align * self.align
        self.format = "<" + codes + "x" * (self.size - pos)
        self._packer = self._make_packer()

    def _make_packer(self):
        """pack_into(buf, **values), generated so that Python binds the field names itself
        (a missing field is a TypeError, not a silent zero)."""
        args = ", ".join(f.name if f.default is None else f"{f.name}={f.default!r}"
                         for f in self.fields)
        body = ", ".join(f"*{f.name}" if f.kind == "strides" else f.name for f in self.fields)
        src = (f"def pack_into(_buf, *, {args}):\n"
               f"    _pack(_buf, 0, {body})\n")
        scope = {"_pack": struct.Struct(self.format).pack_into}
        exec(src, scope)  # (generated from the field names above)
        return scope["pack_into"]

    def pack_into(self, buf, **values) -> None:
        self._packer(buf, **values)

    def header(self) -> str:
        lines = [f"// {self.doc}", f"struct {self.name} {{"]
        for name, ctype, doc, _ in self.members:
            decl = f"    {ctype} {name};"
            lines.append(f"{decl:<36}// {doc}")
        lines.append("};")
        lines.append(f"static_assert(sizeof({self.name}) == {self.size}, "
                     f"\"{self.name}: size differs from cuflash/_params.py\");")
        # (NVRTC has no offsetof; nvcc, which the CPU compile check runs, proves the offsets,
        # and both lay the struct out by the same ABI.)
        lines.append("#ifndef __CUDACC_RTC__")
        for name, _, _, off in self.members:
            lines.append(f"static_assert(__builtin_offsetof({self.name}, {name}) == {off}, "
                         f"\"{self.name}.{name}\");")
        lines.append("#endif")
        return "\n".join(lines)


# ---- the forward family: fa2_forward, fa1_forward, fa1_finalize -------------------------------
# The inputs every kernel family reads, and their strides.
_QKV = [Field("q", "ptr", "Q (batch, seqlen_q, heads, d)", "const elem_t*"),
        Field("k", "ptr", "K (batch, seqlen_k, heads_k, d)", "const elem_t*"),
        Field("v", "ptr", "V, as K", "const elem_t*")]
_QKVO_STRIDES = [_strides("q", "Q"), _strides("k", "K"), _strides("v", "V"), _strides("o", "O")]
# The problem's sizes, and the softmax scale in the two forms the kernels use.
_SIZES = [Field("seqlen_q", "i32", "query rows per batch entry"),
          Field("seqlen_k", "i32", "key rows per batch entry"),
          Field("d", "i32", "head dim (a multiple of 8, at most the kernel's bucket)"),
          Field("group", "i32", "query heads per kv head (head h reads kv head h / group)")]
_SCALES = [Field("softmax_scale", "f32", "scale of S = Q K^T"),
           Field("scale_log2", "f32", "softmax_scale * log2(e): exp(scale x) = exp2(scale_log2 x)")]
# A sliding window's sides (mask.cuh, read only by Mask<*, LOCAL = true>): a row sees the keys
# from window_left before its diagonal to window_right after it.
_WINDOW = [Field("window_left", "i32", "LOCAL masks: keys before the diagonal", "", 0),
           Field("window_right", "i32", "LOCAL masks: keys after the diagonal (CAUSAL: its "
                 "upper limit)", "", 0)]
# The score hook's parameters (score.cuh, read only by ScoreHook, where it applies them): the
# softcap as two factors on the unscaled S (0: off), the ALiBi slopes (float32 (nheads,) or
# (batch, nheads); null: off), their batch stride, and the shift of a dense batch's diagonal
# (ring attention's blocks sit elsewhere in the sequence than bottom-right; the masks take the
# same shift folded into window_left / window_right on the host, cuflash/_api.py _window).
_HOOK = [Field("alibi_slopes", "ptr", "ALiBi slopes per (batch, head), float32", "const float*",
               0),
         Field("softcap_in", "f32", "softmax_scale / softcap (0: no softcap)", "", 0.0),
         Field("softcap_out", "f32", "softcap / softmax_scale", "", 1.0),
         Field("softcap_log2", "f32", "softcap * log2(e) (Hopper backward: the softcap's "
               "exponent without ALiBi)", "", 0.0),
         Field("alibi_stride_b", "i32", "batch stride of alibi_slopes (0: one row for all)",
               "", 0),
         Field("alibi_shift", "f32", "ALiBi, dense: row i's diagonal is key i + seqlen_k - "
               "seqlen_q + alibi_shift (ring attention's blocks)", "", 0.0)]

# Variable-length batches (seqinfo.cuh; null: dense): entry b's rows are
# [cu_seqlens[b], cu_seqlens[b + 1]) of the packed tensors; seqlen_q and seqlen_k are then the
# longest entry's (the grid's and the workspaces' sizes).
_PACKED = [Field("cu_seqlens_q", "ptr", "packed: cumulative query lengths (batch + 1), int32",
                 "const int*", 0),
           Field("cu_seqlens_k", "ptr", "packed: cumulative key lengths (batch + 1), int32",
                 "const int*", 0),
           Field("total_q", "i32", "packed: rows of the packed query tensor", "", 0)]

FWD = Struct("FwdParams", "Forward kernels (fa2_forward.cu, fa1_forward.cu).", [
    *_QKV,
    Field("o", "ptr", "O, Q's shape (its own strides)", "elem_t*"),
    Field("lse", "ptr", "L (batch, heads, seqlen_q), float32, contiguous; packed: (heads, "
          "total_q)", "float*"),
    Field("o_accum", "ptr", "FA1: O in float32 (batch, heads, seqlen_q, d)", "float*", 0),
    Field("l_accum", "ptr", "FA1: l (batch, heads, seqlen_q)", "float*", 0),
    Field("m_accum", "ptr", "FA1: m (batch, heads, seqlen_q)", "float*", 0),
    *_QKVO_STRIDES,
    *_SIZES,
    *_SCALES,
    *_WINDOW,
    *_HOOK,
    *_PACKED,
])

# ---- the Hopper forward: fa2_forward_sm90 ----------------------------------------------------
# The forward's fields behind three TMA tensor maps (encoded on the host, cuflash/_tma.py): Q,
# K and V as 4-d tensors (d, seqlen, heads, batch), boxes of 64 head-dim columns. The kernel
# takes the struct as a __grid_constant__ parameter, so TMA reads the maps where they are.
SM90_FWD = Struct("Sm90FwdParams", "Hopper forward kernel (fa2_forward_sm90.cu).", [
    Field("tm_q", "tmap", "Q's tensor map, boxes of 64 columns x 64 rows (a consumer's)"),
    Field("tm_k", "tmap", "K's tensor map, boxes of 64 columns x B_c rows"),
    Field("tm_v", "tmap", "V's tensor map, as K's"),
    *FWD.fields,
    Field("nheads", "i32", "query heads (the persistent grid's tiles)"),
    Field("batch", "i32", "batch entries (the persistent grid's tiles)"),
    Field("per_unit", "i32", "tiles per unit of work: 1, or 2 (causal rows T_r-1-r and r)"),
    Field("heads_mul", "u32", "FastDiv by nheads (common.cuh): multiplier", "", 1),
    Field("heads_shift", "i32", "FastDiv by nheads: shift", "", 0),
    Field("unit_rows_mul", "u32", "FastDiv by a pair's units, ceil(T_r / per_unit): "
          "multiplier (packed batches: unused)", "", 1),
    Field("unit_rows_shift", "i32", "FastDiv by a pair's units: shift", "", 0),
    Field("tile_counter", "ptr", "packed: the tile scheduler's counter, int32, zero at launch",
          "int*", 0),
    Field("tail_tiles", "i32", "the split tail's tiles, the last ones (causal: the causal "
          "tail's units; 0: none)", "", 0),
    Field("tail_parts", "ptr", "split tail: the split tiles' parts, float32, per boundary",
          "float*", 0),
    Field("tail_flags", "ptr", "split tail: per boundary and warp, parts in, int32, zero "
          "between launches", "int*", 0),
])

# ---- the backward family: preprocess, main kernel, dQ pass ----------------------------------
BWD = Struct("BwdParams", "Backward kernels (fa2_backward.cu).", [
    *_QKV,
    Field("o", "ptr", "O, the forward's output (preprocess)", "const elem_t*"),
    Field("dout", "ptr", "dO, Q's shape", "const elem_t*"),
    Field("lse", "ptr", "L (batch, heads, seqlen_q), float32", "const float*"),
    Field("dsum", "ptr", "D = rowsum(dO o O) (batch, heads, seqlen_q), float32", "float*"),
    Field("dq_accum", "ptr", "float32 dQ sums (layout: fa2_backward.cu)", "float*"),
    Field("dq_order", "ptr", "ordered mode: turn counters (batch, heads, T_r)", "int*", 0),
    Field("dq", "ptr", "dQ, Q's shape (its own strides)", "elem_t*"),
    Field("dk", "ptr", "dK: input dtype, or float32 slices (head_parts > 1)", "void*"),
    Field("dv", "ptr", "dV, as dK", "void*"),
    *_QKVO_STRIDES,
    _strides("do", "dO"), _strides("dq", "dQ"), _strides("dk", "dK and dV"),
    # (The int fields keep the order of the main kernel's former argument list: with the
    # seqlens at other offsets, the d 64 4/4/4 tile, at 255 registers, spilled 40 bytes.)
    Field("deterministic", "i32", "1: fixed-order dQ sums"),
    Field("nheads", "i32", "query heads"),
    Field("head_parts", "i32", "parts each kv head's group is split into (main kernel)"),
    *_SIZES,
    Field("splits", "i32", "dQ slices (deterministic mode with dQ atomics), else 1"),
    Field("dq_accum_cols", "i32", "row pitch of dq_accum (the head-dim bucket)"),
    Field("lanes", "i32", "preprocess: lanes per query row (a power of two >= d / 8)"),
    *_SCALES,
    *_WINDOW,
    *_HOOK,
    *_PACKED,  # (last: the int fields above keep their offsets, see the note above)
    # Packed batches' dQ workspace, compact: (heads, total_q, hd) rows with dQ atomics; with
    # bulk dQ, (heads, ws_blocks) row blocks of B_r rows, entry b's from row_block_offsets[b].
    Field("row_block_offsets", "ptr", "packed, bulk dQ: each entry's first row block in "
          "dQ_accum (batch + 1), int32", "const int*", 0),
    Field("ws_blocks", "i32", "packed, bulk dQ: row blocks per head in dQ_accum", "", 0),
])

# ---- the Hopper backward: fa2_backward_sm90 and its two passes ------------------------------
# The backward's fields behind four TMA tensor maps (cuflash/_tma.py): Q and dO in boxes of B_r
# rows, K and V of B_c. The preprocess and the dQ pass (backward_passes.cuh) take the same
# struct, so that one launch's three kernels share one parameter buffer.
SM90_BWD = Struct("Sm90BwdParams", "Hopper backward kernels (fa2_backward_sm90.cu).", [
    Field("tm_q", "tmap", "Q's tensor map, boxes of 64 columns x B_r rows"),
    Field("tm_k", "tmap", "K's tensor map, boxes of 64 columns x B_c rows"),
    Field("tm_v", "tmap", "V's tensor map, as K's"),
    Field("tm_do", "tmap", "dO's tensor map, as Q's"),
    *BWD.fields,
    Field("lse_log2", "ptr", "L log2(e) (batch, heads, seqlen_q rounded up to B_r), float32, "
          "+inf past the end of Q (preprocess with PAD; dsum is padded alike)", "float*"),
    Field("tail_whole", "i32", "the tiles not split (dense, no mask: the 1-d grid's first "
          "blocks, a tile each)"),
    Field("tail_parts", "i32", "split tail: parts of each tile from tail_whole on (1: none)"),
    Field("tail_acc", "ptr", "split tail: the split tiles' dK, dV sums, float32, zero between "
          "launches", "float*", 0),
    Field("tail_flags", "ptr", "split tail: per split tile and consumer warp, parts in, int32, "
          "zero between launches", "int*", 0),
])

# ---- KV-cache decoding: fa2_decode, fa2_decode_combine, fa2_decode_append ---------------------
DECODE = Struct("DecodeParams", "KV-cache decoding kernels (fa2_decode.cu).", [
    Field("q", "ptr", "Q (batch, seqlen_q, heads, d)", "const elem_t*"),
    Field("k", "ptr", "K cache: (batch, capacity, heads_k, d), or paged (num_pages, "
          "page_size, heads_k, d); the append writes into it", "elem_t*"),
    Field("v", "ptr", "V cache, as K", "elem_t*"),
    Field("o", "ptr", "O, Q's shape (its own strides)", "elem_t*"),
    Field("lse", "ptr", "L (batch, heads, seqlen_q), float32, contiguous", "float*"),
    Field("o_partial", "ptr", "split-KV: O_s (splits, batch, heads, seqlen_q, d), float32",
          "float*", 0),
    Field("lse_partial", "ptr", "split-KV: L_s (splits, batch, heads, seqlen_q), float32",
          "float*", 0),
    Field("k_new", "ptr", "append: new keys (batch, seqlen_new, heads_k, d)", "const elem_t*",
          0),
    Field("v_new", "ptr", "append: new values, as k_new", "const elem_t*", 0),
    Field("cache_seqlens", "ptr", "keys already in each entry's cache (batch,), int32",
          "const int*"),
    Field("block_table", "ptr", "paged: pages of each entry (batch, pages per entry), int32; "
          "null: contiguous", "const int*", 0),
    _strides("q", "Q"), _strides("k", "the K cache (b: batch, or page when paged)"),
    _strides("v", "the V cache, as K's"), _strides("o", "O"),
    _strides("kn", "k_new"), _strides("vn", "v_new"),
    Field("seqlen_q", "i32", "query rows per batch entry"),
    Field("seqlen_new", "i32", "keys appended per entry (0: none)"),
    Field("d", "i32", "head dim (a multiple of 8, at most the kernel's bucket)"),
    Field("group", "i32", "query heads per kv head (head h reads kv head h / group)"),
    Field("pack", "i32", "query heads packed into one tile's rows: group, or 1 (ALiBi)"),
    Field("row_tiles", "i32", "tiles of 16 packed rows per group of pack heads"),
    Field("nheads", "i32", "query heads"),
    Field("batch", "i32", "batch entries"),
    Field("num_splits", "i32", "splits of each entry's key range (1: no partials)"),
    Field("page_size", "i32", "paged: keys per page", "", 0),
    Field("block_table_stride", "i32", "paged: the block table's row stride", "", 0),
    *_SCALES,
    *_WINDOW,
    *_HOOK,
])

STRUCTS = (FWD, BWD, SM90_FWD, SM90_BWD, DECODE)
HEADER = "params.cuh"


def header_text() -> str:
    parts = ["// params.cuh: the kernels' parameter structs, one per kernel family.",
             "//",
             "// Generated from cuflash/_params.py (which also packs them on the host) by",
             "// `python -m cuflash.compile_check --write-params`: edit that file, not this one.",
             "#pragma once",
             "",
             "namespace cuflash {",
             ""]
    for s in STRUCTS:
        parts += [s.header(), ""]
    parts.append("}  // namespace cuflash")
    return "\n".join(parts) + "\n"
