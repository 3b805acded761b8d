#!/usr/bin/env bash
# The checks of CUDA workers that need a GPU, prepared here and run on a GPU machine
# that has Python 3.12 and a CUDA 13 PyTorch but no package registry, and gets only
# what is carried to it (at most 64 MiB).
#
#   scripts/gpu_check.sh prepare     here: builds the CUDA wheel (make wheel-cuda: abi3,
#                                    so it installs on 3.12; libstarpu bundled, CUDA's
#                                    libraries taken from torch's) and fetches the wheels
#                                    that machine lacks (cffi for cp312, expecttest, the
#                                    tests' transformers) into .gpu/ (git-ignored)
#   scripts/gpu_check.sh run OUT [tests|bench|all]
#                                    there, with .gpu/ carried: installs them into a
#                                    temporary folder (no build, no registry), prints the
#                                    versions, then runs
#                                    tests: with TORCH_NNTILE_NCUDA=1 the GPU tests and the
#                                      parity tests (tests/test_cuda.py, test_training.py,
#                                      test_hf_models.py, the tiled OpInfo subset of
#                                      test_opinfo.py);
#                                    bench: benchmarks/cuda_step.py (GPT-2 12 layers, every
#                                      task on the GPU: unlimited; with the GPU memory
#                                      limited to a third of the working set; and with
#                                      TORCH_NNTILE_CUDA_ASYNC=1);
#                                    each stage under a time limit; logs and JSON go to OUT.
#                                    Exits nonzero if a stage failed. One device call runs
#                                    at most 10 minutes: run tests and bench as two calls.
#
# Stage time limits (seconds) can be set with GPU_CHECK_TESTS_S and GPU_CHECK_BENCH_S.
set -uo pipefail
cd "$(dirname "$0")/.."

CACHE=.gpu
PINS=(cffi==2.1.1 expecttest==0.3.0 transformers==5.24.0)  # cffi: the .venv's (the shim's module needs its backend)

prepare() {
    set -e
    make wheel-cuda
    rm -rf "$CACHE"
    mkdir -p "$CACHE"
    cp dist/torch_nntile-*+cu*.whl "$CACHE"/
    "${PY:-python3.11}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$CACHE" "${PINS[@]}"
    ls -la "$CACHE"
    du -sh "$CACHE"
}

stage() {  # name, limit (s), command...: run it, its output to OUT/name.log; remember a failure
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit} s): $*"
    local t0=$SECONDS
    timeout --kill-after=20 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" = 0 ] || FAILED+=("$name($rc)")
}

run() {  # OUT, what
    OUT=$(realpath -m "$1")
    mkdir -p "$OUT"
    local site=/tmp/torch_nntile-gpu-site
    rm -rf "$site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$CACHE"/*.whl ||
        { echo "gpu_check: installing the carried wheels failed" >&2; exit 1; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    export STARPU_HOME=/tmp/torch_nntile-gpu-starpu STARPU_SILENT=1 PYTHONUNBUFFERED=1
    FAILED=()
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1
    stage versions 120 python3 -c "
import sys, torch, transformers, torch_nntile
print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'transformers', transformers.__version__, 'torch_nntile', torch_nntile.__version__)
print('gpu', torch.cuda.get_device_name(0), 'built_with_cuda', torch_nntile.built_with_cuda())
torch_nntile.init_context(ncpu=2, ncuda=1)
print('cuda workers', torch_nntile.cuda_worker_count())
torch_nntile.restrict_cuda()
x = torch.randn(512, 512)
y = (x.to('nntile') @ x.to('nntile')).cpu()
print('product on the GPU: max abs error', (y - x @ x).abs().max().item(), torch_nntile.info()['cuda'])
"
    local what=${2:-all}
    if [ "$what" = tests ] || [ "$what" = all ]; then
        TORCH_NNTILE_NCUDA=1 stage tests "${GPU_CHECK_TESTS_S:-300}" python3 -m pytest -q -p no:cacheprovider -rf \
            tests/test_cuda.py tests/test_training.py tests/test_hf_models.py tests/test_opinfo.py
    fi
    if [ "$what" = bench ] || [ "$what" = all ]; then
        local b=(python3 benchmarks/cuda_step.py --restrict-cuda --steps 6 --block 2 --warmup 2)
        stage bench "${GPU_CHECK_BENCH_S:-150}" "${b[@]}" --json "$OUT/cuda_step.json"
        stage bench-limited "${GPU_CHECK_BENCH_S:-150}" "${b[@]}" --mem-frac 0.33 --json "$OUT/cuda_step-limited.json"
        TORCH_NNTILE_CUDA_ASYNC=1 stage bench-async "${GPU_CHECK_BENCH_S:-150}" "${b[@]}" \
            --json "$OUT/cuda_step-async.json"
    fi
    if [ ${#FAILED[@]} -gt 0 ]; then
        echo "gpu_check: failed: ${FAILED[*]}"
        exit 1
    fi
    echo "gpu_check: every stage passed"
}

case "${1:-}" in
    prepare) prepare ;;
    run) [ $# -ge 2 ] || { echo "usage: $0 run OUT [tests|bench|all]" >&2; exit 2; }; run "$2" "${3:-all}" ;;
    *) echo "usage: $0 prepare | run OUT [tests|bench|all]" >&2; exit 2 ;;
esac
