#!/usr/bin/env bash
# bench/gpu_check.sh against an emulation of the GPU machine's image, here, before any lease.
#
#     bash bench/emulate_gpu_image.sh            # OUT=/tmp/cnnc-gpu-out by default
#
# The image (device tool's KINDS.md): `python3` is a virtual environment holding torch and
# pluggy, tabulate, psutil, numpy, scipy, tqdm, matplotlib, pytest, setuptools and wheel (no
# dacite), with no package index. Emulated: such a venv (built once, under $IMAGE) first on PATH
# as python3, pip with no index and no config, and the tree as the device tool sends it (tracked
# and untracked-not-ignored files, plus the carried .whl/) in a scratch folder. With no GPU the
# cuda rows end `skipped` and the CUDA tests skip; every stage must get through.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${IMAGE:-/tmp/cnnc-gpu-image}
torch=${TORCH:-torch==2.13.0}
out=${OUT:-/tmp/cnnc-gpu-out}
if [ ! -x "$image/bin/python3" ]; then
    python3 -m venv "$image"
    "$image/bin/python" -m pip install -q "$torch" pluggy tabulate psutil numpy scipy tqdm matplotlib pytest \
        setuptools wheel
fi
[ -d .whl ] || bash bench/gpu_wheels.sh
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
git ls-files -co --exclude-standard -z | tar --null -cf - -T - | tar -xf - -C "$tree"
cp -r .whl "$tree/"
rm -rf "$out"
cd "$tree"
env PATH="$image/bin:$PATH" PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null CNNC_SITE=/tmp/cnnc-gpu-site \
    DEVICES=${DEVICES:-cpu,cuda} OUT="$out" bash bench/gpu_check.sh
echo "results under $out:"
ls -l "$out"
# The check passed only if every stage did.
grep -q "matrix exit 0" "$out/log.txt" && grep -q "smoke exit 0" "$out/log.txt" &&
    { [ "${TESTS:-1}" = 0 ] || grep -q "tests exit 0" "$out/log.txt"; }
