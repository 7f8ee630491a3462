"""The kernel variants cuflash can launch, each declared once.

A variant says where its source is, which parameter struct its kernels take, how a tile is
planned for a problem (the planner's tile table, cuflash/_plan.py), which kernels (template
specialisations) a plan launches, their grids, and their shared memory. ``forward``,
``backward``, ``precompile`` and the compile check all iterate :data:`VARIANTS`; a new kernel
family (the Hopper forward and backward, the decode path) is a new entry here.

The grid and split heuristics that depend on the GPU's size (SM count) live here too, beside
the kernels they shape.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from . import _params, _plan

GRID_YZ_MAX = 65535  # CUDA limit on gridDim.y / gridDim.z


@dataclass(frozen=True)
class Plan:
    """One launch plan: a tile and the kernels (name expressions, by role) it launches."""

    cfg: object            # the tile (a _plan config dataclass)
    kernels: dict          # role -> name expression, e.g. {"main": "cuflash::fa2_forward<...>"}
    smem: dict             # role -> dynamic shared memory in bytes


@dataclass(frozen=True)
class Variant:
    name: str
    source: str                    # file in kernels/
    params: _params.Struct         # the struct its kernels take
    arch_classes: tuple            # compile-check classes it is built for ("80", "90")
    # plans(dtype_name, HD, causal, max_smem, bulk) -> every Plan a device of that shared
    # memory (and bulk copy engine) may launch for that bucket and mask
    # (..., local=False, hooked=False[, packed=False]): the same with a window's lower limit,
    # with the score hook (softcap, ALiBi), over a variable-length batch
    plans: Callable[..., list]
    options: tuple = ()            # compiler options beyond _loader.NVRTC_OPTIONS
    features: bool = True          # its kernels take windows and the score hook
    packed: bool = False           # ... and variable-length batches (seqinfo.cuh's PackedSeq)
    odd_d: bool = False            # ... and head dims that are not a multiple of 8 (OddD tiles,
                                   # with the window and the hook: plans(..., odd_d=True))


# ---- FA2 forward ---------------------------------------------------------------------------

def _fa2_forward_plan(dtype_name: str, cfg, causal: bool, local: bool = False,
                      hooked: bool = False, packed: bool = False) -> Plan:
    if cfg.odd_d:  # (OddD kernels always have the window and the hook)
        local = hooked = True
    return Plan(cfg, {"main": _plan.forward_kernel_name(dtype_name, cfg, causal, local, hooked,
                                                        packed)},
                {"main": cfg.smem_bytes})


def fa2_forward_plan(dtype_name: str, HD: int, causal: bool, max_smem: int,
                     seqlen_k: int | None = None, config=None, local: bool = False,
                     hooked: bool = False, packed: bool = False, odd_d: bool = False) -> Plan:
    """The forward's plan for keys of length seqlen_k (config: an explicit tile)."""
    cfg = config or _plan.forward_config(HD, causal, max_smem, seqlen_k, local, hooked, packed,
                                         odd_d)
    return _fa2_forward_plan(dtype_name, cfg, causal, local, hooked, packed)


def fa2_forward_grid(cfg, seqlen_q: int, nheads: int, batch: int) -> tuple:
    """(row blocks, heads, batch): one thread block per row block of B_r query rows."""
    return ((seqlen_q + cfg.B_r - 1) // cfg.B_r, nheads, batch)


FA2_FORWARD = Variant(
    "fa2_forward", _plan.FORWARD_FILE, _params.FWD, ("80", "90"),
    lambda dt, HD, causal, smem, bulk, local=False, hooked=False, packed=False, odd_d=False: [
        _fa2_forward_plan(dt, cfg, causal, local, hooked, packed)
        for cfg in _plan.forward_plans(HD, causal, smem, local, hooked, packed, odd_d)],
    packed=True, odd_d=True)


# ---- FA2 forward on Hopper (sm_90a: TMA, wgmma, warp specialisation) --------------------------

def sm90_forward_plan(dtype_name: str, d: int, causal: bool, config=None,
                      seqlen_k: int | None = None, local: bool = False,
                      hooked: bool = False, packed: bool = False) -> Plan:
    """The Hopper forward's plan (config: an explicit Sm90ForwardConfig, the bench's; else the
    table's tile for keys of length seqlen_k)."""
    cfg = config or _plan.sm90_forward_config(d, causal, seqlen_k, local, hooked, packed)
    return Plan(cfg, {"main": _plan.sm90_forward_kernel_name(dtype_name, cfg, causal, local,
                                                             hooked, packed)},
                {"main": cfg.smem_bytes})


@functools.lru_cache(maxsize=256)
def fast_div(d: int) -> tuple:
    """(mul, shift) of FastDiv (kernels/common.cuh) for a divisor 1 <= d < 2^31: n / d =
    (umulhi(n, mul) + n) >> shift for every 0 <= n < 2^31 (the round-up method of Granlund and
    Montgomery; tests/test_host_path.py checks it against //)."""
    if not 1 <= d < 2 ** 31:
        raise ValueError(f"fast_div: divisor {d} outside [1, 2^31)")
    shift = (d - 1).bit_length()  # ceil(log2 d)
    return ((1 << 32) * ((1 << shift) - d)) // d + 1, shift


def sm90_forward_walk(cfg, seqlen_q: int, nheads: int, per_unit: int) -> dict:
    """The Hopper forward's divisors of its tile walk (fa2_forward_sm90.cu, "the tiles"), as
    parameter fields: by the heads and by a pair's units, ceil(T_r / per_unit). (_api keeps
    them with the shape's grid; the dict is only read.)"""
    T_r = (seqlen_q + cfg.B_r - 1) // cfg.B_r
    unit_rows = max(1, (T_r + per_unit - 1) // per_unit)
    (hm, hs), (um, us) = fast_div(nheads), fast_div(unit_rows)
    return {"heads_mul": hm, "heads_shift": hs, "unit_rows_mul": um, "unit_rows_shift": us}


def sm90_forward_grid(cfg, causal: bool, seqlen_q: int, nheads: int, batch: int,
                      sms: int, seqlen_k: int = 0, split_tail: bool = False,
                      causal_tail: bool = False) -> tuple:
    """(grid, per_unit, tail_tiles) of the Hopper forward: a persistent grid, at most one
    thread block per SM, over units of work (fa2_forward_sm90.cu, "the tiles"). A unit is one
    tile (B_r query rows x head x batch entry), or, with the causal mask and more tiles than
    SMs, two: row blocks T_r - 1 - r and r, of equal total length for every r, so that a
    static split balances (one tile each left the blocks' shares 1.8x apart at d 256 n 16k).
    The kernel walks the units (head, batch) pair by pair, a pair's row blocks one after the
    other, so that the blocks running at once read the same few K and V.
    tail_tiles: where the kernel splits its tail (split_tail: a dense call without a causal
    mask, a window or the score hook) and T tiles do not fill whole rounds of the G blocks,
    the last G + T % G tiles, whose column blocks the blocks share evenly ("the split tail":
    no block idles through the last round); 0 where not, and where it measured no faster
    (SPLIT_TAIL_MIN_BLOCKS, SPLIT_TAIL_MAX_HEAD_DIM). With causal_tail (a dense call under
    the causal mask without a window), tail_tiles counts units instead: where the units of
    two tiles do not fill whole rounds, the last G + units % G, which the kernel hands out as
    single tiles, the longest first ("the causal tail"), where it measured faster
    (CAUSAL_TAIL_MIN_ROW_BLOCKS)."""
    T_r = (seqlen_q + cfg.B_r - 1) // cfg.B_r
    per_unit = 2 if causal and T_r > 1 and T_r * nheads * batch > sms else 1
    units = -(-T_r // per_unit) * nheads * batch
    grid = max(1, min(units, sms))
    T_c = -(-seqlen_k // cfg.B_c)
    tail = grid + units % grid if units > grid and units % grid else 0  # (the last round's)
    # (the split tail: the kernel's step arithmetic, 32-bit, reaches (tail + 1) T_c)
    split = split_tail and per_unit == 1 and T_c >= SPLIT_TAIL_MIN_BLOCKS and \
        cfg.HD <= SPLIT_TAIL_MAX_HEAD_DIM and (tail + 1) * T_c < 2 ** 31
    by_rows = causal_tail and per_unit == 2 and \
        T_r >= CAUSAL_TAIL_MIN_ROW_BLOCKS.get(cfg.HD, 1 << 30)
    return (grid, 1, 1), per_unit, tail if split or by_rows else 0


# Where the Hopper forward hands its causal tail out as single tiles (sm90_forward_grid): at
# least this many row blocks a (head, batch) pair, per head-dim bucket. The single tiles of
# the tail come from many pairs at once, so that a tile's K and V are no longer read just
# before by the other tile of its unit; on short sequences (few row blocks, many pairs) that
# cost more than the idle part of the last round. Session 26 (bench/results/session26/call2/
# ab.log: bf16, the standard grid's causal points, tail on everywhere against main, paired),
# main's time over the tail's by row blocks a pair: d 64 0.975, 0.972, 0.978 at 4, 8, 16
# (B_r 128), 1.019, 1.021, 1.036 at 22, 43, 86 (B_r 192); d 128 0.971, 0.995, 1.010, 1.014,
# 1.019, 1.021 at 4 .. 128; d 256 0.896, 0.936, 0.980, 1.003, 1.010, 1.014 at 4 .. 128.
# (d 192, not measured, takes d 256's.)
CAUSAL_TAIL_MIN_ROW_BLOCKS = {64: 17, 128: 16, 192: 64, 256: 64}

# Where the Hopper forward splits its tail (sm90_forward_grid): tiles of at least
# SPLIT_TAIL_MIN_BLOCKS column blocks, head-dim buckets up to SPLIT_TAIL_MAX_HEAD_DIM. Each
# split adds tile starts and, at the end of the kernel, merges (a part's O in float32, stored
# and read back), which short tiles and d 256's larger parts did not earn back. Session 20
# (bench/results/session20/call3/split_tail_paired.log: bf16, the standard grid's non-causal
# points, split and not in turns in one timing loop), time without over time with: d 128
# 0.905x at 4 column blocks a tile, 0.95x at 6, 0.98x at 12, 1.00x at 24, 1.015x at 47,
# 1.023x at 94; d 64 0.97x at 4, 0.98x at 8, 1.006x at 16, 1.017x at 32, 1.00x at 64 and
# 128; d 256 0.77x at 8, 0.84x at 13, 0.91x at 26, 0.97x at 52, 1.00x at 103, 1.01x at 205.
SPLIT_TAIL_MIN_BLOCKS = 32
SPLIT_TAIL_MAX_HEAD_DIM = 128


def sm90_tail_buffers(cfg, grid: int) -> tuple:
    """(float32 count, int32 count) of the split tail's buffers for a launch of `grid`
    blocks: two parts (B_r rows of O and of L each) and a count per warp for each of the
    grid + 1 boundaries between the blocks' shares (fa2_forward_sm90.cu, the split tail)."""
    return 2 * (grid + 1) * cfg.B_r * (cfg.HD + 1), (grid + 1) * 4 * cfg.consumers


def sm90_packed_grid(cfg, total_q: int, nheads: int, batch: int, sms: int) -> tuple:
    """The Hopper forward's grid over a packed (variable-length) batch: a block per SM, or
    fewer where the batch has fewer tiles (at most nheads x (total_q / B_r + batch) of them:
    each entry's last row block may be partial). The blocks take the tiles in turn
    (fa2_forward_sm90.cu, next_packed_tile)."""
    return (max(1, min(nheads * (-(-total_q // cfg.B_r) + batch), sms)), 1, 1)


def _sm90_forward_plans(dt, HD, causal, smem, bulk, local=False, hooked=False,
                        packed=False) -> list:
    # one plan per Hopper bucket (64, 128, 192, 256), listed under the portable bucket that
    # is its largest head dim
    if HD not in _plan.SM90_HEAD_DIM_BUCKETS:
        return []
    return [sm90_forward_plan(dt, HD, causal, cfg, local=local, hooked=hooked, packed=packed)
            for cfg in _plan.sm90_forward_configs(HD, causal, local, hooked, packed)]


FA2_FORWARD_SM90 = Variant(
    "fa2_forward_sm90", _plan.SM90_FORWARD_FILE, _params.SM90_FWD, ("90a",),
    _sm90_forward_plans, _plan.SM90A_NVRTC_OPTIONS, packed=True)


# ---- FA1 forward ---------------------------------------------------------------------------

def fa1_forward_plan(dtype_name: str, HD: int, causal: bool, max_smem: int) -> Plan:
    cfg = _plan.fa1_config(HD, max_smem)
    return Plan(cfg, {"main": _plan.fa1_kernel_name(dtype_name, cfg, causal),
                      "finalize": _plan.fa1_finalize_name(dtype_name)},
                {"main": cfg.smem_bytes, "finalize": 0})


def fa1_forward_grids(seqlen_q: int, d: int, nheads: int, batch: int) -> dict:
    """main: one thread block per (head, batch), as FA1 did; finalize: one thread per 8
    elements of O."""
    return {"main": (nheads, batch, 1),
            "finalize": ((seqlen_q * -(-d // 8) + 127) // 128, nheads, batch)}


FA1_FORWARD = Variant(
    "fa1_forward", _plan.FA1_FILE, _params.FWD, ("80", "90"),
    lambda dt, HD, causal, smem, bulk: [fa1_forward_plan(dt, HD, causal, smem)],
    features=False)


# ---- FA2 backward --------------------------------------------------------------------------

def fa2_backward_plan(dtype_name: str, HD: int, causal: bool, max_smem: int, bulk: bool,
                      ordered: bool = False, config=None, local: bool = False,
                      hooked: bool = False, odd_d: bool = False, packed: bool = False) -> Plan:
    """The backward's three kernels. ordered: the deterministic mode's kernel with ordered dQ
    additions (tiles with bulk dQ only); packed: over a variable-length batch."""
    cfg = config or _plan.backward_config(HD, max_smem, bulk, local, hooked, odd_d, packed)
    if cfg.odd_d:  # (OddD kernels always have the window and the hook)
        local = hooked = True
    return Plan(cfg, {"pre": _plan.backward_preprocess_name(dtype_name, packed),
                      "main": _plan.backward_kernel_name(dtype_name, cfg, causal, ordered,
                                                         local, hooked, packed),
                      "dq": _plan.backward_dq_name(dtype_name, cfg, causal, local, packed)},
                {"pre": 0, "main": cfg.smem_bytes, "dq": 0})


def _fa2_backward_plans(dt, HD, causal, smem, bulk, local=False, hooked=False,
                        odd_d=False, packed=False) -> list:
    try:
        cfg = _plan.backward_config(HD, smem, bulk, local, hooked, odd_d, packed)
    except RuntimeError:  # does not fit this GPU: backward() raises there
        return []
    # (packed batches: no ordered mode, their deterministic calls run entry by entry)
    return [fa2_backward_plan(dt, HD, causal, smem, bulk, ordered, local=local, hooked=hooked,
                              odd_d=odd_d, packed=packed)
            for ordered in ((False, True) if cfg.dq_bulk and not packed else (False,))]


FA2_BACKWARD = Variant("fa2_backward", _plan.BACKWARD_FILE, _params.BWD, ("80", "90"),
                       _fa2_backward_plans, packed=True, odd_d=True)


# ---- FA2 backward on Hopper (sm_90a: TMA, wgmma, warp specialisation) -------------------------

def sm90_backward_plan(dtype_name: str, d: int, causal: bool, config=None,
                       local: bool = False, ordered: bool = False,
                       hooked: bool = False, packed: bool = False) -> Plan | None:
    """The Hopper backward's three kernels for head dim d (config: an explicit
    Sm90BackwardConfig, the bench's; local: with a window's lower limit; ordered: the
    deterministic mode's; hooked: with the score hook; packed: a variable-length batch), or
    None where the call takes the portable backward."""
    cfg = config or _plan.sm90_backward_config(d, local, ordered, hooked, packed)
    if cfg is None:
        return None
    return Plan(cfg, _plan.sm90_backward_names(dtype_name, cfg, causal, local, ordered, hooked,
                                               packed),
                {"pre": 0, "main": cfg.smem_bytes, "dq": 0})


def sm90_backward_tiles(causal: bool, local: bool, ordered: bool, packed: bool) -> str:
    """How the Hopper backward's main kernel takes its tiles, by the conditions of
    fa2_backward_sm90.cu's SPLIT and BY_COLUMN: "split", a 1-d grid whose last tiles may be
    split by row steps (dense, no mask, no window, not ordered: sm90_backward_split);
    "by_column", (kv heads, column blocks, batch) (the causal mask alone, dense, not
    ordered: sm90_backward_grid); else "grid" (backward_grid's, or the ordered one)."""
    if ordered or local or packed:
        return "grid"
    return "by_column" if causal else "split"


def sm90_backward_grid(cfg, seqlen_k: int, nheads_k: int, batch: int, causal: bool = False,
                       ordered: bool = False, sms: int = 132, local: bool = False,
                       packed: bool = False) -> tuple:
    """(column blocks, kv heads, batch): one thread block per column block of B_c keys, which
    walks every query head of its kv head's group. The causal mask alone (dense, not ordered):
    (kv heads, column blocks, batch), each batch entry's tiles column block by column block
    (fa2_backward_sm90.cu, BY_COLUMN). The GPU starts a grid's blocks in index order as SMs
    free up, and causal column block j has about T_r - j B_c / B_r row steps, so an entry's
    longest tiles go first and its shortest last, and the last round ends level. Column
    blocks fastest, each (batch, kv head) pair's tiles run long to short and the last pair's
    longest starts near the end: in a model of that dispatch (132 SMs, a tile its steps + 2),
    the standard grid's causal points took 1.05-1.07x the ideal time at d 128 (n 512-8192) and
    1.03x at d 64; by entry 1.002-1.031x at d 128, 1.001-1.013x at d 64. (All pairs' column
    block 0 first, then 1, ..., measured 4.5% faster at d 128 n 8192 but up to 24% slower at
    n 512-4096: with one block of each pair at a time every pair's rows came from HBM; by
    entry, the blocks that run at once are one or two entries' heads, several per head.)
    Ordered without the causal mask,
    (H, column blocks, batch x kv heads / H):
    the (batch, kv head) pairs in groups of H (ordered_wave_heads), each group's blocks
    started column rank by column rank (the same limit on T_c as backward_grid's)."""
    T_c = (seqlen_k + cfg.B_c - 1) // cfg.B_c
    if sm90_backward_tiles(causal, local, ordered, packed) == "by_column":
        if T_c > GRID_YZ_MAX:
            raise ValueError(f"the Hopper backward's causal grid holds at most {GRID_YZ_MAX} "
                             f"key blocks of {cfg.B_c} ({T_c} here; _api runs the portable "
                             "backward for such calls)")
        return (nheads_k, T_c, batch)
    if not ordered or causal:
        return backward_grid(T_c, nheads_k, batch, causal, ordered)
    _ordered_column_blocks(T_c)
    H = ordered_wave_heads(batch * nheads_k, sms)
    return (H, T_c, batch * nheads_k // H)


def sm90_backward_split(tiles: int, steps: int, sms: int) -> tuple:
    """(whole, parts) of the Hopper backward's split tail (fa2_backward_sm90.cu; dense calls
    without a mask, a window or the deterministic mode): `tiles` tiles (column blocks x kv
    heads x batch) of `steps` row steps each, one thread block per SM at a time, in rounds.
    Where the last round is part empty (tiles % sms of them: the `left` tiles), the first
    tiles - left run whole and each of the left tiles comes as `parts` blocks of about
    steps / parts row steps, whose sums the last to finish adds up. parts: the number that
    ends the parts' rounds soonest, each part counted at SPLIT_PART_COST more steps (its K_j,
    V_j loads and pipeline fill, its sums' reductions), where that is sooner than the left
    tiles whole; else (tiles, 1)."""
    return _backward_split(tiles, steps, sms, SPLIT_PART_COST, SPLIT_MAX_PARTS)


@functools.lru_cache(maxsize=256)  # (at every launch: a loop of up to SPLIT_MAX_PARTS)
def _backward_split(tiles: int, steps: int, sms: int, SPLIT_PART_COST: int,
                    SPLIT_MAX_PARTS: int) -> tuple:
    left = tiles % sms
    best, best_parts = steps, 1  # the last round, unsplit: one tile's steps
    for parts in range(2, min(steps, SPLIT_MAX_PARTS) + 1 if left else 0):
        last = -(-left * parts // sms) * (-(-steps // parts) + SPLIT_PART_COST)
        if last < best:
            best, best_parts = last, parts
    return (tiles - left, best_parts) if best_parts > 1 else (tiles, 1)


# The Hopper backward's split tail (sm90_backward_split): a part's own cost, in row steps of
# its tile, and the most parts a tile is split into.
SPLIT_PART_COST = 3
SPLIT_MAX_PARTS = 64


def sm90_backward_tail_buffers(cfg, whole: int, tiles: int) -> tuple:
    """(float32 count, int32 count) of the split tail's buffers (fa2_backward_sm90.cu): for
    each split tile, its dK_j and dV_j sums (B_c x HD each) and a count per consumer warp
    (16 keys each)."""
    return 2 * (tiles - whole) * cfg.B_c * cfg.HD, (tiles - whole) * cfg.B_c // 16


def ordered_wave_heads(pairs: int, sms: int) -> int:
    """The deterministic Hopper backward without the causal mask: how many of the `pairs`
    (batch, kv head) pairs share the GPU at once, a divisor of `pairs`. About sms / H blocks of
    each then run together: they read each Q_i, dO_i and add into each row block of dQ_accum
    within a few steps of each other, from L2 (with one block per pair at a time, 128 pairs at
    d 128, n 2048 streamed all of it from HBM: L2 hit rate 32% against the default's 89%,
    1.53x its time; ncu, session 15). They trail each other by a turn at each row block,
    which cost less than the L2 saves: session 15 measured H 4, 8 and 16 within 1.5% of each
    other and 4-16% faster than all pairs at once (1.30x against 1.53x at d 128, n 2048). So
    H near sms / 16 (16 blocks of a pair together): the divisor of `pairs` nearest to it by
    ratio (the smaller on a tie)."""
    target = max(1.0, sms / 16)
    divisors = [h for h in range(1, pairs + 1)  # (pairs / H is gridDim.z)
                if pairs % h == 0 and pairs // h <= GRID_YZ_MAX]
    return min(divisors, key=lambda h: (max(h / target, target / h), h))


def _sm90_backward_plans(dt, HD, causal, smem, bulk, local=False, hooked=False,
                         packed=False) -> list:
    if HD not in _plan.sm90_backward_buckets(hooked, packed):
        return []
    # (packed batches: no ordered mode, their deterministic calls run entry by entry)
    return [sm90_backward_plan(dt, HD, causal, local=local, ordered=ordered, hooked=hooked,
                               packed=packed)
            for ordered in ((False,) if packed else (False, True))]


FA2_BACKWARD_SM90 = Variant(
    "fa2_backward_sm90", _plan.SM90_BACKWARD_FILE, _params.SM90_BWD, ("90a",),
    _sm90_backward_plans, _plan.SM90A_NVRTC_OPTIONS, packed=True)


def backward_preprocess_grid(seqlen_q: int, lanes: int, nheads: int, batch: int) -> tuple:
    """D = rowsum(dO o O): `lanes` lanes per query row, 128 threads per block."""
    return ((seqlen_q + 128 // lanes - 1) // (128 // lanes), nheads, batch)


def backward_dq_grid(cfg, seqlen_q: int, d: int, nheads: int, batch: int) -> tuple:
    """The dQ pass: one thread per cfg.dq_vec n8 tiles of 4 floats of a fragment row (bulk dQ
    layout) or per 8 elements of a row (atomics layout)."""
    if cfg.dq_bulk:
        T_r = (seqlen_q + cfg.B_r - 1) // cfg.B_r
        return ((T_r * cfg.B_r * cfg.HD // 4 // cfg.dq_vec + 127) // 128, nheads, batch)
    return ((seqlen_q * -(-d // 8) + 127) // 128, nheads, batch)


def backward_grid(T_c: int, grid_heads: int, batch: int, causal: bool, ordered: bool,
                  splits: int = 0) -> tuple:
    """The FA2 backward kernel's grid: (T_c, grid_heads, batch), one block per column block, or
    (splits, grid_heads, batch) with split slices; with ordered dQ additions and no causal mask,
    (grid_heads, batch, T_c), so that block x of every (batch, head) starts before any block
    x + 1 (fa2_backward.cu, "Deterministic mode"). grid_heads = kv heads x head parts."""
    if ordered and not causal:
        return (grid_heads, batch, _ordered_column_blocks(T_c))
    return (splits or T_c, grid_heads, batch)


def _ordered_column_blocks(T_c: int) -> int:
    """T_c, checked against the grid dimension that holds it in the ordered grids without the
    causal mask (backward_grid's gridDim.z, the Hopper backward's gridDim.y)."""
    if T_c > GRID_YZ_MAX:
        raise ValueError(f"deterministic=True without the causal mask handles at most "
                         f"{GRID_YZ_MAX} key blocks ({T_c} here): use shorter key "
                         f"sequences, causal=True, or deterministic=False")
    return T_c


def head_parts(group: int, blocks_per_part: int, sms: int) -> int:
    """How many parts the query heads of each kv head are split into in the backward (each
    part a thread block per column block, summing its heads into dK_j, dV_j in registers): 1,
    so that no float32 copy of dK, dV is needed, unless that gives fewer blocks than the GPU
    has SMs; then the smallest divisor of the group that fills them (its float32 slices, one
    per part, are summed after the kernel)."""
    for parts in range(1, group + 1):
        if group % parts == 0 and blocks_per_part * parts >= sms:
            return parts
    return group


# The deterministic mode's split slices of float32 dQ take at most this many bytes beyond
# twice the float32 dQ (see deterministic_splits).
SPLIT_SCRATCH_FLOOR = 64 << 20


def deterministic_splits(sms: int, T_c: int, bh: int, cfg, rows_per_bh: int,
                         slice_bytes: int, causal: bool) -> int:
    """Thread blocks per (batch, kv head) in deterministic mode with dQ atomics (sm_80-89).

    Block x of a (batch, kv head) takes T_c / splits column blocks in turn, so the compute time
    goes as (waves of blocks) x (column blocks per block): ceil(bh * splits / SMs) *
    ceil(T_c / splits), one block per SM (the default mode runs ceil(bh * T_c / SMs) waves of
    one column block each). Each split also costs one float32 copy of dQ (`slice_bytes`),
    written once and read once, and the copies together may take at most
    max(2 x slice_bytes, 64 MiB). The split count with the lowest estimate, at most 16; the
    estimate takes a column block at ~1.6 TFLOP/s per SM (2.5 forward-sized matmuls of
    B_c x rows_per_bh x HD, half of them under a causal mask) and memory at ~3 TB/s."""
    block_s = 2.5 * 4 * cfg.B_c * rows_per_bh * cfg.HD * (0.5 if causal else 1.0) / 1.6e12
    slice_s = 2 * slice_bytes / 3e12
    limit = max(2, min(16, max(2 * slice_bytes, SPLIT_SCRATCH_FLOOR) // max(1, slice_bytes)))
    best_cost, best = None, 1
    for splits in range(1, min(T_c, limit) + 1):
        cost = -(-bh * splits // sms) * -(-T_c // splits) * block_s + splits * slice_s
        if best_cost is None or cost < best_cost:
            best_cost, best = cost, splits
    return best


# ---- KV-cache decode (split-KV) ---------------------------------------------------------------

def decode_plan(dtype_name: str, HD: int, causal: bool, max_smem: int, local: bool = False,
                hooked: bool = False, config=None) -> Plan:
    """The decode's three kernels: the split attention, the splits' combine, the append
    (config: an explicit DecodeConfig, the tests'; else the table's tile for this GPU)."""
    cfg = config or _plan.decode_config(HD, max_smem)
    if cfg.smem_bytes > max_smem:  # (an explicit tile: the launch would fail with no reason)
        raise ValueError(f"decode tile {cfg} needs {cfg.smem_bytes} bytes of shared memory per "
                         f"thread block; this GPU gives at most {max_smem}")
    return Plan(cfg, _plan.decode_kernel_names(dtype_name, cfg, causal, local, hooked),
                {"main": cfg.smem_bytes, "combine": 0, "append": 0})


def decode_grid(num_splits: int, units: int, row_tiles: int, batch: int) -> tuple:
    """(splits, groups of packed query heads x row tiles, batch): one thread block per split
    of an entry's keys and tile of packed query rows (fa2_decode.cu)."""
    return (num_splits, units * row_tiles, batch)


def decode_combine_grid(batch: int, rows_per_entry: int) -> tuple:
    """fa2_decode_combine: a warp per query row (heads x seqlen_q of each entry), four per
    block, the entries along y (as the decode kernel's grid has them along z)."""
    return ((rows_per_entry + 3) // 4, batch, 1)


def decode_num_splits(batch: int, units: int, row_tiles: int, seqlen_k: int, slots: int,
                      cfg, paged: bool) -> int:
    """num_splits=0's choice for tile cfg (cuflash/reference.py num_splits_for; slots: the SMs
    times the tile's thread blocks per SM). Kept per arguments: a decode loop asks the same
    question every step (with lengths on the GPU, seqlen_k is the cache's capacity)."""
    return _num_splits(batch, units, row_tiles, seqlen_k, slots, cfg.B_c, cfg.nwarps, paged)


@functools.lru_cache(maxsize=4096)
def _num_splits(batch, units, row_tiles, seqlen_k, slots, B_c, nwarps, paged) -> int:
    from . import reference
    return reference.num_splits_for(batch, units, row_tiles, seqlen_k, slots, B_c, nwarps,
                                     paged=paged)


def _decode_plans(dt, HD, causal, smem, bulk, local=False, hooked=False) -> list[Plan]:
    """The table's decode tile and, where it has one that fits, its streaming replacement
    (_plan.DECODE_STREAM: launches that fill the GPU without splitting)."""
    plan = decode_plan(dt, HD, causal, smem, local, hooked)
    stream = _plan.decode_stream_tile(plan.cfg, smem)
    return [plan] + ([] if stream is None else
                     [decode_plan(dt, HD, causal, smem, local, hooked, stream)])


FA2_DECODE = Variant("fa2_decode", _plan.DECODE_FILE, _params.DECODE, ("80", "90"),
                     _decode_plans)


# ---- the registry ------------------------------------------------------------------------------

VARIANTS = (FA2_FORWARD, FA2_BACKWARD, FA1_FORWARD, FA2_FORWARD_SM90, FA2_BACKWARD_SM90,
            FA2_DECODE)


def _planned_launches(arch: str, variants=VARIANTS):
    """(variant, the device's shared memory per block, plan) of every plan the variants may
    launch on a GPU of compile-check class `arch` ("80", "90" or "90a", _plan.ARCH_SMEM): the
    plans for each shared-memory size of that class, every dtype, head-dim bucket and mask."""
    smems, bulk = _plan.ARCH_SMEM[arch], _plan.has_bulk_copy(int(arch.rstrip("a")))
    for variant in variants:
        if arch not in variant.arch_classes:
            continue
        for dt in _plan.ELEMENT_TAGS:
            for HD in _plan.HEAD_DIM_BUCKETS:
                for causal, local, hooked, packed, odd_d in itertools.product((False, True),
                                                                              repeat=5):
                    if (local or hooked) and not variant.features or \
                            packed and not variant.packed or \
                            odd_d and not (variant.odd_d and local and hooked):
                        continue
                    features = {"local": local, "hooked": hooked} if local or hooked else {}
                    if packed:
                        features["packed"] = True
                    if odd_d:
                        features["odd_d"] = True
                    for smem in smems:
                        for plan in variant.plans(dt, HD, causal, smem, bulk, **features):
                            yield variant, smem, plan


def specialisations(arch: str, variants=VARIANTS) -> list[tuple[str, str, object]]:
    """(kernel file, name expression, tile or None) of every kernel the variants may launch
    on a GPU of compile-check class `arch` (_planned_launches)."""
    out = [(variant.source, name, plan.cfg if plan.smem[role] else None)
           for variant, _, plan in _planned_launches(arch, variants)
           for role, name in plan.kernels.items()]
    return list(dict.fromkeys(out))


def static_smem_room(arch: str, variants=VARIANTS) -> dict:
    """name expression -> the most static shared memory that kernel may declare on a GPU of
    class `arch`: the least, over its plans, of the device's limit per block less the dynamic
    shared memory the plan launches it with (the launch fails where static + dynamic exceed
    the limit; the compile check compares each kernel's static bytes against this)."""
    room: dict = {}
    for _, smem, plan in _planned_launches(arch, variants):
        for role, name in plan.kernels.items():
            room[name] = min(room.get(name, smem), smem - plan.smem[role])
    return room
