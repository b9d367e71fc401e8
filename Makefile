# `make test` builds .venv from scratch (only Python 3.10+ and make needed)
# and runs the whole suite.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: test train clean cuda-check

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(VENV)/bin/python -m pip install -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(VENV)/bin/python -m pytest

# `make train`: ResNet-50 on Fashion-MNIST, data parallel over 2 MPI ranks
# (README.md, "Training ResNet-50"). DATA_DIR=... uses your own copy of the
# IDX files; TRAIN_ARGS=... adds options, e.g. TRAIN_ARGS='--arch resnet18'.
NP ?= 2
DATA_DIR ?=
TRAIN_ARGS ?=
FASHION_DIR := /usr/share/datasets/fashion-mnist
TRAIN_STAMP := $(VENV)/.train-installed
TRAIN_FLAGS = $(if $(DATA_DIR), --data-dir $(DATA_DIR))$(if $(TRAIN_ARGS), $(TRAIN_ARGS))

$(TRAIN_STAMP): $(STAMP)
	$(VENV)/bin/python -m pip install -e '.[mpi,plot,progress,image]'
	touch $(TRAIN_STAMP)

train: $(TRAIN_STAMP)
	@if [ -z "$(DATA_DIR)" ] && [ -z "$$MINICHAIN_DATASET_ROOT" ] && \
	    [ ! -d $(FASHION_DIR) ]; then \
	  if command -v apt-get >/dev/null 2>&1; then \
	    if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	    echo "Fashion-MNIST: installing Debian's dataset-fashion-mnist"; \
	    $$SUDO apt-get install -y dataset-fashion-mnist || \
	      { $$SUDO apt-get update && \
	        $$SUDO apt-get install -y dataset-fashion-mnist; } || exit 1; \
	  else \
	    echo "Fashion-MNIST is missing and apt-get is not available. Put" \
	      "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz," \
	      "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz" \
	      "(github.com/zalandoresearch/fashion-mnist) in a folder and" \
	      "run: make train DATA_DIR=/that/folder" >&2; \
	    exit 1; \
	  fi; \
	fi
	$(VENV)/bin/mpiexec -n $(NP) $(VENV)/bin/python \
	  models/train_resnet50.py$(TRAIN_FLAGS)

clean:
	rm -rf $(VENV) build *.egg-info

# `make cuda-check`: every CUDA kernel compiled by NVRTC through CuPy's own
# code generator (sm_80, sm_90; float16/32/64; 32/64-bit indexing) and every
# CuPy name the code uses checked, with no GPU, in .venv-cuda12 and
# .venv-cuda13 (CuPy, NVRTC, headers, NCCL from PyPI). CUDA_MAJORS=13 runs
# one of them.
CUDA_MAJORS ?= 12 13

cuda-check:
	bash .ci/cuda_check.sh $(CUDA_MAJORS)

# `make bench` builds .venv-bench (PyTorch's CPU build beside minichain, for
# the side-by-side ratios) when missing, then runs the CPU benchmarks.
# bench/gpu_check.sh is for a GPU machine and is not run here.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_PIP_ARGS ?=

.PHONY: bench

$(BENCH_STAMP):
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install $(BENCH_PIP_ARGS) torch==2.13.0 numpy
	$(BENCH_VENV)/bin/python -m pip install -e '.[mpi]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/resnet50_step.py
	$(BENCH_VENV)/bin/python bench/scaling.py
	$(BENCH_VENV)/bin/python bench/scaling_model.py
