#!/bin/bash
# Staged for session 31 (not run): the whole GPU suite alone on main, or on main with the
# staged patches that land (after s31c.sh's A/B). Session 30's last change (fwd_packed at d 128
# on 128x176, e4641c1) had only the varlen and packed tests (101 passed); the whole suite
# passed on the commit before it (session30/call4). ~390 s with the precompile.
source bench/device_call.sh
precompile "fa1=True, windows=True, varlen=True, decode=True, max_workers=16"
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 \
  > $OUT/pytest_all.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_all.log | tail -3
