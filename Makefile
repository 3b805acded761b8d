# Set-up and entry points. `make demo` and `make test` install what is missing: StarPU
# built from Debian's source package into $(STARPU_PREFIX) (scripts/build_starpu.sh), a
# venv with torch 2.13.0 (CPU), and this package built against that StarPU.
PY ?= python3.11
VENV ?= .venv
VPY := $(VENV)/bin/python
export STARPU_HOME ?= $(CURDIR)/.starpu
export STARPU_SILENT ?= 1
export STARPU_PREFIX ?= $(CURDIR)/.cache/starpu
export PKG_CONFIG_PATH := $(STARPU_PREFIX)/lib/pkgconfig$(if $(PKG_CONFIG_PATH),:$(PKG_CONFIG_PATH))

.PHONY: setup starpu starpu-cuda demo test test-all test-check test-stress test-wheel test-wheel-cuda test-cuda wheel wheel-cuda bench bench-pages soak lint docs clean

$(VENV)/.done: Makefile pyproject.toml setup.py scripts/build_starpu.sh src/torch_nntile/runtime/_build_shim.py \
		$(wildcard src/torch_nntile/runtime/csrc/*) $(wildcard src/torch_nntile/backend/csrc/*) \
		$(wildcard src/torch_nntile/tiling/csrc/*) $(wildcard src/torch_nntile/graph/csrc/*)
	bash scripts/build_starpu.sh
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q setuptools wheel cffi numpy pytest ruff pydot expecttest==0.3.0 transformers==5.24.0 \
		scikit-learn==1.9.1 tqdm==4.70.1 matplotlib==3.11.2 \
		mkdocs==1.6.1 mkdocs-material==9.8.1 mkdocstrings==1.0.8 mkdocstrings-python==2.0.11
	$(VPY) -m pip install -q --no-build-isolation -e .
	touch $@

setup: $(VENV)/.done

# StarPU alone (reused when $(STARPU_PREFIX) holds the same version and options).
starpu:
	bash scripts/build_starpu.sh

# StarPU with CUDA workers too, against PyPI's CUDA 13.0 wheels, into .cache/starpu-cuda
# (no GPU needed to build it; the package is not built against it by default).
starpu-cuda:
	STARPU_CUDA=1 STARPU_PREFIX=$(CURDIR)/.cache/starpu-cuda bash scripts/build_starpu.sh

demo: setup
	$(VPY) examples/train_mlp.py

test: setup
	$(VPY) -m pytest -q

test-all: setup
	$(VPY) -m pytest -q -m ""

# The default suite with every reusable compile lowered again and compared with the
# lowered step it reuses (TORCH_NNTILE_CHECK_REUSE): finds a structure key that misses
# something lowering reads.
test-check: setup
	TORCH_NNTILE_CHECK_REUSE=1 $(VPY) -m pytest -q

# The default suite 10 times, each beside a second copy of it (busy cores expose
# tests that depend on how far asynchronous work has got). Nonzero unless 10/10.
test-stress: setup
	$(VPY) scripts/stress.py --rounds 10

# A manylinux wheel that carries its own libstarpu, in dist/ (scripts/build_wheel.sh:
# sdist, wheel from it, auditwheel repair by scripts/repair_wheel.sh). cp311-abi3: one
# wheel for every CPython from 3.11 on. Rebuilt each time: it takes seconds.
wheel: starpu
	PY=$(PY) bash scripts/build_wheel.sh

# The CUDA variant (torch_nntile-<version>+cu130), against the StarPU of `make starpu-cuda`:
# CUDA itself comes from NVIDIA's wheels, its dependencies. Beside the CPU wheel in dist/.
wheel-cuda: starpu-cuda
	PY=$(PY) TORCH_NNTILE_CUDA=1 PKG_CONFIG_PATH=$(CURDIR)/.cache/starpu-cuda/lib/pkgconfig bash scripts/build_wheel.sh

# That wheel installed into a fresh venv with torch 2.13.0 and checked there (slow).
test-wheel: setup wheel
	TORCH_NNTILE_WHEEL="$$(ls dist/torch_nntile-*.whl | grep -v +)" $(VPY) -m pytest -q -m slow tests/test_wheel.py

# The CUDA wheel, likewise, with NVIDIA's wheels from the registry (no GPU needed: no
# CUDA worker starts), and its import error once cuBLAS is uninstalled (slow).
test-wheel-cuda: setup wheel-cuda
	TORCH_NNTILE_CUDA_WHEEL="$$(ls dist/torch_nntile-*+cu*.whl)" $(VPY) -m pytest -q -m slow tests/test_cuda_build.py

# The package built against that StarPU, tested without a GPU (no CUDA worker starts;
# the GPU tests skip): scripts/test_cuda_build.sh, in build/cuda-tree.
test-cuda: setup starpu-cuda
	VPY=$(VPY) bash scripts/test_cuda_build.sh

bench: setup
	$(VPY) benchmarks/mlp_step.py

soak: setup
	$(VPY) benchmarks/soak.py

# The documentation site (mkdocs.yml) in site/; --strict fails on a broken link or a page
# missing from the nav. The API reference is read from src/ statically (nothing is imported).
# The Benchmarks page must be what benchmarks/results/*.json generate (bench-pages).
docs: setup
	$(VPY) benchmarks/report_pages.py --check
	NO_MKDOCS_2_WARNING=1 $(VPY) -m mkdocs build --strict --site-dir site

# Measure the benchmarks into benchmarks/results/*.json, one at a time, then regenerate
# the Benchmarks page's table and plots (docs/benchmarks.md, docs/img/bench-*.png) from them.
bench-pages: setup
	$(VPY) benchmarks/mlp_step.py --json benchmarks/results/mlp_step.json
	$(VPY) benchmarks/mlp_step.py --capture --json benchmarks/results/mlp_step-capture.json
	$(VPY) benchmarks/gpt2_step.py --json benchmarks/results/gpt2_step.json
	$(VPY) benchmarks/gpt2_step.py --capture --json benchmarks/results/gpt2_step-capture.json
	$(VPY) benchmarks/gpt2_step.py --size medium --json benchmarks/results/gpt2_step-medium.json
	$(VPY) benchmarks/cnn_step.py --json benchmarks/results/cnn_step.json
	$(VPY) benchmarks/mpi_step.py --json benchmarks/results/mpi_step.json
	$(VPY) benchmarks/report_pages.py

lint: setup
	$(VPY) -m ruff check src tests benchmarks examples scripts docs/scripts

clean:
	rm -rf $(VENV) build dist site .starpu src/*.egg-info src/torch_nntile/runtime/_shim* \
		src/torch_nntile/backend/_native* src/torch_nntile/backend/_views* src/torch_nntile/tiling/_structure* src/torch_nntile/graph/_refs*
