#!/usr/bin/env bash
# The whole GPU check (issue 3) as one command that fits a short device lease.
#
# On the lent GPU machine, from the repository root (the device tool's `run`):
#     OUT=$OUT bash bench/gpu_check.sh
# Its image has python3 with torch 2.11 (CUDA), pluggy, tabulate, psutil, numpy, scipy, tqdm,
# matplotlib and setuptools, and no package index: cnncompare and the amp plugin are installed
# editable into a venv over that python, with no index and no build isolation.
#
# Stages, each bounded so that what finished comes back under $OUT (at most 8 files):
#   1. environment: torch, the GPU, nvidia-smi                          -> log.txt
#   2. smoke: every backend on the device at a tiny config (a minute):
#      what breaks only on CUDA shows here first                        -> cuda-tiny.json
#   3. the seed matrix on the device (the report to commit under reports/, as
#      reports/<kind>-seed.*; it is rewritten after every cell, so a stage cut
#      by the budget still returns its finished cells, marked interrupted)
#                                                                       -> cuda-seed.md/.json + 2 charts
#   4. the device and end-to-end tests with a GPU present (2 min)       -> log.txt
#
# A dry run here, without a GPU (cuda rows become `skipped`; an existing venv is used):
#     OUT=/tmp/gpu DEVICES=cpu,cuda CNNC_VENV=/tmp/venv TESTS=0 \
#       MATRIX_ARGS="--backends eager,compile --batch-size 4 --image-size 8 --steps 3" bash bench/gpu_check.sh
set -uo pipefail

out=${OUT:?set OUT to the folder the results go to}
devices=${DEVICES:-cuda}
budget=${BUDGET_S:-420}            # seconds for stages 2-3; with install and tests the call stays under 600
matrix_args=${MATRIX_ARGS:-}
log="$out/log.txt"
export PYTHONUNBUFFERED=1
mkdir -p "$out"
start=$SECONDS
left() { echo $(( budget - (SECONDS - start) )); }
# timeout with what is left of the budget (`timeout 0` would mean no limit at all).
bounded() { local t; t=$(left); if [ "$t" -lt 10 ]; then echo "skipped: the budget is spent"; return 124; fi; timeout "$t" "$@"; }

{
    echo "== 1. environment ($(date -u +%FT%TZ))"
    if [ -n "${CNNC_VENV:-}" ]; then
        bin="$CNNC_VENV/bin"
    else
        python3 -m venv --system-site-packages /tmp/cnnc-venv &&
            /tmp/cnnc-venv/bin/python -m pip install -q --no-index --no-deps --no-build-isolation \
                -e . -e plugins/cnncompare-amp || { echo "install failed"; exit 1; }
        bin=/tmp/cnnc-venv/bin
    fi
    "$bin/python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 || true
    "$bin/cnncompare" --list

    echo "== 2. smoke: every backend on $devices, tiny config"
    bounded "$bin/cnncompare" --backends all --devices "$devices" --batch-size 4 --image-size 8 \
        --steps 5 --warmup 1 --rounds 1 --timeout 120 --compile-threads 8 \
        --output /tmp/cnnc-tiny/cuda-tiny.md --json "$out/cuda-tiny.json" > /dev/null
    echo "smoke exit $?"

    echo "== 3. the seed matrix on $devices ($(left) s left)"
    # Compile workers in parallel (16 cores there): cold compiles are most of a cell.
    # shellcheck disable=SC2086  # MATRIX_ARGS is a list of options
    bounded "$bin/cnncompare" --backends all --devices "$devices" --timeout 150 --compile-threads 8 \
        $matrix_args --output "$out/cuda-seed.md" > /dev/null
    echo "matrix exit $? (124/143: cut by the budget; finished cells are in the report)"

    if [ "${TESTS:-1}" != 0 ]; then
        echo "== 4. the device and end-to-end tests with a GPU present"
        timeout 120 "$bin/python" -m pytest -q -x -p no:cacheprovider tests/test_devices.py tests/test_e2e.py
        echo "tests exit $?"
    fi
    echo "== done in $((SECONDS - start)) s"
} 2>&1 | tee "$log"
