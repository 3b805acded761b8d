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
# The folder is reused when its stamp records the same version and options; anything
# else rebuilds it. Environment: STARPU_PREFIX (default .cache/starpu), STARPU_JOBS
# (make -j, default the core count). Needs root, or sudo, for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=1.4.10+dfsg-2
PREFIX=$(realpath -m "${STARPU_PREFIX:-.cache/starpu}")
OPTIONS=(--enable-maxcpus=256 --enable-maxbuffers=32 --enable-mpi --disable-fxt
         --disable-build-examples --disable-build-tests --disable-build-doc
         --disable-opencl --disable-socl --disable-starpufft --disable-fortran --disable-cuda
         --disable-hip --disable-max-fpga --disable-openmp --disable-starpupy --disable-mlr --disable-static)
STAMP="$PREFIX/.torch_nntile-build"
WANT="$VERSION ${OPTIONS[*]}"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -f "$PREFIX/lib/pkgconfig/starpu-1.4.pc" ]; then
    echo "$PREFIX"
    exit 0
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Build dependencies, all from the distribution: hwloc for the topology, OpenMPI for
# StarPU-MPI (mpirun comes with openmpi-bin), dpkg-dev for `apt-get source`; and iproute2,
# with which the tests run two ranks in two network namespaces.
DEPS=(build-essential pkg-config dpkg-dev libhwloc-dev libopenmpi-dev openmpi-bin libtool autoconf automake iproute2)
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

WORK=$(realpath -m build/starpu-src)
rm -rf "$WORK"
mkdir -p "$WORK"
( cd "$WORK" && apt-get source -qq --download-only "starpu=$VERSION" >/dev/null 2>&1 ) ||
    { echo "build_starpu: apt-get source starpu=$VERSION failed (is the deb-src entry $SRC_LIST reachable?)" >&2; exit 1; }
( cd "$WORK" && dpkg-source -x --no-check ./*.dsc src >/dev/null )

echo "build_starpu: configuring StarPU $VERSION into $PREFIX" >&2
rm -rf "$PREFIX"
cd "$WORK/src"
./configure --prefix="$PREFIX" "${OPTIONS[@]}" >"$WORK/configure.log" 2>&1 ||
    { tail -n 30 "$WORK/configure.log" >&2; exit 1; }
make -j"${STARPU_JOBS:-$(nproc)}" >"$WORK/make.log" 2>&1 || { tail -n 40 "$WORK/make.log" >&2; exit 1; }
make install >"$WORK/install.log" 2>&1 || { tail -n 30 "$WORK/install.log" >&2; exit 1; }
echo "$WANT" >"$STAMP"
rm -rf "$WORK"
echo "$PREFIX"
