# One entry point for a fresh machine: `make demo` (the main job: ebm train, then ebm sample, on the bundled
# default configurations), `make test` (all tests) and, on a GPU machine, `make gpu-check` (docs/cuda.md).
# Both create .venv, install the CPU build of PyTorch, Triton (pinned to the version torch's CUDA wheel pins: the tests
# run the Triton kernels under its interpreter and compile them for sm_80/sm_90 without a GPU), the core and every
# plugin under plugins/.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PLUGINS := $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/pyproject.toml))
# plugin extras the tests need: ebm-samplers[arviz] (ArviZ export, netCDF draws), ebm-losses[images]
# (scikit-learn's digits and PNG folders), ebm-losses[ot] (POT, energy matching's optimal-transport coupling),
# ebm-losses[tensorboard] (the live log's TensorBoard events, read back by the tests),
# ebm-cuda[triton] (the Triton kernels; pinned above)
EXTRAS := plugins/ebm_samplers=arviz plugins/ebm_losses=images,ot,tensorboard plugins/ebm_cuda=triton
PLUGIN_SPECS := $(foreach p,$(PLUGINS),"$(p)$(foreach e,$(filter $(p)=%,$(EXTRAS)),[$(patsubst $(p)=%,%,$(e))])")

.PHONY: setup demo test docs docs-serve gpu-check
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(wildcard plugins/*/pyproject.toml) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "setuptools>=77" wheel torch==2.13.0 triton==3.7.1
	$(PY) -m pip install --quiet --no-build-isolation -e ".[test,docs,plot]" $(addprefix -e ,$(PLUGINS))
	$(PY) -m pip install --quiet --no-build-isolation $(addprefix -e ,$(PLUGIN_SPECS))  # then their extras (one resolve with both fails)
	touch $@

demo: setup
	$(VENV)/bin/ebm train --out runs/train
	$(VENV)/bin/ebm sample --out runs/sample
	@echo "plots and metrics: runs/train/ (loss.png, density.png, landscape.png, metrics.json) and runs/sample/ (landscape.png, trace.png, autocorrelation.png, metrics.json)"

test: setup
	$(PY) -m pytest

docs: setup  ## build the documentation site strictly into site/ (any warning fails)
	$(VENV)/bin/mkdocs build --strict

docs-serve: setup  ## serve the documentation at http://127.0.0.1:8000 with live reload
	$(VENV)/bin/mkdocs serve

gpu-check:  ## on a GPU machine, in 9 minutes: builds, kernels vs host, compute-sanitizer, GPU tests, the distributed example, gpu.py's S/G3/T/G1: one results file and the tables (DRY=1: on the CPU)
	@bash benchmarks/gpu_check.sh $(if $(DRY),--dry)
