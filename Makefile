# The two commands a fresh machine needs (README): `make report` and `make test`.
# Each builds .venv first if it is missing or stale; nothing else is installed by hand.

PYTHON ?= python3
VENV   ?= .venv
# A CPU build of torch lies on this project's machines' disk; an unpinned `torch`
# would pull a multi-GB CUDA build. Where the system Python already has torch
# (GPU machines carry 2.11), the venv sees it and nothing is downloaded. That Python may itself be
# a venv (the GPU image's is), whose packages --system-site-packages would not show: the .pth
# file names its site-packages.
TORCH  ?= torch==2.13.0
ARGS   ?= --backends all

BIN := $(VENV)/bin

.PHONY: report test clean-venv

$(BIN)/.installed: pyproject.toml plugins/cnncompare-amp/pyproject.toml plugins/cnncompare-onnxruntime/pyproject.toml Makefile
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
		echo "using the system's torch: $$($(PYTHON) -c 'import torch; print(torch.__version__)')"; \
		$(PYTHON) -m venv --system-site-packages $(VENV) && \
		$(PYTHON) -c 'import site, sys; print(*site.getsitepackages(), sep="\n")' \
			> "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_outer_python.pth"; \
	else \
		$(PYTHON) -m venv $(VENV) && $(BIN)/python -m pip install -q "$(TORCH)"; \
	fi
	$(BIN)/python -m pip install -q -e ".[test,plot]" -e plugins/cnncompare-amp -e plugins/cnncompare-onnxruntime
	@touch $@

# The main job: every backend on every device at the default (seed) config,
# with the plugins under plugins/ installed (cnncompare-amp; cnncompare-onnxruntime, inference only).
report: $(BIN)/.installed
	$(BIN)/cnncompare $(ARGS)

# Lint and type-check first (seconds), then the suite in two worker processes, each test file
# whole on one of them (its module fixtures run once): a test's cells wait on processes, compilers
# and sockets about half the time, so two workers keep both cores busy.
test: $(BIN)/.installed
	$(BIN)/ruff check src tests plugins bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

clean-venv:
	rm -rf $(VENV)
