#!/usr/bin/env bash
# Repairs a freshly built Linux wheel into a manylinux one that carries its own libstarpu,
# and checks what it carries. `make wheel` (scripts/build_wheel.sh) and the CI's
# cibuildwheel (its repair-wheel-command) both run this, so the CI repairs as here.
#
# auditwheel copies libstarpu and the libraries it needs that the manylinux policy does
# not promise (hwloc, ...) into torch_nntile.libs/ and points the extension's RPATH there.
# The extension links no torch library (BLAS pointers are looked up at run time), so
# nothing of torch's is grafted.
#
# A CUDA wheel (version +cu...): CUDA's libraries are NOT copied (they are the
# dependencies nvidia-cuda-runtime / nvidia-cublas, which pip puts in
# site-packages/nvidia/cu13/lib), and every file that needs one gets an RPATH entry to
# that folder relative to itself ($ORIGIN/../nvidia/cu13/lib for torch_nntile.libs/).
# Where they are elsewhere, torch_nntile.runtime.cuda_libs finds them at import.
#
# Usage: repair_wheel.sh RAW_WHEEL OUT_DIR. Environment: those of scripts/wheel_tools.sh.
# Prints the repaired wheel's path last.
set -euo pipefail
[ $# = 2 ] || { echo "usage: $0 RAW_WHEEL OUT_DIR" >&2; exit 2; }
raw=$(realpath "$1")
out=$(realpath -m "$2")
cd "$(dirname "$0")/.."

TOOLS=$(bash scripts/wheel_tools.sh)
CUDA_LIBS=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13)
NVIDIA_LIB_DIR=nvidia/cu13/lib  # relative to site-packages
name=$(basename "$raw")
cuda=0
case "${name#*-}" in *+cu*) cuda=1 ;; esac

LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
mkdir -p "$out"
# --plat auto: the most compatible manylinux tag the symbols allow (glibc 2.34 on bookworm).
exclude=()
if [ $cuda = 1 ]; then
    for lib in "${CUDA_LIBS[@]}"; do exclude+=(--exclude "$lib"); done
fi
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --plat auto "${exclude[@]}" -w "$LOG/wheelhouse" "$raw" \
    >"$LOG/repair.log" 2>&1 || { cat "$LOG/repair.log" >&2; echo "repair_wheel: auditwheel repair failed" >&2; exit 1; }
repaired=$(ls "$LOG"/wheelhouse/*.whl)

# The unpacked wheel: RPATHs added (CUDA), then checked and packed again (RECORD remade).
"$TOOLS/bin/python" -m wheel unpack -d "$LOG/tree" "$repaired" >/dev/null
tree=$(ls -d "$LOG"/tree/*/)
tree=${tree%/}
elves=()
while IFS= read -r f; do elves+=("$f"); done < <(find "$tree" -name '*.so*' -type f | sort)

libs=$(cd "$tree" && ls torch_nntile.libs 2>/dev/null || true)
echo "$libs" | grep -q '^libstarpu' || { echo "repair_wheel: libstarpu was not bundled" >&2; exit 1; }
if echo "$libs" | grep -E '^lib(torch|c10|gomp|python)' >&2; then
    echo "repair_wheel: a library of torch or python was bundled" >&2; exit 1
fi
if echo "$libs" | grep -E '^lib(cuda|cudart|cublas|cublasLt|nv)[-.]' >&2; then
    echo "repair_wheel: a CUDA library was bundled (it must come from NVIDIA's wheels)" >&2; exit 1
fi

needs_cuda=0
for f in "${elves[@]}"; do
    needed=$("$TOOLS/bin/patchelf" --print-needed "$f")
    if echo "$needed" | grep -qxF -e "${CUDA_LIBS[0]}" -e "${CUDA_LIBS[1]}" -e "${CUDA_LIBS[2]}"; then
        [ $cuda = 1 ] || { echo "repair_wheel: $f needs CUDA, but the wheel is not a CUDA one (+cu...)" >&2; exit 1; }
        rel=$(realpath -m --relative-to="$(dirname "$f")" "$tree/$NVIDIA_LIB_DIR")
        "$TOOLS/bin/patchelf" --add-rpath "\$ORIGIN/$rel" "$f"
        echo "repair_wheel: ${f#"$tree"/} finds CUDA in \$ORIGIN/$rel" >&2
        needs_cuda=1
    fi
done
if [ $cuda = 1 ] && [ $needs_cuda = 0 ]; then
    echo "repair_wheel: a CUDA wheel whose StarPU needs no CUDA library (built against a CPU StarPU?)" >&2; exit 1
fi

wheel="$out/$(basename "$repaired")"
rm -f "$wheel"
if [ $needs_cuda = 1 ]; then
    "$TOOLS/bin/python" -m wheel pack -d "$out" "$tree" >/dev/null
    [ -f "$wheel" ] || { echo "repair_wheel: $wheel was not written" >&2; exit 1; }
else
    cp "$repaired" "$wheel"  # nothing changed: auditwheel's own
fi
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" show "$wheel" 2>/dev/null
echo "$wheel"
