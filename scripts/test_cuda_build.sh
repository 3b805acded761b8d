#!/usr/bin/env bash
# The package built against the StarPU with CUDA workers (make starpu-cuda), on a
# machine without a GPU: a copy of the working tree in build/cuda-tree, its extensions
# built there in place (the .venv keeps the CPU build), and tests run on it. There
# StarPU starts no CUDA worker, so every test must pass as on the CPU build; the tests
# that need a GPU skip. Arguments: the tests to run (default: a set that covers the
# runtime, the ops, training, HF models, failures, out of core and several processes).
#
# Environment: VPY (the .venv's python), STARPU_CUDA_PREFIX (.cache/starpu-cuda).
set -euo pipefail
cd "$(dirname "$0")/.."

VPY=$(realpath -s "${VPY:-.venv/bin/python}")  # -s: the venv's link, not the interpreter it points to
PREFIX=$(realpath -m "${STARPU_CUDA_PREFIX:-.cache/starpu-cuda}")
TREE=build/cuda-tree
[ -f "$PREFIX/lib/pkgconfig/starpu-1.4.pc" ] || { echo "test_cuda_build: no CUDA StarPU in $PREFIX (make starpu-cuda)" >&2; exit 1; }

rm -rf "$TREE"
mkdir -p "$TREE"
git ls-files -co --exclude-standard | grep -v '^\(\.cache\|build\|dist\|site\)/' | tar cf - -T - | tar xf - -C "$TREE"
cd "$TREE"
PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" "$VPY" setup.py -q build_ext --inplace >build.log 2>&1 ||
    { tail -n 30 build.log >&2; exit 1; }
PYTHONPATH="$PWD/src" "$VPY" -c 'import torch_nntile, sys; assert torch_nntile.built_with_cuda(), "not the CUDA build"; print("CUDA build:", torch_nntile.__file__)'
if [ $# -eq 0 ]; then
    set -- tests/test_cuda.py tests/test_cuda_build.py tests/test_errors.py tests/test_ops.py tests/test_training.py \
        tests/test_hf_models.py tests/test_faults.py tests/test_ooc.py tests/test_mpi.py tests/test_workers.py
fi
STARPU_HOME="$PWD/.starpu" PYTHONPATH="$PWD/src" "$VPY" -m pytest -q -p no:cacheprovider "$@"
