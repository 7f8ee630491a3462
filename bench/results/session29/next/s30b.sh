#!/bin/bash
# Staged for session 30 (not run), call 2: the whole GPU suite alone on the final code (run it
# only if last_pv.patch lands: main's own passed in session 29's call 2; ~410 s with the
# precompile, the compile check of every specialisation cold inside it).
source bench/device_call.sh
precompile "fa1=True, windows=True, varlen=True, decode=True, max_workers=16"
PYTHONPATH=$PWD timeout $((590-SECONDS+S)) python3 -m pytest -rfEs -q -p no:cacheprovider -n 16 --durations=10 \
  > $OUT/pytest_all.log 2>&1
echo "suite rc=$? at $((SECONDS-S))s"; grep -E "passed|failed|error" $OUT/pytest_all.log | tail -3
