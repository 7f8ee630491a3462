"""GPU, 2 or more: ring attention over NCCL (cuflash.distributed), one process per GPU.

The workers are examples/ring_attention.py's (run_rank, started by its launch()). Skipped,
with the reason, where fewer than 2 GPUs are visible."""

import sys
from pathlib import Path

import numpy as np
import pytest

from cuflash import reference
from cuflash.distributed import zigzag_unshard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import ring_attention as ring_example  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def world():
    cp = pytest.importorskip("cupy")
    n = cp.cuda.runtime.getDeviceCount() if cp.cuda.is_available() else 0
    if n < 2:
        pytest.skip(f"ring attention needs 2 GPUs; {n} visible")
    try:
        from cupy.cuda import nccl
        nccl.get_unique_id()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"NCCL is not usable through CuPy here: {exc}")
    return 2


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("causal,heads_k,c,d,window,alibi", [
    (True, 4, 37, 64, (-1, -1), False), (False, 2, 64, 128, (-1, -1), False),
    (True, 1, 100, 128, (-1, -1), False), (True, 2, 51, 96, (-1, -1), False),
    (True, 2, 45, 64, (70, -1), False), (False, 2, 33, 128, (40, 25), True),
    (True, 4, 40, 64, (-1, -1), True)], ids=str)
def test_ring_equals_the_whole_sequence_by_the_accuracy_rule(world, dtype, causal, heads_k, c,
                                                             d, window, alibi):
    """out, lse, dq, dk, dv gathered from 2 GPUs against float64 attention on the whole
    sequence: at most 2x (3x for gradients) the error of naive attention in the same dtype.
    GQA/MQA, odd chunk lengths, head dims 64..128, both dtypes, sliding windows and ALiBi
    over the sequence's positions."""
    import cupy as cp
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    job = dict(mode="check", seqlen=2 * world * c, batch=2, heads=4, heads_k=heads_k,
               headdim=d, dtype=dt, causal=causal, seed=c, window_size=window, alibi=alibi)
    res = ring_example.launch(world, job, timeout=600)
    out = zigzag_unshard([r["out"] for r in res])
    lse = zigzag_unshard([r["lse"] for r in res], axis=2)
    grads = [zigzag_unshard([r["grads"][i] for r in res]) for i in range(3)]
    with cp.cuda.Device(0):
        q, k, v, dout = (cp.asnumpy(ring_example.full_sequence(job, w, world))
                         for w in range(4))

    def err(a, ref):
        return float(np.abs(np.asarray(a, np.float64) - ref).max())

    features = dict(window_size=window,
                    alibi_slopes=ring_example.alibi_slopes(job) if alibi else None)
    O, L = reference.attention_naive(q, k, v, causal, **features)
    naive = reference.attention_naive_same_dtype(q, k, v, causal, **features)
    assert out.dtype == dt and np.isfinite(out.astype(np.float32)).all()
    assert err(out, O) <= 2 * err(naive, O) + 1e-5, (err(out, O), err(naive, O))
    assert err(lse, L) <= 1e-3
    ref = reference.attention_backward_naive(dout, q, k, v, causal, **features)
    naive = reference.attention_backward_naive_same_dtype(dout, q, k, v, causal, **features)
    for name, g, r, n in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert g.shape == r.shape and g.dtype == dt
        assert err(g, r) <= 3 * err(n, r) + 1e-5, f"{name}: {err(g, r)} vs naive {err(n, r)}"


def test_a_lost_peer_raises_instead_of_hanging(world):
    """After one ring attention together, rank 1 exits; rank 0's next call (its shapes agreed
    already: only the ring's transfers wait on the peer, on the GPU) raises a RuntimeError
    from synchronize() within the watchdog's timeout instead of waiting forever."""
    import ml_dtypes
    job = dict(mode="lost_peer", seqlen=2 * world * 64, batch=1, heads=4, heads_k=4,
               headdim=64, dtype=ml_dtypes.bfloat16, causal=True, seed=0, timeout=10.0)
    (res,) = ring_example.launch(world, job, timeout=240)
    assert res["raised"] is not None, "rank 0 finished as if its peer were there"
    assert "ring attention" in res["raised"]
    assert res["seconds"] < 120
