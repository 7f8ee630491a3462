#!/bin/bash
# Session 28, call 4 (the final code): session 27's staged call as it stood, the whole GPU
# suite, then the forward's standard grid (issue 17, with Q_i loaded per consumer warpgroup)
# and the backward's (issue 18).
exec bash bench/results/session27/next/s28a.sh
