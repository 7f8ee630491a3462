"""Launch planner: the tile configurations (one dataclass per kernel family, mirroring the
kernels' Tile traits), the one tile table, the kernels' name expressions, and the list of every
specialisation the package can launch (from the variant registry, cuflash/_registry.py; the
CPU compile check builds all of them)."""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

# Head dims are rounded up to one of these compiled buckets; the real d is zero-padded inside
# shared memory, never in HBM (d % 8 != 0: by the OddD tiles' element-wise loads).
HEAD_DIM_BUCKETS = (32, 64, 96, 128, 160, 192, 224, 256)
MAX_HEAD_DIM = HEAD_DIM_BUCKETS[-1]

# numpy dtype name -> C++ element tag (kernels/common.cuh)
ELEMENT_TAGS = {"float16": "cuflash::fp16", "bfloat16": "cuflash::bf16"}


def _bucket(d: int, buckets) -> int:
    for bucket in buckets:
        if d <= bucket:
            return bucket
    raise ValueError(f"head dim {d} > {MAX_HEAD_DIM} is not supported")


def head_dim_bucket(d: int) -> int:
    """The compiled forward head-dim bucket for head dim d."""
    return _bucket(d, HEAD_DIM_BUCKETS)


def _odd_d_type(odd_d: bool, tile: str) -> str:
    """A tile type, wrapped in OddD (element-wise loads and stores) for head dims that are not
    a multiple of 8."""
    return f"cuflash::OddD<{tile}>" if odd_d else tile


@dataclass(frozen=True)
class ForwardConfig:
    """Tile shape of the FA2 forward kernel (kernels/fa2_forward.cu, ForwardTile)."""

    HD: int      # head-dim bucket
    B_r: int     # rows of Q per thread block
    B_c: int     # rows of K/V per column block
    nwarps: int  # warps per thread block; each owns B_r / nwarps rows of Q
    kv_stages: int = 1  # shared-memory buffers for K_j, V_j (2: the next pair loads during a step)
    odd_d: bool = False  # head dims that are not a multiple of 8 (OddD<Tile>, common.cuh)

    @property
    def threads(self) -> int:
        return 32 * self.nwarps

    @property
    def smem_bytes(self) -> int:
        # Q_i (B_r x HD) + kv_stages x (K_j, V_j) (B_c x HD each), 2 bytes per element.
        return 2 * (self.B_r + 2 * self.kv_stages * self.B_c) * self.HD

    # The register workarounds of the kernel body (ForwardTile, where each is explained; the
    # compile check asserts that these agree with it).
    @property
    def rebuild(self) -> bool:
        """32 rows per warp: readers and K/V pointers rebuilt where used."""
        return self.B_r // self.nwarps // 16 > 1

    @property
    def lean(self) -> bool:
        """O~ and S accumulators take 192 registers or more: row sums and loop bounds leave
        the registers, lazy rescaling."""
        mt = self.B_r // self.nwarps // 16
        return mt * (self.HD // 8 + self.B_c // 8) * 4 >= 192

    @property
    def tile_type(self) -> str:
        return _odd_d_type(self.odd_d, f"cuflash::ForwardTile<{self.HD}, {self.B_r}, "
                                       f"{self.B_c}, {self.nwarps}, {self.kv_stages}>")

    def tile_asserts(self) -> list[str]:
        return [f"{self.tile_type}::SMEM_BYTES == {self.smem_bytes}",
                f"{self.tile_type}::LEAN == {str(self.lean).lower()}",
                f"{self.tile_type}::REBUILD == {str(self.rebuild).lower()}"]


def score_type(hooked: bool, packed: bool = False) -> str:
    """The forward kernels' trailing template arguments: the score hook (kernels/score.cuh),
    none for ScoreScale (the default), ", cuflash::ScoreHook" for softcap and ALiBi; then, for
    a variable-length batch (packed), the layout (kernels/seqinfo.cuh), ", cuflash::PackedSeq"
    (DenseSeq, the default, is left out)."""
    if packed:
        return f", cuflash::{'ScoreHook' if hooked else 'ScoreScale'}, cuflash::PackedSeq"
    return ", cuflash::ScoreHook" if hooked else ""


def mask_type(causal: bool, local: bool = False) -> str:
    """The kernels' Mask (kernels/mask.cuh): which keys each query row sees. causal: an upper
    limit (the causal diagonal, or a window's right side); local: a lower limit (a window's
    left side; the sides come from the parameters)."""
    return f"cuflash::Mask<{'true' if causal else 'false'}{', true' if local else ''}>"


def forward_kernel_name(dtype_name: str, cfg: ForwardConfig, causal: bool,
                        local: bool = False, hooked: bool = False, packed: bool = False) -> str:
    return (f"cuflash::fa2_forward<{ELEMENT_TAGS[dtype_name]}, {cfg.tile_type}, "
            f"{mask_type(causal, local)}{score_type(hooked, packed)}>")


FORWARD_FILE = "fa2_forward.cu"
BACKWARD_FILE = "fa2_backward.cu"
FA1_FILE = "fa1_forward.cu"

# ---- FlashAttention-1 forward ------------------------------------------------------------------
# Shared memory per block of the GPU classes cuflash plans for (sm_86/89/120, sm_80, sm_90).
SMEM_CLASSES = (99 * 1024, 163 * 1024, 227 * 1024)


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


@dataclass(frozen=True)
class FA1Config:
    """Block sizes of the FA1 forward, from the seed: B_c = ceil(M / 4d), B_r = min(B_c, d),
    with M the 16-bit elements a thread block may keep on chip; then rounded down to a power
    of two in [16, 128] (tensor-core tiles; B_c capped where S would spill registers)."""
    HD: int
    B_r: int
    B_c: int
    M: int         # on-chip elements (shared memory bytes / 2)
    B_c_seed: int  # ceil(M / 4d)
    B_r_seed: int  # min(B_c_seed, d)

    @property
    def threads(self) -> int:
        return 32 * (self.B_r // 16)

    @property
    def smem_bytes(self) -> int:
        return 2 * (self.B_r + 2 * self.B_c) * self.HD  # Q_i, K_j, V_j

    @property
    def tile_type(self) -> str:
        return f"cuflash::Fa1Tile<{self.HD}, {self.B_r}, {self.B_c}>"

    def tile_asserts(self) -> list[str]:
        return [f"{self.tile_type}::SMEM_BYTES == {self.smem_bytes}",
                f"{self.tile_type}::NTHREADS == {self.threads}"]

    def describe(self, seqlen_q: int, seqlen_k: int) -> str:
        T_r, T_c = -(-seqlen_q // self.B_r), -(-seqlen_k // self.B_c)
        return (f"FA1 plan: M = {self.M} elements on chip; B_c = ceil(M / 4d) = "
                f"{self.B_c_seed} -> {self.B_c}, B_r = min(B_c, d) = {self.B_r_seed} -> "
                f"{self.B_r} (d = head-dim bucket {self.HD}; rounded to tensor-core tiles); "
                f"T_r = {T_r} row blocks, "
                f"T_c = {T_c} column blocks; {self.threads} threads, {self.smem_bytes} bytes "
                "of shared memory per (batch, head)")


# Largest B_c whose S tile (B_c / 2 registers per thread) fits beside P~V (HD / 2 registers)
# without spills, where that is below 128 (compile check, PERFORMANCE.md).
_FA1_MAX_B_C = {192: 64, 224: 32, 256: 64}


def fa1_config(HD: int, max_smem_bytes: int = 227 * 1024) -> FA1Config:
    M = max_smem_bytes // 2
    B_c_seed = -(-M // (4 * HD))                         # B_c = ceil(M / 4d)
    B_r_seed = min(B_c_seed, HD)                         # B_r = min(B_c, d)
    B_c = min(_FA1_MAX_B_C.get(HD, 128), max(16, _pow2_floor(B_c_seed)))
    while 2 * (min(B_c, HD) + 2 * B_c) * HD > max_smem_bytes and B_c > 16:
        B_c //= 2
    B_r = max(16, _pow2_floor(min(B_c, HD)))             # B_r = min(B_c, d), on tiles
    return FA1Config(HD, B_r, B_c, M, B_c_seed, B_r_seed)


def fa1_kernel_name(dtype_name: str, cfg: FA1Config, causal: bool) -> str:
    return (f"cuflash::fa1_forward<{ELEMENT_TAGS[dtype_name]}, {cfg.tile_type}, "
            f"{mask_type(causal)}>")


def fa1_finalize_name(dtype_name: str) -> str:
    return f"cuflash::fa1_finalize<{ELEMENT_TAGS[dtype_name]}>"

# ---- backward ----------------------------------------------------------------------------
# d = 96, 160, 224 run their own kernels: a layout that splits such a head dim across warps
# lays the K, V, Q, dO tiles out with the next multiple of 64 as row pitch (BackwardConfig.pitch)
# and computes over HD columns only.
BACKWARD_HEAD_DIM_BUCKETS = HEAD_DIM_BUCKETS


def backward_head_dim_bucket(d: int) -> int:
    """The compiled backward head-dim bucket for head dim d."""
    return _bucket(d, BACKWARD_HEAD_DIM_BUCKETS)


@dataclass(frozen=True)
class BackwardConfig:
    """Tile shape of the FA2 backward kernel (kernels/fa2_backward.cu, BackwardTile)."""

    HD: int       # head-dim bucket
    B_r: int      # query rows per step
    B_c: int      # keys per thread block (column block)
    nwarps: int
    wm_sdp: int   # warps along the query rows of S, dP (the rest along the keys)
    wm_dkv: int   # warps along the keys of dK, dV (the rest along the head dim)
    wm_dq: int    # warps along the query rows of dQ (the rest along the head dim)
    qstages: int  # shared-memory buffers for Q_i, dO_i, L_i, D_i (2: the next row block loads
                  # while this one is computed)
    dq_bulk: int = 0  # dQ added into dQ_accum by per-thread float atomics (0), or by one bulk
                      # reduction per step from 1 or 2 shared-memory tiles (sm_90+)
    odd_d: bool = False  # head dims that are not a multiple of 8 (OddD<Tile>, common.cuh)
    dq_vec = 1  # n8 tiles per thread of the dQ pass (BackwardTile::DQ_VEC)

    @property
    def threads(self) -> int:
        return 32 * self.nwarps

    @property
    def pitch(self) -> int:
        """Row length (elements) of the K, V, Q, dO tiles in shared memory: HD, or the next
        multiple of 64 where the layout splits the head dim across warps
        (BackwardTile::PITCH)."""
        split = self.nwarps != self.wm_dkv or self.nwarps != self.wm_dq
        return -(-self.HD // 64) * 64 if split else self.HD

    @property
    def smem_bytes(self) -> int:
        kv = 2 * self.B_c * self.pitch * 2                       # K_j, V_j
        rows = self.qstages * (2 * self.B_r * self.pitch * 2     # Q_i, dO_i
                               + 2 * self.B_r * 4)               # L_i, D_i
        p = 2 * self.B_r * self.B_c * 2                          # P_ij, dS_ij
        dq = self.dq_bulk * self.B_r * self.HD * 4               # dQ_ij tiles, float32
        return kv + rows + p + dq

    # The register workarounds of the kernel body (BackwardTile, where each is explained; the
    # compile check asserts that these agree with it).
    @property
    def rebuild(self) -> bool:
        """Readers rebuilt per product phase from an opaque lane index."""
        return self.HD > 128

    @property
    def opaque_rows(self) -> bool:
        """Row-block indices and range from opaque copies (d 64, layout 4/4/4)."""
        return self.HD == 64 and self.wm_sdp == 4

    @property
    def tile_type(self) -> str:
        return _odd_d_type(self.odd_d, f"cuflash::BackwardTile<{self.HD}, {self.B_r}, "
                                       f"{self.B_c}, {self.nwarps}, {self.wm_sdp}, "
                                       f"{self.wm_dkv}, {self.wm_dq}, {self.qstages}, "
                                       f"{self.dq_bulk}>")

    def tile_asserts(self) -> list[str]:
        t = self.tile_type
        return [f"{t}::SMEM_BYTES == {self.smem_bytes}", f"{t}::PITCH == {self.pitch}",
                f"{t}::REBUILD == {str(self.rebuild).lower()}",
                f"{t}::OPAQUE_ROWS == {str(self.opaque_rows).lower()}",
                f"{t}::DQ_VEC == {self.dq_vec}"]


def has_bulk_copy(compute_capability: int) -> bool:
    """cp.reduce.async.bulk (the backward's dQ_bulk path) exists from sm_90 on."""
    return compute_capability >= 90


# ---- the tile table ---------------------------------------------------------------------------
# One table: (GPU class, pass, head-dim bucket, causal) -> tiles in order of preference; the
# first whose shared memory fits the GPU is used.
#   GPU classes: "sm90": 227 KB of shared memory per block (H100/H200; bulk copies: the
#     backward adds dQ by bulk reductions); "sm80": every other sm_80+ GPU (163 KB on A100,
#     99 KB on sm_86/89/120; dQ by atomics). The compile check builds each class's tiles as
#     sm_90 and sm_80 code respectively (ARCH_SMEM). "sm90a": the Hopper forward's tiles
#     (Sm90ForwardConfig; the H100/H200 run them where TMA can describe q, k and v, and the
#     "sm90" row otherwise), built as sm_90a code.
#   passes: "fwd"; "fwd_feat", "bwd_feat": kernels with a sliding window or the score hook
#     (the forward's: or over a variable-length batch; the Hopper forward's: a window, or the
#     hook over a variable-length batch, the hook alone taking the plain tiles), where listed;
#     "fwd_packed": the forward over a variable-length batch, where listed; "bwd_hook": the
#     backward with the score hook; "fwd_short", key sequences of at most SHORT_KEYS[HD]
#     keys (non-causal, causal), where listed (class sm90a: SM90_SHORT_KEYS); "bwd".
# Each tile is spill-free where it is planned (the compile check enforces it) and was the
# fastest spill-free shape measured on the H200 (the feat and hook rows: not measured yet);
# PERFORMANCE.md has the measurements behind each choice. Some notes on them:
#   fwd sm90 d 128 non-causal, 128x64x4 with two K/V stages (32 rows per warp, as
#     FlashAttention-2's d 128 forward): spill-free as sm_90 (ForwardTile::LEAN), but ptxas
#     spills it as sm_80; causal: 64x128x4 measured faster. d 96: 64x128x4 with two stages
#     (108 KB: one block per SM on 163 KB GPUs, so only on sm90): +2-6% at 4k-16k.
#   fwd_short d 64: two K/V stages for short key sequences, where a row block visits few column
#     blocks and prefetching the next pair hides more of each block's start: non-causal +1-5%
#     at 512, +1-1.6% at 1024, slower from 2048; causal +4-7% at 512-1024, +2% at 2048.
#   bwd sm90: bulk dQ with one or two tiles; d 64 in layout 4/4/4 (four warps along the rows
#     of S and dP, as FlashAttention-2 has it) with one dQ tile; d 160 and 224 run the 192 and
#     256 kernels (their own were slower or spilled); d 256 with one row-block buffer, loaded
#     during the dQ product, which is what lets the bulk path fit without spilling. Then the
#     atomics tiles, for GPUs whose shared memory fits no bulk tile.
SM90_SMEM = 227 * 1024


# The Hopper forward's tile (kernels/fa2_forward_sm90.cu, sm_90a; its rows of the table are
# class "sm90a").
SM90_HEAD_DIM_BUCKETS = (64, 128, 192, 256)  # the head dim padded to whole 64-column TMA boxes


@dataclass(frozen=True)
class Sm90ForwardConfig:
    """Tile shape of the Hopper forward (ForwardTileSm90): B_r = 64 x `consumers` query rows
    (consumer warpgroups of 64 rows: two, or three at small head dims), B_c keys per column
    block, `stages` K/V slots; 128 threads per warpgroup, with the producer's."""

    HD: int
    B_c: int
    stages: int
    overlap: bool = False  # S of block j + 1 on the tensor cores during the softmax of block j
    pingpong: bool = False  # the consumers take turns on the tensor cores
    lazy: bool = False  # softmax: O~ rescaled only when m_i grows by more than 2^8 in P~
    poly: int = 0  # softmax: the exponentials of every poly-th n8 tile on the FMA pipe
    consumers: int = 2  # consumer warpgroups
    # ping-pong's turns run on across tiles (the last consumer hands consumer 0 the next
    # tile's first turn once its last P~V is issued); False: they start afresh per tile
    handover: bool = True

    @property
    def B_r(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    # Q_i's TMA box rows: one consumer's 64 (each consumer's rows load on their own)
    q_box_rows = 64

    @property
    def tile_type(self) -> str:
        return (f"cuflash::ForwardTileSm90<{self.HD}, {self.B_c}, {self.stages}, "
                f"{str(self.overlap).lower()}, {str(self.pingpong).lower()}, "
                f"{str(self.lazy).lower()}, {self.poly}, {self.consumers}, "
                f"{str(self.handover).lower()}>")

    @functools.cached_property  # (read at every launch)
    def smem_bytes(self) -> int:
        # 1024 (alignment) + Q_i + stages x (K_j, V_j) + mbarriers + the packed batches' tile
        # ring (ForwardTileSm90::SMEM_BYTES)
        return 1024 + 2 * self.B_r * self.HD + 2 * self.stages * 2 * self.B_c * self.HD \
            + 8 * (2 * self.consumers + 4 * self.stages) + 4 * (16 + 2 * 8)

    def tile_asserts(self) -> list[str]:
        return [f"{self.tile_type}::SMEM_BYTES == {self.smem_bytes}"]


@dataclass(frozen=True)
class Sm90BackwardConfig:
    """Tile shape of the Hopper backward (BackwardTileSm90, kernels/fa2_backward_sm90.cu): two
    consumer warpgroups of 64 keys (B_c = 128), B_r = 64 query rows per step, `stages` slots
    for Q_i and dO_i; 384 threads with the producer's. dQ by bulk reductions, in the fragment
    order that fa2_backward_dq_bulk reads (dq_bulk, as BackwardConfig's)."""

    HD: int
    stages: int = 2

    B_r = 64
    B_c = 128
    dq_bulk = 1
    dq_vec = 4  # n8 tiles per thread of the dQ pass (BackwardTileSm90::DQ_VEC)
    threads = 384

    @property
    def tile_type(self) -> str:
        return f"cuflash::BackwardTileSm90<{self.HD}, {self.stages}>"

    @functools.cached_property  # (read at every launch)
    def smem_bytes(self) -> int:
        # 1024 (alignment) + K_j, V_j + stages x (Q_i, dO_i) + two buffers of both consumers'
        # dS^T + one float32 dQ group tile per consumer + stages x (L_i, D_i) + mbarriers (the
        # ring's, and full / empty of each consumer's dQ tile), the deterministic mode's ticket
        # and the consumers' dQ mailboxes (BackwardTileSm90::SMEM_BYTES)
        return (1024 + 2 * 2 * self.B_c * self.HD + 2 * self.stages * 2 * self.B_r * self.HD
                + 2 * 2 * 64 * self.B_r * 2 + 2 * self.B_r * 64 * 4
                + 2 * self.stages * self.B_r * 4 + 8 * (2 + 2 * self.stages + 2 * 2) + 16 * 2)

    def tile_asserts(self) -> list[str]:
        return [f"{self.tile_type}::SMEM_BYTES == {self.smem_bytes}",
                f"{self.tile_type}::DQ_VEC == {self.dq_vec}"]


@dataclass(frozen=True)
class DecodeConfig:
    """Tile shape of the KV-cache decode (kernels/fa2_decode.cu, DecodeTile): 16 packed query
    rows, B_c keys per column block, `nwarps` warps taking the split's column blocks in turn,
    each with `stages` K/V buffers."""

    HD: int
    B_c: int
    nwarps: int
    stages: int

    B_r = 16  # packed query rows per tile

    @property
    def threads(self) -> int:
        return 32 * self.nwarps

    @property
    def tile_type(self) -> str:
        return f"cuflash::DecodeTile<{self.HD}, {self.B_c}, {self.nwarps}, {self.stages}>"

    @functools.cached_property  # (read at every launch)
    def smem_bytes(self) -> int:
        # Q (16 x HD) + the larger of the warps' K/V rings and their combine (DecodeTile)
        kv = 2 * self.nwarps * self.stages * 2 * self.B_c * self.HD
        # (the combine: O~_w rows of HD + 8 floats, m_w, l_w, two int64 offsets per row)
        combine = 4 * self.nwarps * self.B_r * (self.HD + 10) + 16 * self.B_r
        return 2 * self.B_r * self.HD + max(kv, combine)

    def tile_asserts(self) -> list[str]:
        return [f"{self.tile_type}::SMEM_BYTES == {self.smem_bytes}"]

    def blocks_per_sm(self, max_smem_bytes: int) -> int:
        """Thread blocks of this tile one SM holds: by shared memory (an SM has the per-block
        limit plus the 1 KB reserved per block, on sm_80 to sm_90) and by registers at the
        most ptxas may give a thread under __launch_bounds__(threads, 1) (255, allocated as
        256, of 65536)."""
        by_smem = (max_smem_bytes + 1024) // (self.smem_bytes + 1024)
        return max(1, min(by_smem, 65536 // (self.threads * 256)))


DECODE_FILE = "fa2_decode.cu"

# A decode launch that fills the GPU without splitting (one thread block per SM on 80% of the
# SMs or more, each over a long cache) keeps HBM busy with fewer bytes in flight per SM than
# the split launches of small batches need; there one K/V buffer less per warp measured 1-4%
# faster (H200, bf16, 32/8 heads, d 128, session 10's decode_b16_tiles.log and
# decode_16x8x2_ab.log: batch 16 x 32k and 128k, batch 64 x 8k and 128k; batch 1 was 4-10%
# slower with it, batch 16 and 64 x 1k 1-5% slower). By the table's tile it replaces, where
# measured.
DECODE_STREAM = {DecodeConfig(128, 16, 8, 3): DecodeConfig(128, 16, 8, 2)}
DECODE_STREAM_MIN_KEYS = 8192  # (the longest cache of the launch)


def decode_config(HD: int, max_smem_bytes: int) -> DecodeConfig:
    """The decode tile for head-dim bucket HD on a GPU with max_smem_bytes of shared memory per
    block: the first of TILES["decode"] that fits (the most bytes in flight per SM first)."""
    return _first_fitting(("any", "decode", HD, False), max_smem_bytes)


def decode_stream_tile(cfg: DecodeConfig, max_smem_bytes: int | None = None):
    """DECODE_STREAM's replacement for the table's tile cfg, where it has one that fits
    max_smem_bytes (None: any size); else None."""
    stream = DECODE_STREAM.get(cfg)
    fits = stream is not None and (max_smem_bytes is None or stream.smem_bytes <= max_smem_bytes)
    return stream if fits else None


def decode_stream_config(cfg: DecodeConfig, tiles: int, num_splits: int, seqlen_k: int,
                         sms: int, paged: bool = False,
                         max_smem_bytes: int | None = None) -> DecodeConfig:
    """The tile for a launch of `tiles` thread blocks per split (batch x KV heads x row
    tiles) in num_splits splits over caches of up to seqlen_k keys, on a GPU of `sms` SMs,
    where the table gives cfg: decode_stream_tile's where one split's blocks fill 80% of the
    SMs and the caches are long and contiguous, else cfg. (Paged caches keep the table's: with
    pages of 16 the streaming tile measured 0.6-1% slower at batch 16 x 128k and batch 64 x
    8k and 128k, decode_16x8x2_ab.log.)"""
    if num_splits == 1 and tiles >= 0.8 * sms and seqlen_k >= DECODE_STREAM_MIN_KEYS and \
            not paged:
        return decode_stream_tile(cfg, max_smem_bytes) or cfg
    return cfg


def decode_kernel_names(dtype_name: str, cfg: DecodeConfig, causal: bool, local: bool = False,
                        hooked: bool = False) -> dict:
    """The decode's kernels by role: the split attention, the splits' combine, the append."""
    tag = ELEMENT_TAGS[dtype_name]
    return {"main": f"cuflash::fa2_decode<{tag}, {cfg.tile_type}, {mask_type(causal, local)}"
                    f"{score_type(hooked)}>",
            "combine": f"cuflash::fa2_decode_combine<{tag}>",
            "append": f"cuflash::fa2_decode_append<{tag}>"}


def _f(HD, *shape):
    return ForwardConfig(HD, *shape)


def _b(HD, *shape):
    return BackwardConfig(HD, *shape)


def _table() -> dict:
    t = {}

    def put(cls, pass_, HD, causal, tiles):
        for c in (False, True) if causal is None else (causal,):
            t[(cls, pass_, HD, c)] = tiles

    # forward: (B_r, B_c, warps, K/V stages)
    for cls in ("sm80", "sm90"):
        put(cls, "fwd", 32, None, [_f(32, 128, 64, 4, 2)])
        put(cls, "fwd", 64, None, [_f(64, 128, 64, 4, 1)])
        put(cls, "fwd_short", 64, None, [_f(64, 128, 64, 4, 2), _f(64, 128, 64, 4, 1)])
        put(cls, "fwd", 160, None, [_f(160, 128, 64, 8, 1)])
        put(cls, "fwd", 192, None, [_f(192, 128, 64, 8, 1)])
        put(cls, "fwd", 224, None, [_f(224, 128, 32, 8, 1)])
        put(cls, "fwd", 256, None, [_f(256, 64, 64, 4, 1)])
    put("sm80", "fwd", 96, None, [_f(96, 128, 64, 4, 2)])
    put("sm90", "fwd", 96, None, [_f(96, 64, 128, 4, 2), _f(96, 128, 64, 4, 2)])
    put("sm80", "fwd", 128, None, [_f(128, 64, 128, 4, 1)])
    put("sm90", "fwd", 128, False, [_f(128, 128, 64, 4, 2), _f(128, 64, 128, 4, 1)])
    put("sm90", "fwd", 128, True, [_f(128, 64, 128, 4, 1)])
    # fwd_feat, bwd_feat: the kernels with a sliding window (Mask<*, LOCAL = true>) or the
    # score hook (softcap, ALiBi), where the usual tile spills with them (the other buckets
    # take their usual tiles). Chosen for zero spills, not yet for speed.
    for cls in ("sm80", "sm90"):
        put(cls, "fwd_feat", 32, None, [_f(32, 64, 64, 4, 1)])
        put(cls, "fwd_feat", 96, None, [_f(96, 64, 128, 4, 2), _f(96, 64, 128, 4, 1)])
        put(cls, "fwd_feat", 128, None, [_f(128, 64, 128, 4, 1)])
    # fwd_packed: over a variable-length batch (seqinfo.cuh's PackedSeq), whose entry lengths
    # and offsets take registers of their own, where the usual or the feat tile spilled with
    # it: 16 rows per warp (32 at d 64), B_c 32 at d 64 and from d 192. Chosen for zero
    # spills, not yet measured.
    for cls in ("sm80", "sm90"):
        put(cls, "fwd_packed", 64, None, [_f(64, 128, 32, 4, 1)])
        put(cls, "fwd_packed", 128, None, [_f(128, 64, 64, 4, 1)])
        put(cls, "fwd_packed", 192, None, [_f(192, 64, 32, 4, 1)])
        put(cls, "fwd_packed", 224, None, [_f(224, 64, 32, 4, 1)])
        put(cls, "fwd_packed", 256, None, [_f(256, 64, 32, 4, 1)])

    # backward: (B_r, B_c, warps, WM_SDP, WM_DKV, WM_DQ, row-block buffers, dQ tiles; 0 =
    # atomics); the head-dim bucket of the kernel first
    atomics = {
        32: [_b(32, 128, 128, 8, 4, 8, 8, 2, 0), _b(32, 128, 128, 8, 4, 8, 8, 1, 0)],
        64: [_b(64, 128, 128, 8, 2, 4, 4, 2, 0), _b(64, 128, 128, 8, 2, 4, 4, 1, 0),
             _b(64, 64, 128, 8, 2, 4, 2, 1, 0)],
        96: [_b(96, 64, 128, 8, 4, 4, 4, 2, 0), _b(96, 64, 128, 8, 4, 4, 4, 1, 0),
             _b(96, 64, 64, 8, 4, 4, 4, 1, 0)],
        128: [_b(128, 64, 128, 8, 2, 4, 2, 2, 0), _b(128, 64, 128, 8, 2, 4, 2, 1, 0),
              _b(128, 64, 64, 8, 4, 2, 2, 1, 0)],
        160: [_b(160, 64, 64, 8, 4, 4, 4, 2, 0), _b(160, 64, 64, 8, 4, 4, 4, 1, 0)],
        192: [_b(192, 64, 64, 8, 4, 2, 2, 2, 0)],
        224: [_b(224, 64, 64, 8, 4, 4, 4, 2, 0), _b(224, 64, 64, 8, 4, 4, 4, 1, 0)],
        256: [_b(256, 64, 64, 8, 2, 2, 2, 2, 0), _b(256, 64, 64, 8, 2, 2, 2, 1, 0)],
    }
    bulk = {
        32: [_b(32, 128, 128, 8, 4, 8, 8, 2, 2), _b(32, 128, 128, 8, 4, 8, 8, 2, 1),
             _b(32, 128, 128, 8, 4, 8, 8, 1, 2), _b(32, 128, 128, 8, 4, 8, 8, 1, 1)],
        64: [_b(64, 128, 128, 8, 4, 4, 4, 2, 1),
             _b(64, 128, 128, 8, 2, 4, 4, 2, 2), _b(64, 128, 128, 8, 2, 4, 4, 2, 1),
             _b(64, 128, 128, 8, 2, 4, 4, 1, 2), _b(64, 128, 128, 8, 2, 4, 4, 1, 1),
             _b(64, 64, 128, 8, 2, 4, 2, 1, 2), _b(64, 64, 128, 8, 2, 4, 2, 1, 1)],
        96: [_b(96, 64, 128, 8, 4, 4, 4, 2, 2), _b(96, 64, 128, 8, 4, 4, 4, 2, 1),
             _b(96, 64, 128, 8, 4, 4, 4, 1, 2), _b(96, 64, 128, 8, 4, 4, 4, 1, 1),
             _b(96, 64, 64, 8, 4, 4, 4, 1, 2), _b(96, 64, 64, 8, 4, 4, 4, 1, 1)],
        128: [_b(128, 64, 128, 8, 2, 4, 2, 2, 2), _b(128, 64, 128, 8, 2, 4, 2, 2, 1),
              _b(128, 64, 128, 8, 2, 4, 2, 1, 2), _b(128, 64, 128, 8, 2, 4, 2, 1, 1),
              _b(128, 64, 64, 8, 4, 2, 2, 1, 2), _b(128, 64, 64, 8, 4, 2, 2, 1, 1)],
        160: [_b(192, 64, 64, 8, 4, 2, 2, 1, 1)],
        192: [_b(192, 64, 64, 8, 4, 2, 2, 1, 1)],
        224: [_b(256, 64, 64, 8, 4, 2, 2, 1, 1)],
        256: [_b(256, 64, 64, 8, 4, 2, 2, 1, 1)],
    }
    for HD in HEAD_DIM_BUCKETS:
        put("sm80", "bwd", HD, None, atomics[HD])
        put("sm90", "bwd", HD, None, bulk[HD] + atomics[HD])
    put("sm90", "bwd_feat", 64, None, bulk[64][1:] + atomics[64])
    # bwd_hook: the backward with the score hook (softcap, ALiBi; with or without a window),
    # where the usual tile spills with it: the first spill-free shape of the usual list, or a
    # smaller one (single row-block buffer, B_c 64). Chosen for zero spills, not yet for speed.
    put("sm80", "bwd_hook", 32, None, [_b(32, 64, 128, 8, 4, 4, 4, 1, 0)])
    put("sm80", "bwd_hook", 64, None, [_b(64, 64, 64, 8, 4, 2, 2, 1, 0)])
    put("sm80", "bwd_hook", 96, None, [_b(96, 64, 64, 8, 4, 4, 4, 1, 0)])
    put("sm90", "bwd_hook", 32, None, [_b(32, 64, 128, 8, 4, 4, 4, 1, dq) for dq in (2, 1, 0)])
    # (d 64, sm90: 64x128 with 4/4/4 warps, measured with the hook against 64x64 and four
    # 128x64 layouts (issue 19, third round, n 2k and 8k): 1.24-1.33x faster than 64x64,
    # 1.00-1.06x than the best 128x64)
    put("sm90", "bwd_hook", 64, None, [_b(64, 64, 128, 8, 4, 4, 4, 1, dq) for dq in (1, 2)])
    put("sm90", "bwd_hook", 96, None, [_b(96, 64, 64, 8, 4, 4, 4, 1, dq) for dq in (2, 1, 0)])
    # bwd_packed, bwd_packed_hook: over a variable-length batch (PackedSeq: the entry's lengths
    # and offsets take registers of their own), where the usual tile spills: d 64's 4/4/4
    # layout (24-56 bytes; sm_80 class: 2/4/4, 8-24) and, with the hook, d 128's 64x128 (4-12
    # bytes). Chosen for zero spills, not yet measured.
    put("sm90", "bwd_packed", 64, None, bulk[64][1:] + atomics[64])
    put("sm90", "bwd_packed_hook", 128, None, bulk[128][4:] + atomics[128][2:])
    # (d 64: bwd_hook's 64x128 spills there, fp16 causal with a window: the 64x64 it replaced)
    put("sm90", "bwd_packed_hook", 64, None, [_b(64, 64, 64, 8, 4, 2, 2, 1, dq) for dq in (2, 1)])
    put("sm80", "bwd_packed", 64, None, atomics[64][2:])
    put("sm80", "bwd_packed_hook", 128, None, atomics[128][2:])

    # decode (kernels/fa2_decode.cu; every class, the first that fits): four warps, as many
    # keys per column block and K/V buffers per warp as fit, so that many bytes of K and V are
    # in flight per SM (memory-bound). d 128: eight warps of 16-key blocks first, from the
    # H200 sweeps of 2026-12-01 (bench/results/session6/b1_sweep*.log, 32/8 heads, bf16): at
    # each tile's best split 0.5-3% faster than 32x4x3 at batch 1 and 4 in the first sweep,
    # within 1% in the second; with one split at batch 1 x 1k 2-7% faster; within 1.5% at
    # batch 16 and 64 (decode_sweep.log). The other buckets: chosen to fit, not measured.
    # (kept: the first candidate that fits each shared-memory size the GPUs have, those of
    # ARCH_SMEM below: 227, 163 and 99 KB)
    for HD in HEAD_DIM_BUCKETS:
        candidates = [DecodeConfig(HD, B_c, w, st) for B_c, w, st in
                      ((16, 8, 3),) * (HD == 128)
                      + ((64, 4, 3), (32, 4, 3), (32, 4, 2), (16, 4, 2), (16, 2, 2))
                      if B_c * HD <= 8192]
        firsts = [next(c for c in candidates if c.smem_bytes <= smem)
                  for smem in (227 * 1024, 163 * 1024, 99 * 1024)]
        put("any", "decode", HD, False, list(dict.fromkeys(firsts)))

    # the Hopper forward (class sm90a: H100/H200, kernels/fa2_forward_sm90.cu), one tile per
    # bucket and mask, from the H200 sweep of 2026-11-30 (bf16, kernel timing,
    # PERFORMANCE.md): ping-pong with the widest B_c that fits 227 KB and 232 registers won at
    # d 128 (128x176: 615 against 579 TFLOP/s for 128x128 at n 16k) and d 256 (128x80: 714
    # against 662 at n 8k); at d 64 128x176x3 (non-causal) and 128x192x2 (causal) by 1-4%.
    # d 192 keeps 128x96 (not swept). The intra-warpgroup overlap (overlap=True) is off: the
    # d 128 forward measured 15% slower with it (512 against 599 TFLOP/s at n 4096; its second
    # S buffer also spills at d 192 and 256).
    # Third round (same sweep method, tiles in the pair-by-pair order): for short key
    # sequences (SM90_SHORT_KEYS), where a tile visits few column blocks, B_c 128 (d 64, 128)
    # and 64 (d 256) waste less on the masked and the last, partial block: causal d 128 +24%
    # at n 512, +14% at 1024, +6% at 2048, +4% at 4096; causal d 64 (four stages) +16% / +13%
    # / +4% / +1%; non-causal d 64 +8% at 512, +1-2% to 4096; d 128 +1% at 512, slower from
    # 1024. Lazy rescaling of O~ (lazy=True) at d 128 and 256: d 128 n 16k +9% (non-causal),
    # +5% (causal); d 64: within noise, left off.
    # Fourth round: at d 64, three consumer warpgroups (B_r 192, consumers=3, 160 registers
    # each; at 152 ptxas serialized the wgmma of B_c 128) put two softmaxes under each one's
    # matmuls: non-causal +3% at n 512-1024, +11-14% from 2048; causal +3-5% from n 4096 and
    # slower below (more of a 192-row tile is masked).
    def _h(HD, B_c, stages, lazy=False, consumers=2, handover=True):
        return Sm90ForwardConfig(HD, B_c, stages, pingpong=True, lazy=lazy,
                                 consumers=consumers, handover=handover)

    put("sm90a", "fwd", 64, None, [_h(64, 128, 3, consumers=3)])
    put("sm90a", "fwd", 128, None, [_h(128, 176, 2, lazy=True)])
    put("sm90a", "fwd", 192, None, [_h(192, 96, 2)])
    put("sm90a", "fwd", 256, None, [_h(256, 80, 2, lazy=True)])
    put("sm90a", "fwd_short", 64, False, [_h(64, 128, 4, consumers=3)])
    put("sm90a", "fwd_short", 64, True, [_h(64, 128, 4)])
    put("sm90a", "fwd_short", 128, None, [_h(128, 128, 2)])
    put("sm90a", "fwd_short", 256, None, [_h(256, 64, 2)])
    # fwd_feat: two of a sliding window, the score hook and a variable-length batch. d 64
    # non-causal: the plain call's three-warpgroup tile at B_c 128 (session 30: every variant
    # compiles spill-free, the packed ones since their epilogue reloads the entry's offsets
    # through opaque(), fa2_forward_sm90.cu; from session 19 to 29 B_c 112, where B_c 128
    # spilled with a window and the hook, and in the packed kernels). A window alone over a
    # dense batch takes the plain call's tiles, the short one by the window's width
    # (sm90_window_short): the three-warpgroup B_c 128 tiles took 8-13% less time than the
    # two-warpgroup tile at widths of 2048-8192 keys (session 19). Causal keeps the
    # two-warpgroup short tile. (The issue-19 third round measured B_c 112 against that short
    # tile with the hook: non-causal 1.11-1.19x faster at n 2k and 8k, causal 0.90x at n 2k and
    # 1.04x at 8k.) The hook alone over a dense batch takes the plain call's tiles at every head
    # dim (sm90_forward_config): at d 64 the three-warpgroup B_c 128 tiles measured against B_c
    # 112 with the hook (session 19, score_hook_bench --configs, two rounds): non-causal 2-9%
    # less time at n 2k-16k; causal past the short keys 1-8% less with ALiBi, 0-1% more with the
    # softcap (where B_c 112 had measured 1.11x (softcap) and 1.07x (ALiBi) faster than the
    # two-warpgroup tile at n 8k, session 18).
    put("sm90a", "fwd_feat", 64, False, [_h(64, 128, 3, consumers=3)])
    put("sm90a", "fwd_feat", 64, True, [_h(64, 128, 4)])
    # fwd_local_hooked: a window and the hook in one kernel; d 128's 128x176 spills there
    # causal (4 bytes, the hook's two loop variants, score.cuh apply_fragment).
    put("sm90a", "fwd_local_hooked", 128, True, [_h(128, 128, 2, lazy=True)])
    # fwd_packed: over a variable-length batch. d 128: the dense call's 128x176 (session 30:
    # spill-free since the epilogue reloads the entry's offsets through opaque(); it had
    # spilled 4-8 bytes, so 128x128 ran). On varlen_bench's mix (16 heads, bf16, two rounds in
    # turns with 128x128): 672 TFLOP/s of real work against 579-639 non-causal, 552-566
    # against 504-562 causal.
    put("sm90a", "fwd_packed", 128, None, [_h(128, 176, 2, lazy=True)])
    # d 64: three consumers, B_c 128 (session 30, see fwd_feat above; the issue-19 third round
    # measured B_c 112 at 1.08x (non-causal) and 1.04x (causal) the two-consumer 128x128 on
    # varlen_bench's mix, B_c 96 at 1.05x).
    put("sm90a", "fwd_packed", 64, None, [_h(64, 128, 3, consumers=3)])
    # and with the tile scheduler's ring (the tiles taken in turn), d 256's 128x80 spills in the
    # consumers (60 bytes, causal): 128x64, the short-key tile, which the entries of a
    # variable-length batch mostly are. Its turns start afresh per tile (handover=False): with
    # the hand-over's barrier after the tile loop it spilled 40-56 bytes (non-causal, and
    # causal with a window and the hook), where main's kernel had none.
    put("sm90a", "fwd_packed", 256, None, [_h(256, 64, 2, handover=False)])

    # the Hopper backward (class sm90a, kernels/fa2_backward_sm90.cu): d <= 128 (the score
    # hook over a variable-length batch: d 64, sm90_backward_buckets; the rest: the "sm90" rows
    # above); the deterministic mode on the same tiles.
    # Two Q_i / dO_i slots (session 14: 0.91-1.01x cuDNN on the bf16 grid; at d 128 three
    # slots measured within 2.5% of two, both ways).
    for HD in (64, 128):
        put("sm90a", "bwd", HD, None, [Sm90BackwardConfig(HD, 2)])
    # with a window or the deterministic mode (bwd_feat): d 128's 2-slot tile spilled 4 bytes
    # (compile check: causal with a window; ordered, causal or with a window); with 3 slots
    # (231,992 bytes) every variant is spill-free (plain calls: within 2.5% of 2 slots).
    put("sm90a", "bwd_feat", 128, None, [Sm90BackwardConfig(128, 3)])
    return t


TILES = _table()


def sm90_head_dim_bucket(d: int) -> int:
    return _bucket(d, SM90_HEAD_DIM_BUCKETS)


# The longest key sequence (non-causal, causal) that takes the Hopper forward's "fwd_short"
# tile, per head-dim bucket (the third-round sweep: where the short tile measured faster; d 64
# non-causal, session 15, both tiles beside cuDNN in one run, 3 rounds: the 4-stage tile
# 1.5-2.5% faster than the 3-stage one at n 2k, 4k and 8k, 0.6% slower at 16k).
SM90_SHORT_KEYS = {64: (8192, 2048), 128: (512, 4096), 256: (512, 1024)}


def sm90_forward_config(d: int, causal: bool, seqlen_k: int | None = None,
                        local: bool = False, hooked: bool = False,
                        packed: bool = False) -> Sm90ForwardConfig:
    """The Hopper forward's tile for head dim d (TILES, class "sm90a"), for keys of length
    `seqlen_k` where given (the short-sequence tile up to SM90_SHORT_KEYS), with a sliding
    window (local), the score hook (hooked), over a variable-length batch (packed). The
    first of these rows that is listed: "fwd_local_hooked" (a window and the hook),
    "fwd_feat" (two of a window, the hook and a variable-length batch), "fwd_packed"; else
    the plain call's tile (a window alone or the hook alone over a dense batch too)."""
    HD, c = sm90_head_dim_bucket(d), bool(causal)
    if packed:  # (the entries' lengths are not known here: the long-key tile)
        seqlen_k = None
    short = sm90_forward_short(d, causal, seqlen_k)
    for kind, on in (("fwd_local_hooked", local and hooked),
                     ("fwd_feat", local + hooked + packed >= 2), ("fwd_packed", packed)):
        if on and ("sm90a", kind, HD, c) in TILES:
            return TILES[("sm90a", kind, HD, c)][0]
    return TILES[("sm90a", "fwd_short" if short else "fwd", HD, c)][0]


def sm90_forward_short(d: int, causal: bool, seqlen_k: int | None) -> bool:
    """Whether keys of length `seqlen_k` take head dim d's short-sequence Hopper tile."""
    return seqlen_k is not None and seqlen_k <= SM90_SHORT_LIMIT.get((d, bool(causal)), -1)


def sm90_window_short(d: int, causal: bool, left: int, right: int, seqlen_k: int) -> bool:
    """Whether a sliding window (the kernels' sides left, right; causal: the right side
    bounded) takes head dim d's short-sequence Hopper tile: by the keys a row block visits,
    the window's width and the long tile's 128 rows, against SM90_WINDOW_SHORT_KEYS (else the
    non-causal limit, as every row block visits about as many); where the right side is
    unbounded, by seqlen_k, as a call without a window. Session 18
    (bench/results/session18/window_tiles/, causal windows over 32k keys, d 128): the short
    tile took 24-27% less time at windows of 128 and 256 keys, 2% at 1024, 9% more at 4096."""
    if not causal:
        return sm90_forward_short(d, False, seqlen_k)
    keys = min(seqlen_k, max(0, left + right) + 128)
    limit = SM90_WINDOW_SHORT_KEYS.get(sm90_head_dim_bucket(d))
    return keys <= limit if limit is not None else sm90_forward_short(d, False, keys)


# d 64 windows with a bounded right side (session 19, bench/results/session19/window_d64/,
# n = 32k, no hook): the two-consumer short tile 10% faster than the three-consumer B_c 128
# tile at 256 keys of width, 2% slower at 1024, 8-11% at 2048-8192; the limit between (a
# width of 512, interpolated).
SM90_WINDOW_SHORT_KEYS = {64: 512 + 128}


# The longest key sequence that takes the short tile, per (head dim, causal), for every head
# dim the API takes (one dictionary lookup per call on the host path).
SM90_SHORT_LIMIT = {(d, c): SM90_SHORT_KEYS[HD][int(c)]
                    for d in range(8, 257, 8) for c in (False, True)
                    if (HD := sm90_head_dim_bucket(d)) in SM90_SHORT_KEYS}


def sm90_forward_configs(d: int, causal: bool, local: bool = False, hooked: bool = False,
                         packed: bool = False) -> list[Sm90ForwardConfig]:
    """Every tile sm90_forward_config can pick for head dim d: the usual one and, where the
    bucket has one, the short-sequence one (distinct, in that order)."""
    return list(dict.fromkeys(sm90_forward_config(d, causal, n, local, hooked, packed)
                              for n in (None, 1)))


def sm90_forward_kernel_name(dtype_name: str, cfg: Sm90ForwardConfig, causal: bool,
                             local: bool = False, hooked: bool = False,
                             packed: bool = False) -> str:
    return (f"cuflash::fa2_forward_sm90<{ELEMENT_TAGS[dtype_name]}, {cfg.tile_type}, "
            f"{mask_type(causal, local)}{score_type(hooked, packed)}>")


SM90_FORWARD_FILE = "fa2_forward_sm90.cu"
SM90_BACKWARD_FILE = "fa2_backward_sm90.cu"
# The head-dim buckets of the Hopper backward (larger head dims run the portable one), and
# those with the score hook (softcap, ALiBi). d 128's hooked consumers spilled 8-88 bytes with
# dP^T's accumulators held through the hook's pass (session 14); issued after it (LATE_DP in
# the kernel) the dense ones are spill-free, but a variable-length batch's still spill 28-60
# bytes (the entry's offsets), so d 128 hooked packed calls stay portable (compile check,
# session 17).
SM90_BACKWARD_BUCKETS = (64, 128)
SM90_HOOKED_PACKED_BACKWARD_BUCKETS = (64,)


def sm90_backward_buckets(hooked: bool = False, packed: bool = False) -> tuple:
    """The head-dim buckets that take the Hopper backward, with the score hook (hooked) and
    over a variable-length batch (packed): all of them but for the hook over a packed
    batch."""
    return SM90_HOOKED_PACKED_BACKWARD_BUCKETS if hooked and packed else SM90_BACKWARD_BUCKETS


def sm90_backward_config(d: int, local: bool = False, ordered: bool = False,
                         hooked: bool = False, packed: bool = False
                         ) -> Sm90BackwardConfig | None:
    """The Hopper backward's tile for head dim d (TILES, class "sm90a"; local, ordered: with a
    sliding window, in the deterministic mode: "bwd_feat" where listed; hooked: with the score
    hook; packed: over a variable-length batch), or None where the call takes the portable
    backward."""
    HD = sm90_head_dim_bucket(d)
    if HD not in sm90_backward_buckets(hooked, packed):
        return None
    if (local or ordered) and ("sm90a", "bwd_feat", HD, False) in TILES:
        return TILES[("sm90a", "bwd_feat", HD, False)][0]
    return TILES[("sm90a", "bwd", HD, False)][0]


def sm90_backward_names(dtype_name: str, cfg: Sm90BackwardConfig, causal: bool,
                        local: bool = False, ordered: bool = False,
                        hooked: bool = False, packed: bool = False) -> dict:
    """The Hopper backward's three kernels by role: the preprocess and the dQ pass of
    backward_passes.cuh on its parameter struct, and the main kernel (local: a sliding
    window's lower limit; ordered: the deterministic mode's fixed order of dQ additions;
    hooked: the score hook, softcap and ALiBi; packed: variable-length batches, not
    ordered)."""
    if packed and ordered:
        raise ValueError("packed batches have no ordered mode")
    T, P = ELEMENT_TAGS[dtype_name], "cuflash::Sm90BwdParams"
    seq = "cuflash::PackedSeq" if packed else "cuflash::DenseSeq"
    mask = mask_type(causal, local)
    if packed:
        extra = f", false, cuflash::{'ScoreHook' if hooked else 'ScoreScale'}, {seq}"
    else:
        extra = (f", {'true' if ordered else 'false'}, cuflash::ScoreHook" if hooked
                 else ", true" if ordered else "")
    return {"pre": f"cuflash::fa2_backward_preprocess<{T}, {seq}, {P}, {cfg.B_r}>",
            "main": f"cuflash::fa2_backward_sm90<{T}, {cfg.tile_type}, {mask}{extra}>",
            "dq": f"cuflash::fa2_backward_dq_bulk<{T}, {cfg.tile_type}, {mask}, {seq}, {P}>"}


# NVRTC / nvcc target of the Hopper kernels: wgmma and setmaxnreg need the "a" variant.
SM90A_NVRTC_OPTIONS = ("-arch=sm_90a",)
SM90A_NVCC_ARCH = "-gencode=arch=compute_90a,code=sm_90a"


# fwd_short: the longest key sequence (non-causal, causal) that takes the "fwd_short" tiles.
SHORT_KEYS = {64: (1024, 4096)}


def gpu_class(max_smem_bytes: int) -> str:
    """The tile table's GPU class of a device allowing `max_smem_bytes` per block."""
    return "sm90" if max_smem_bytes >= SM90_SMEM else "sm80"


def _first_fitting(key, max_smem_bytes: int):
    for cfg in TILES[key]:
        if cfg.smem_bytes <= max_smem_bytes:
            return cfg
    raise RuntimeError(
        f"the {key[1]} pass for head dims in bucket {key[2]} needs "
        f"{TILES[key][-1].smem_bytes // 1024} KB of shared memory per thread block; "
        f"this GPU allows {max_smem_bytes // 1024} KB (head dims <= 128 fit every sm_80+ GPU)")


def forward_short(HD: int, causal: bool, seqlen_k: int | None) -> bool:
    """Whether a key sequence of `seqlen_k` takes bucket HD's short-sequence tiles."""
    limits = SHORT_KEYS.get(HD)
    return bool(limits) and seqlen_k is not None and seqlen_k <= limits[int(bool(causal))]


def forward_config(HD: int, causal: bool, max_smem_bytes: int = SM90_SMEM,
                   seqlen_k: int | None = None, local: bool = False,
                   hooked: bool = False, packed: bool = False,
                   odd_d: bool = False) -> ForwardConfig:
    """The forward tile for head-dim bucket HD on a device allowing `max_smem_bytes` of dynamic
    shared memory per block (for keys of length `seqlen_k`, where given; local, hooked, packed:
    the kernel with a sliding window, with the score hook, over a variable-length batch;
    odd_d: a head dim that is not a multiple of 8, whose kernels always have the window and
    the hook, so that one kernel per mask takes every option: the feature tile, in OddD)."""
    if odd_d:
        return dataclasses.replace(forward_config(HD, causal, max_smem_bytes, None, True, True,
                                                  packed), odd_d=True)
    cls, feat = gpu_class(max_smem_bytes), local or hooked or packed
    if packed and (cls, "fwd_packed", HD, bool(causal)) in TILES:
        return _first_fitting((cls, "fwd_packed", HD, bool(causal)), max_smem_bytes)
    if feat and (cls, "fwd_feat", HD, bool(causal)) in TILES:
        return _first_fitting((cls, "fwd_feat", HD, bool(causal)), max_smem_bytes)
    pass_ = "fwd_short" if not feat and forward_short(HD, causal, seqlen_k) else "fwd"
    return _first_fitting((cls, pass_, HD, bool(causal)), max_smem_bytes)


def forward_plans(HD: int, causal: bool, max_smem_bytes: int = SM90_SMEM,
                  local: bool = False, hooked: bool = False,
                  packed: bool = False, odd_d: bool = False) -> list[ForwardConfig]:
    """Every tile forward_config can pick for bucket HD on such a device: the usual one and,
    where the bucket has one, the short-key one (distinct, in that order)."""
    return list(dict.fromkeys(forward_config(HD, causal, max_smem_bytes, n, local, hooked,
                                             packed, odd_d) for n in (None, 1)))


def backward_configs(HD: int, bulk: bool = False) -> list[BackwardConfig]:
    """The backward tiles for head-dim bucket HD in order of preference: with `bulk` (a
    227 KB sm_90-class GPU) the sm90 row of the table, else the sm80 row (dQ atomics)."""
    return TILES[("sm90" if bulk else "sm80", "bwd", HD, False)]


def backward_config(HD: int, max_smem_bytes: int = 227 * 1024,
                    bulk: bool = False, local: bool = False,
                    hooked: bool = False, odd_d: bool = False,
                    packed: bool = False) -> BackwardConfig:
    """The backward tile for head-dim bucket HD on a device allowing `max_smem_bytes` per
    block; bulk: the device has the bulk copy engine (sm_90+, see has_bulk_copy). Only the
    sm90 class (227 KB) takes bulk tiles; `bulk=False` forces the dQ-atomics tiles. local,
    hooked: the kernels with a sliding window, with the score hook; odd_d: a head dim that is
    not a multiple of 8 (the window and the hook always, as in the forward, in OddD); packed:
    over a variable-length batch ("bwd_packed_hook", "bwd_packed" first, where listed)."""
    if odd_d:
        return dataclasses.replace(backward_config(HD, max_smem_bytes, bulk, True, True,
                                                   packed=packed), odd_d=True)
    cls = "sm90" if bulk and gpu_class(max_smem_bytes) == "sm90" else "sm80"
    for key, on in (("bwd_packed_hook", packed and hooked), ("bwd_hook", hooked),
                    ("bwd_packed", packed)):
        if on and (cls, key, HD, False) in TILES:
            return _first_fitting((cls, key, HD, False), max_smem_bytes)
    if (local or hooked) and (cls, "bwd_feat", HD, False) in TILES:
        return _first_fitting((cls, "bwd_feat", HD, False), max_smem_bytes)
    return _first_fitting((cls, "bwd", HD, False), max_smem_bytes)


def config_from_shape(which: str, d: int, shape: str, bulk: bool = False):
    """A tile shape written as in bench/bench.py --configs: forward "BrxBcxWarps[xKVstages]",
    backward "BrxBcxWarpsxWMsdpxWMdkvxWMdqxQstages[xDQbulk]" (the dQ mode defaults to two
    bulk tiles where `bulk`, i.e. sm_90+, else atomics), for head dim d; the Hopper forward
    "hBcxStages[o|p][l][eN][cK][t]" (o: the intra-warpgroup overlap, p: ping-pong; l: lazy
    rescaling; eN: every N-th n8 tile's exponentials on the FMA pipe; cK: K consumer
    warpgroups, B_r = 64 K, default 2; t: ping-pong's turns start afresh per tile, without
    the hand-over across tiles); the Hopper backward "hS" (S slots for Q_i and dO_i)."""
    if which == "bwd" and shape.startswith("h"):  # the Hopper backward: "hS", S stages
        m = re.fullmatch(r"h(\d)", shape)
        if not m or sm90_head_dim_bucket(d) not in SM90_BACKWARD_BUCKETS:
            raise ValueError(f"Hopper backward tile {shape!r}: hS (S Q_i / dO_i slots), for "
                             f"head dims up to {SM90_BACKWARD_BUCKETS[-1]}")
        return Sm90BackwardConfig(sm90_head_dim_bucket(d), int(m[1]))
    if which == "fwd" and shape.startswith("h"):
        m = re.fullmatch(r"h(\d+)x(\d+)([op]?)(l?)(?:e(\d))?(?:c([23]))?(t?)", shape)
        if not m:
            raise ValueError(f"Hopper tile {shape!r}: hBcxStages, then o for the "
                             "intra-warpgroup overlap or p for ping-pong, l for lazy "
                             "rescaling, eN for every N-th n8 tile's exp on the FMA pipe, "
                             "c2 or c3 consumer warpgroups, t for turns per tile")
        return Sm90ForwardConfig(sm90_head_dim_bucket(d), int(m[1]), int(m[2]),
                                 overlap=m[3] == "o", pingpong=m[3] == "p",
                                 lazy=m[4] == "l", poly=int(m[5] or 0),
                                 consumers=int(m[6] or 2), handover=m[7] != "t")
    n = [int(x) for x in shape.split("x")]
    if which == "fwd":
        return ForwardConfig(head_dim_bucket(d), *n)
    return BackwardConfig(backward_head_dim_bucket(d), *n[:7],
                          dq_bulk=n[7] if len(n) > 7 else 2 * bulk)


def backward_kernel_name(dtype_name: str, cfg: BackwardConfig, causal: bool,
                         ordered: bool = False, local: bool = False,
                         hooked: bool = False, packed: bool = False) -> str:
    """ordered: the deterministic mode's kernel with ordered dQ additions (cfg.dq_bulk only;
    with dQ atomics the deterministic mode runs the default kernel on split slices); packed:
    over a variable-length batch (not ordered)."""
    if ordered and not cfg.dq_bulk:
        raise ValueError("ordered dQ additions need the bulk dQ reduction")
    if ordered and packed:
        raise ValueError("packed batches have no ordered mode")
    return (f"cuflash::fa2_backward<{ELEMENT_TAGS[dtype_name]}, {cfg.tile_type}, "
            f"{mask_type(causal, local)}, {'true' if ordered else 'false'}"
            f"{score_type(hooked, packed)}>")


def _seq_type(packed: bool) -> str:
    """The batch layout as a trailing template argument (DenseSeq, the default, left out)."""
    return ", cuflash::PackedSeq" if packed else ""


def backward_preprocess_name(dtype_name: str, packed: bool = False) -> str:
    return f"cuflash::fa2_backward_preprocess<{ELEMENT_TAGS[dtype_name]}{_seq_type(packed)}>"


def backward_dq_name(dtype_name: str, cfg: BackwardConfig, causal: bool,
                     local: bool = False, packed: bool = False) -> str:
    """The kernel that turns dQ_accum into dQ (its layout depends on cfg.dq_bulk; the bulk
    layout's pass also needs the mask: in the ordered mode row blocks no key reaches are
    never written)."""
    if cfg.dq_bulk:
        return (f"cuflash::fa2_backward_dq_bulk<{ELEMENT_TAGS[dtype_name]}, {cfg.tile_type}, "
                f"{mask_type(causal, local)}{_seq_type(packed)}>")
    return f"cuflash::fa2_backward_dq<{ELEMENT_TAGS[dtype_name]}{_seq_type(packed)}>"


# The architecture the CPU compile check builds each shared-memory class for: sm_86/89/120
# (99 KB) and sm_80 (163 KB) are checked as sm_80, sm_90 (227 KB) as sm_90.
ARCH_SMEM = {"80": (99 * 1024, 163 * 1024), "90": (227 * 1024,), "90a": (227 * 1024,)}


def _planned(arch: str) -> list[tuple[str, str, object]]:
    """(kernel file, name expression, tile or None) of every kernel the registered variants
    (cuflash/_registry.py) may launch on a GPU of architecture class `arch`."""
    from . import _registry
    return _registry.specialisations(arch)


def all_specialisations(arch: str | None = None) -> list[tuple[str, str]]:
    """(kernel file, name expression) of every kernel the package may launch on a GPU of
    architecture class `arch` ("80" or "90", see ARCH_SMEM), or on any GPU (None)."""
    if arch is None:
        return list(dict.fromkeys(s for a in ARCH_SMEM for s in all_specialisations(a)))
    return list(dict.fromkeys((f, n) for f, n, _ in _planned(arch)))  # unique, in order


def tile_assertions(arch: str, filename: str) -> list[str]:
    """C++ conditions that hold iff the kernels' tile traits agree with this planner's configs
    (shared memory, the named register workarounds) for every tile of kernels/filename planned
    on architecture class `arch`: the compile check static_asserts them."""
    conds = [c for f, _, cfg in _planned(arch) if f == filename and cfg is not None
             for c in cfg.tile_asserts()]
    return list(dict.fromkeys(conds))
