#!/usr/bin/env bash
# The whole GPU check as one command that fits a short device lease.
#
# Before the lease, here (once): the wheels the image lacks, into .whl/ (git-ignored, carried):
#     bash bench/gpu_wheels.sh
# and the same check against an emulation of the image (bench/emulate_gpu_image.sh) must pass.
# On the lent GPU machine, from the repository root (the device tool's `run`, carry [".whl"]):
#     OUT=$OUT bash bench/gpu_check.sh
#
# The image: `python3` is itself a virtual environment (/opt/torch/.venv, Python 3.12, torch 2.11
# with CUDA) holding pluggy, tabulate, psutil, numpy, scipy, tqdm, matplotlib, pytest, setuptools
# and wheel, and no package index. A venv made from it would not see that venv's packages, so
# nothing is made: cnncompare, the amp plugin and the carried wheels are installed with
# `--target` into one folder put on PYTHONPATH (no index, no build isolation, nothing fetched),
# and everything runs as `python3 -m …`.
#
# Stages, in order of value, each bounded so that what finished comes back under $OUT (at most
# 8 files), the whole within BUDGET_S (480 s: a rerun still fits 15 minutes of device time):
#   1. install and environment: torch, the GPU, nvidia-smi, the backends  -> log.txt
#   2. the seed matrix on the device, every backend but max-autotune's two (MATRIX_BACKENDS):
#      the report to commit under reports/ (as
#      reports/<kind>-seed.*); rewritten after every cell and round 1 runs every backend
#      before round 2 starts, so a stage cut by the budget still returns whole rounds
#                                                                         -> cuda-seed.md/.json + charts
#   3. smoke: every backend at a tiny config, one round (max-autotune's too) -> cuda-tiny.json
#   4. the CUDA, device and end-to-end tests with the GPU present         -> log.txt
#
# Where the time goes there (estimated from the CPU cells: cold inductor compiles of this model
# take 10-20 s on the CPU; Triton's are of the same order with 16 compile workers, and
# max-autotune benchmarks kernels on top): about 30 s per torch.compile cell in round 1 and a
# few seconds per cell in later rounds (warm cache), 1-2 s for eager and TorchScript cells.
set -uo pipefail

out=${OUT:?set OUT to the folder the results go to}
devices=${DEVICES:-cuda}
budget=${BUDGET_S:-480}
matrix_args=${MATRIX_ARGS:-}
# The seed matrix leaves out the two max-autotune modes: autotuning convolutions and matmuls can
# take minutes per cell, and a round 1 stuck in them would leave the report without the rest.
# They run in the smoke stage (tiny config), bounded like every stage.
matrix_backends=${MATRIX_BACKENDS:-eager,eager-fused,channels-last,jit-trace,jit-script,compile,compile-step,compile-reduce-overhead,aot-eager,compile-channels-last,amp-bf16,compile-amp-bf16,amp-fp16,compile-amp-fp16}
site=${CNNC_SITE:-/tmp/cnnc-site}
log="$out/log.txt"
export PYTHONUNBUFFERED=1
mkdir -p "$out"
start=$SECONDS
left() { echo $(( budget - (SECONDS - start) )); }
# `timeout` with what is left of the budget, less `reserve` seconds kept for later stages
# (`timeout 0` would mean no limit at all).
bounded() {
    local reserve=$1 t
    shift
    t=$(( $(left) - reserve ))
    if [ "$t" -lt 10 ]; then echo "skipped: the budget is spent"; return 124; fi
    timeout "$t" "$@"
}

{
    echo "== 1. install and environment ($(date -u +%FT%TZ))"
    rm -rf "$site"
    # shellcheck disable=SC2046  # the carried wheels, if any
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --no-compile \
        --target "$site" $(ls .whl/*.whl 2>/dev/null) . plugins/cnncompare-amp ||
        { echo "install failed (did bench/gpu_wheels.sh run, and is .whl carried?)"; exit 1; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])' || exit 1
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 || true
    python3 -m cnncompare list || exit 1

    echo "== 2. the seed matrix on $devices ($(left) s left)"
    # shellcheck disable=SC2086  # MATRIX_ARGS is a list of options
    bounded 150 python3 -m cnncompare --backends "$matrix_backends" --devices "$devices" --timeout 240 \
        $matrix_args --output "$out/cuda-seed.md" > /dev/null
    echo "matrix exit $? (124: cut by the budget; finished cells and rounds are in the report)"

    echo "== 3. smoke: every backend on $devices, tiny config ($(left) s left)"
    bounded 90 python3 -m cnncompare --backends all --devices "$devices" --batch-size 4 --image-size 8 \
        --steps 5 --warmup 1 --rounds 1 --timeout 120 \
        --output /tmp/cnnc-tiny/cuda-tiny.md --json "$out/cuda-tiny.json" > /dev/null
    echo "smoke exit $?"

    if [ "${TESTS:-1}" != 0 ]; then
        echo "== 4. the CUDA, device and end-to-end tests with a GPU present ($(left) s left)"
        bounded 0 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py tests/test_devices.py tests/test_e2e.py
        echo "tests exit $?"
    fi
    echo "== done in $((SECONDS - start)) s"
} 2>&1 | tee "$log"
