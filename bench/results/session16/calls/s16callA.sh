#!/bin/bash
# Session 16, call A (one H200; run in a checkout of try-bwd-varlen, which holds try-dq-warp and next-gpu): the
# full suite, then the deterministic mode against the default in next-gpu (.diag/vnext) and
# try-dq-warp, one round (the second in call B) (.diag/s16_det_ab.py). <= 520 s.
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/kc CUFLASH_CACHE_DIR=/tmp/kc/compile_check
mkdir -p /tmp/kc; [ "$(ls /tmp/kc | wc -l)" -gt 100 ] || cat .diag/kcache/kc.tar.xz.* | tar -xJ -C /tmp/kc
S=$SECONDS
PYTEST_ARGS="-n 16 --durations=10" OUT=$OUT timeout 430 bash bench/gpu_check.sh tests > $OUT/gpu_check.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; tail -3 $OUT/pytest.log
for r in 1; do
  PYTHONPATH=$PWD/.diag/vnext OUT=$OUT timeout 60 python3 .diag/s16_det_ab.py next $r 2>&1 | tail -8
  PYTHONPATH=$PWD OUT=$OUT timeout 45 python3 .diag/s16_det_ab.py dqwarp $r 2>&1 | tail -8
done; echo "det ab at $((SECONDS-S))s"
