# `make test` builds .venv from scratch (only Python 3.10+ and make needed)
# and runs the whole suite.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: test test-other-cpu test-peeled train clean cuda-check test-openmpi \
	test-slurm

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(VENV)/bin/python -m pip install -e '.[test]'
	@# Until 2026-12 the distribution was named minichain (taken on PyPI by
	@# another project): an editable install under that name in an old
	@# .venv would register the pytest plugin twice.
	$(VENV)/bin/python -m pip uninstall -y -q minichain 2>/dev/null || true
	touch $(STAMP)

# MINICHAIN_REQUIRE_MPI: a multi-rank test fails (saying what to install)
# instead of skipping when no launcher is found. MINICHAIN_CHECK_LEFTOVERS:
# the session's last test fails if it left files in /dev/shm or /tmp
# (tests/test_leftovers.py; the machine must be ours alone).
test: $(STAMP)
	MINICHAIN_REQUIRE_MPI=1 MINICHAIN_CHECK_LEFTOVERS=1 \
	  $(VENV)/bin/python -m pytest

# `make test-peeled`: the lesson without its layers (tests/peel.py): a copy
# of the package with every layer folder and its `# layer:` line deleted
# imports and passes the lesson's tests (the tape, the ops' gradient
# checks, ResNet-50, every averaging mode against one process at 2 and 3
# ranks, the reading order's docs pages); then each layer alone deleted.
test-peeled: $(STAMP)
	MINICHAIN_REQUIRE_MPI=1 $(VENV)/bin/python tests/peel.py
	MINICHAIN_REQUIRE_MPI=1 $(VENV)/bin/python tests/peel.py --each

# `make test-other-cpu`: the single-process tests again on the NumPy
# kernels (oneDNN's off) with one BLAS (and minichain) thread and
# OpenBLAS's AVX2 kernels (Haswell), so that CI on one machine also sees
# another summation order than the first leg's (oneDNN where it installs,
# the machine's own BLAS kernels, its thread count). A test whose outcome
# hinges on rounding fails in one of the two legs.
OTHER_CPU ?= MINICHAIN_ONEDNN=never OPENBLAS_NUM_THREADS=1 \
	OMP_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell

test-other-cpu: $(STAMP)
	$(OTHER_CPU) MINICHAIN_REQUIRE_MPI=1 $(VENV)/bin/python -m pytest \
	  -m 'not mpi' -q

# `make train`: ResNet-50 on Fashion-MNIST, data parallel over 2 MPI ranks
# (README.md, "Training ResNet-50"). DATA_DIR=... uses your own copy of the
# IDX files; TRAIN_ARGS=... adds options, e.g. TRAIN_ARGS='--arch resnet18'.
# The launcher is minichain.dist.launcher's: the venv's MPICH, or
# $$MINICHAIN_MPIEXEC (e.g. MINICHAIN_MPIEXEC=mpirun with an mpi4py built
# for that MPI); GRACE=30 gives the ranks 30 s to stop under Open MPI.
NP ?= 2
DATA_DIR ?=
TRAIN_ARGS ?=
GRACE ?=
FASHION_DIR := /usr/share/datasets/fashion-mnist
TRAIN_STAMP := $(VENV)/.train-installed
TRAIN_FLAGS = $(if $(DATA_DIR), --data-dir $(DATA_DIR))$(if $(TRAIN_ARGS), $(TRAIN_ARGS))

$(TRAIN_STAMP): $(STAMP)
	$(VENV)/bin/python -m pip install -e '.[mpi,plot,progress,image,onednn]'
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
	$(VENV)/bin/python -m minichain.dist.launcher -n $(NP) \
	  $(if $(GRACE),--grace $(GRACE)) $(VENV)/bin/python \
	  -m models.train_resnet50$(TRAIN_FLAGS)

clean:
	rm -rf $(VENV) $(OMPI_VENV) build *.egg-info

# `make test-openmpi`: the multi-rank tests (tests/dist, the training
# scripts, the docs pages) under Open MPI's mpirun, with mpi4py compiled
# against it in .venv-openmpi (no MPICH wheel there). Debian's openmpi-bin
# and libopenmpi-dev are installed with apt-get when mpicc is missing;
# elsewhere set OMPI_BIN to the folder holding Open MPI's mpicc and mpirun.
OMPI_VENV := .venv-openmpi
OMPI_STAMP := $(OMPI_VENV)/.installed
OMPI_BIN ?=
OMPI_TESTS ?= tests/dist tests/models tests/test_docs.py \
	tests/test_leftovers.py
# Debian names Open MPI's programs mpicc.openmpi and mpirun.openmpi (a
# shell expression: it is looked up when the recipe line runs).
OMPI_PROG = $(if $(OMPI_BIN),$(OMPI_BIN)/$(1),$$(command -v $(1).openmpi \
	|| echo $(1)))

$(OMPI_STAMP): setup.cfg pyproject.toml
	@if [ -z "$(OMPI_BIN)" ] && ! command -v mpicc.openmpi >/dev/null && \
	    ! command -v mpicc >/dev/null; then \
	  if ! command -v apt-get >/dev/null 2>&1; then \
	    echo "Open MPI is missing: install it (its mpicc and mpirun)," \
	      "then run: make test-openmpi OMPI_BIN=/its/bin" >&2; exit 1; \
	  fi; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  echo "Open MPI: installing Debian's openmpi-bin and libopenmpi-dev"; \
	  $$SUDO apt-get install -y --no-install-recommends openmpi-bin \
	      libopenmpi-dev || { $$SUDO apt-get update && \
	    $$SUDO apt-get install -y --no-install-recommends openmpi-bin \
	      libopenmpi-dev; } || exit 1; \
	fi
	test -x $(OMPI_VENV)/bin/python || $(PYTHON) -m venv $(OMPI_VENV)
	$(OMPI_VENV)/bin/python -m pip install --upgrade pip
	MPICC=$(call OMPI_PROG,mpicc) $(OMPI_VENV)/bin/python -m pip install \
	  --no-cache-dir --no-binary mpi4py mpi4py
	$(OMPI_VENV)/bin/python -m pip install -e '.[test-system]'
	touch $(OMPI_STAMP)

test-openmpi: $(OMPI_STAMP)
	MINICHAIN_MPIEXEC=$(call OMPI_PROG,mpirun) MINICHAIN_REQUIRE_MPI=1 \
	  MINICHAIN_CHECK_LEFTOVERS=1 $(OMPI_VENV)/bin/python -m pytest $(OMPI_TESTS)

# `make test-slurm`: a one-node Slurm on this machine (.ci/slurm-cluster
# starts munged, slurmctld and slurmd as root, installing Debian's
# slurm-wlm and munge when missing, and stops them again), then sbatch of
# models/train_resnet50.sbatch with 2 tasks, a pre-emption by
# scancel --signal=TERM and a resumed job, with .venv (MPICH, srun
# --mpi=pmi2) and with .venv-openmpi (srun --mpi=pmix).
SLURM_DIR := .slurm
SLURM_TEST := tests/models/test_train_resnet50_sbatch.py

test-slurm: $(STAMP) $(OMPI_STAMP)
	.ci/slurm-cluster start $(SLURM_DIR)
	export SLURM_CONF=$(CURDIR)/$(SLURM_DIR)/slurm.conf; \
	  $(VENV)/bin/python -m pytest $(SLURM_TEST) && \
	  $(OMPI_VENV)/bin/python -m pytest $(SLURM_TEST); \
	  status=$$?; .ci/slurm-cluster stop $(SLURM_DIR); exit $$status

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
	$(BENCH_VENV)/bin/python -m pip install -e '.[mpi,onednn]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/resnet50_step.py
	$(BENCH_VENV)/bin/python bench/scaling.py
	$(BENCH_VENV)/bin/python bench/scaling_model.py
