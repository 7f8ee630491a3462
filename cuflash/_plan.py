"""Launch planner: tile shapes per head dim, shared-memory sizes, grids, and the list of every
kernel specialisation the package can launch (the CPU compile check builds all of them)."""

from __future__ import annotations

from dataclasses import dataclass

# Head dims are rounded up to one of these compiled buckets; the real d (a multiple of 8) is
# zero-padded inside shared memory, never in HBM.
HEAD_DIM_BUCKETS = (32, 64, 96, 128, 160, 192, 224, 256)
MAX_HEAD_DIM = HEAD_DIM_BUCKETS[-1]

# numpy dtype name -> C++ element tag (kernels/common.cuh)
ELEMENT_TAGS = {"float16": "cuflash::fp16", "bfloat16": "cuflash::bf16"}


def head_dim_bucket(d: int) -> int:
    for bucket in HEAD_DIM_BUCKETS:
        if d <= bucket:
            return bucket
    raise ValueError(f"head dim {d} > {MAX_HEAD_DIM} is not supported")


@dataclass(frozen=True)
class ForwardConfig:
    """Tile shape of the FA2 forward kernel (kernels/fa2_forward.cu, ForwardTile)."""

    D: int       # head-dim bucket
    B_r: int     # rows of Q per thread block
    B_c: int     # rows of K/V per column block
    nwarps: int  # warps per thread block; each owns B_r / nwarps rows of Q

    @property
    def threads(self) -> int:
        return 32 * self.nwarps

    @property
    def smem_bytes(self) -> int:
        # Q_i (B_r x D) + K_j (B_c x D) + V_j (B_c x D), 2 bytes per element.
        return 2 * (self.B_r + 2 * self.B_c) * self.D


# Tile shapes (B_r, B_c, warps) per head-dim bucket and mask, in order of preference; the
# first whose shared memory fits the device is used (sm_86/89/120 allow 99 KB per block,
# sm_80 163 KB, sm_90 227 KB). Each is spill-free on sm_80 and sm_90 (the CPU compile check
# enforces it) and was the fastest spill-free shape measured on the H200 (PERFORMANCE.md).
_FORWARD_CONFIGS = {
    # D: (non-causal shapes, causal shapes)
    32: ([(64, 64, 4)], [(64, 64, 4)]),
    64: ([(64, 64, 4)], [(64, 64, 4)]),
    96: ([(64, 64, 4)], [(64, 64, 4)]),
    128: ([(64, 128, 4)], [(64, 64, 4)]),
    160: ([(128, 64, 8)], [(128, 64, 8)]),
    192: ([(128, 64, 8)], [(128, 64, 8)]),
    224: ([(128, 32, 8)], [(128, 32, 8)]),
    256: ([(64, 32, 4)], [(64, 32, 4)]),
}


def forward_configs(D: int, causal: bool) -> list[ForwardConfig]:
    return [ForwardConfig(D, *shape) for shape in _FORWARD_CONFIGS[D][int(bool(causal))]]


def forward_config(D: int, causal: bool,
                   max_smem_bytes: int = 227 * 1024) -> ForwardConfig:
    """The tile shape used for head-dim bucket D on a device allowing `max_smem_bytes` of
    dynamic shared memory per block."""
    for cfg in forward_configs(D, causal):
        if cfg.smem_bytes <= max_smem_bytes:
            return cfg
    raise RuntimeError(f"no forward tile for head dim bucket {D} fits in {max_smem_bytes} "
                       "bytes of shared memory")


def forward_kernel_name(dtype_name: str, cfg: ForwardConfig, causal: bool) -> str:
    tag = ELEMENT_TAGS[dtype_name]
    return (f"cuflash::fa2_forward<{tag}, {cfg.D}, {cfg.B_r}, {cfg.B_c}, {cfg.nwarps}, "
            f"{'true' if causal else 'false'}>")


FORWARD_FILE = "fa2_forward.cu"


def all_specialisations() -> list[tuple[str, str]]:
    """(kernel file, name expression) of every kernel the package may launch."""
    specs = []
    for dtype_name in ELEMENT_TAGS:
        for D in HEAD_DIM_BUCKETS:
            for causal in (False, True):
                for cfg in forward_configs(D, causal):
                    specs.append((FORWARD_FILE, forward_kernel_name(dtype_name, cfg, causal)))
    return specs
