#!/usr/bin/env bash
# Builds the StarPU that torch_nntile runs on, from Debian's own source package, into a
# cache folder; prints that folder last.
#
# Why not Debian's binary: bookworm's libstarpu-dev (1.3.10) is configured for at most
# 4 CPU workers and 8 buffers a task, and lacks the 1.4 calls that out-of-core memory
# and StarPU-MPI need. Debian's unstable suite carries the 1.4 source: a deb-src entry
# for it is derived here from the machine's own apt sources (so no host is named in
# this repository), `apt-get source` fetches it, and it is configured for many workers
# with StarPU-MPI, without examples, tests, documentation, OpenCL, FFT or Fortran.
#
# With STARPU_CUDA=1 it is built with CUDA workers too, against the CUDA 13.0 of PyPI's
# NVIDIA wheels (runtime, cuBLAS, the compiler StarPU's configure looks for, and the
# headers StarPU's own headers include), unpacked into STARPU_CUDA_HOME (default
# .cache/cuda): no GPU and no CUDA toolkit is needed to build it, and it runs with no CUDA
# worker where there is no GPU. StarPU 1.4.10 predates CUDA 13: scripts/starpu-patches/
# has the change it needs.
#
# Two halves, for machines without apt (the wheels' CI: manylinux containers, macOS):
# STARPU_FETCH_ONLY=1 only fetches and unpacks the source into STARPU_SOURCE (on a Debian
# machine or container), and STARPU_SOURCE=folder alone builds from that folder with
# neither apt nor root (the build tools, pkg-config and hwloc's headers must be there);
# STARPU_MPI=0 then leaves StarPU-MPI out (the wheels have none).
#
# The folder is reused when its stamp records the same version and options; anything
# else rebuilds it. Environment: STARPU_PREFIX (default .cache/starpu, or .cache/starpu-cuda
# with STARPU_CUDA=1), STARPU_JOBS (make -j, default the core count), PY (the Python that
# fetches the wheels, default python3.11). Needs root, or sudo, for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FETCH_ONLY=${STARPU_FETCH_ONLY:-0}
SOURCE=${STARPU_SOURCE:-}
if [ "$FETCH_ONLY" = 1 ]; then
    SOURCE=$(realpath -m "${SOURCE:-.cache/starpu-source}")
elif [ -n "$SOURCE" ]; then
    SOURCE=$(realpath "$SOURCE")
    [ -x "$SOURCE/configure" ] || { echo "build_starpu: $SOURCE has no StarPU source (STARPU_FETCH_ONLY=1 fetches it)" >&2; exit 1; }
fi

VERSION=1.4.10+dfsg-2
CUDA=${STARPU_CUDA:-0}
PREFIX=$(realpath -m "${STARPU_PREFIX:-$([ "$CUDA" = 1 ] && echo .cache/starpu-cuda || echo .cache/starpu)}")
OPTIONS=(--enable-maxcpus=256 --enable-maxbuffers=32 --enable-mpi --disable-fxt
         --disable-build-examples --disable-build-tests --disable-build-doc
         --disable-opencl --disable-socl --disable-starpufft --disable-fortran --disable-cuda
         --disable-hip --disable-max-fpga --disable-openmp --disable-starpupy --disable-mlr --disable-static)
if [ "${STARPU_MPI:-1}" = 0 ]; then
    OPTIONS=("${OPTIONS[@]/--enable-mpi/--disable-mpi}")
fi
# CUDA 13.0, as the GPU machine's PyTorch; whole wheels, and wheels of which StarPU needs the headers only
CUDA_WHEELS=(nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14
             nvidia-cuda-nvcc==13.0.88)
CUDA_HEADERS=(nvidia-cusparse==12.6.3.3 nvidia-cusolver==12.0.4.66)
if [ "$CUDA" = 1 ]; then
    CUDA_HOME=$(realpath -m "${STARPU_CUDA_HOME:-.cache/cuda}")
    C="$CUDA_HOME/nvidia/cu13"
    OPTIONS=("${OPTIONS[@]/--disable-cuda/--enable-cuda}" --with-cuda-dir="$C" --with-cuda-include-dir="$C/include"
             --with-cuda-lib-dir="$C/lib" NVCC="$C/bin/nvcc" LDFLAGS="-Wl,-rpath,$C/lib")
fi
STAMP="$PREFIX/.torch_nntile-build"
WANT="$VERSION ${OPTIONS[*]}"
if [ "$CUDA" = 1 ]; then
    WANT="$WANT ${CUDA_WHEELS[*]} ${CUDA_HEADERS[*]} $(cat scripts/starpu-patches/*.patch | md5sum | cut -c1-12)"
fi

if [ "$FETCH_ONLY" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] &&
   [ -f "$PREFIX/lib/pkgconfig/starpu-1.4.pc" ]; then
    echo "$PREFIX"
    exit 0
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Build dependencies, all from the distribution: hwloc for the topology, OpenMPI for
# StarPU-MPI (mpirun comes with openmpi-bin), dpkg-dev for `apt-get source`; and iproute2,
# with which the tests run two ranks in two network namespaces.
DEPS=(build-essential pkg-config dpkg-dev libhwloc-dev libopenmpi-dev openmpi-bin libtool autoconf automake iproute2)
if [ "$FETCH_ONLY" = 1 ]; then
    DEPS=(dpkg-dev)  # apt-get source unpacks with dpkg-source
fi
WORK=$(realpath -m build/starpu-src)
rm -rf "$WORK"
mkdir -p "$WORK"

# Fetching: apt-get source from a deb-src entry for unstable (below); skipped where
# STARPU_SOURCE names a source fetched before.
fetch_source() {
    missing=()
    for p in "${DEPS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done

    # A deb-src entry for unstable, made from the first stanza of the machine's sources.
    SRC_LIST=/etc/apt/sources.list.d/torch-nntile-src.sources
    need_update=0
    if [ ! -f "$SRC_LIST" ]; then
        sources=/etc/apt/sources.list.d/debian.sources
        [ -f "$sources" ] || { echo "build_starpu: $sources not found: add a deb-src entry for Debian unstable" >&2; exit 1; }
        awk 'BEGIN { RS = ""; FS = "\n" }
             NR == 1 { for (i = 1; i <= NF; i++) { if ($i ~ /^URIs:/) u = $i; if ($i ~ /^Signed-By:/) s = $i }
                       print "Types: deb-src"; print u; print "Suites: unstable"; print "Components: main"; if (s) print s }' \
            "$sources" | as_root tee "$SRC_LIST" >/dev/null
        need_update=1
    fi
    if [ ${#missing[@]} -gt 0 ] || [ $need_update = 1 ]; then
        as_root apt-get update -qq
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        echo "build_starpu: installing ${missing[*]}" >&2
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi

    ( cd "$WORK" && apt-get source -qq --download-only "starpu=$VERSION" >/dev/null 2>&1 ) ||
        { echo "build_starpu: apt-get source starpu=$VERSION failed (is the deb-src entry $SRC_LIST reachable?)" >&2; exit 1; }
    ( cd "$WORK" && dpkg-source -x --no-check ./*.dsc src >/dev/null )
}
if [ "$FETCH_ONLY" = 1 ]; then
    fetch_source
    rm -rf "$SOURCE"
    mkdir -p "$(dirname "$SOURCE")"
    mv "$WORK/src" "$SOURCE"
    rm -rf "$WORK"
    echo "$SOURCE"
    exit 0
elif [ -n "$SOURCE" ]; then
    cp -R "$SOURCE" "$WORK/src"
else
    fetch_source
fi

# The CUDA wheels: fetched by pip in a venv of its own, unpacked with zipfile (no unzip
# needed), the libraries given the unversioned names the linker looks for.
fetch_cuda() {
    local stamp="$CUDA_HOME/.torch_nntile-wheels" want="${CUDA_WHEELS[*]} | ${CUDA_HEADERS[*]}"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
    echo "build_starpu: fetching CUDA's wheels into $CUDA_HOME" >&2
    rm -rf "$CUDA_HOME" "$WORK/wheels" "$WORK/pip"
    "${PY:-python3.11}" -m venv "$WORK/pip"
    "$WORK/pip/bin/python" -m pip download -q --no-deps -d "$WORK/wheels" "${CUDA_WHEELS[@]}" "${CUDA_HEADERS[@]}"
    "$WORK/pip/bin/python" - "$WORK/wheels" "$CUDA_HOME" "${CUDA_HEADERS[@]%%==*}" <<'PYEOF'
import pathlib, sys, zipfile
wheels, home, headers_only = pathlib.Path(sys.argv[1]), sys.argv[2], {n.replace("-", "_") for n in sys.argv[3:]}
for w in sorted(wheels.glob("*.whl")):
    with zipfile.ZipFile(w) as z:
        only = w.name.split("-")[0] in headers_only
        names = [n for n in z.namelist() if n.startswith("nvidia/") and (not only or "/include/" in n)]
        z.extractall(home, names)
        for n in names:  # zip entries keep no permissions: the compiler's tools must run
            if "/bin/" in n:
                (pathlib.Path(home) / n).chmod(0o755)
PYEOF
    for lib in cudart cublas cublasLt; do ln -sf "lib$lib.so.13" "$C/lib/lib$lib.so"; done
    echo "$want" >"$stamp"
}
if [ "$CUDA" = 1 ]; then
    fetch_cuda
fi

echo "build_starpu: configuring StarPU $VERSION into $PREFIX" >&2
rm -rf "$PREFIX"
cd "$WORK/src"
if [ "$CUDA" = 1 ]; then
    for p in "$ROOT"/scripts/starpu-patches/*.patch; do patch -s -p1 <"$p"; done
fi
./configure --prefix="$PREFIX" "${OPTIONS[@]}" >"$WORK/configure.log" 2>&1 ||
    { tail -n 30 "$WORK/configure.log" >&2; exit 1; }
make -j"${STARPU_JOBS:-$(getconf _NPROCESSORS_ONLN)}" >"$WORK/make.log" 2>&1 || { tail -n 40 "$WORK/make.log" >&2; exit 1; }
make install >"$WORK/install.log" 2>&1 || { tail -n 30 "$WORK/install.log" >&2; exit 1; }
echo "$WANT" >"$STAMP"
rm -rf "$WORK"
echo "$PREFIX"
