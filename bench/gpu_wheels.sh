#!/usr/bin/env bash
# The wheels the GPU image lacks, fetched here into .whl/ (git-ignored) for bench/gpu_check.sh.
#
# The image (device tool's KINDS.md) holds every dependency of cnncompare but dacite, and has no
# package index: the device call names .whl in `carry`. Python 3.12 there, x86-64, pure-Python
# wheels only here.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.whl/' >> .git/info/exclude; }
# The version installed here (the one the suite passed with), else the newest.
version=$(python3 -c 'import importlib.metadata as m; print("==" + m.version("dacite"))' 2>/dev/null || true)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform any -d .whl "dacite$version"
ls -l .whl
