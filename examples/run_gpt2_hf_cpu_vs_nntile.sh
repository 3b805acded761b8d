#!/usr/bin/env bash
# Train the HF GPT-2 example on CPU and on nntile from one seed, then compare the weights.
#
#   examples/run_gpt2_hf_cpu_vs_nntile.sh [OUT_DIR] [train options...]
#
# OUT_DIR (default: a new temporary folder) receives cpu/ and nntile/ checkpoints; the
# train options (see `train_gpt2_hf.py train --help`) go to both runs, e.g.
# --epochs 2 --steps-per-epoch 5 --tile-batch 4 (the tiling options apply on nntile only).
# The last line printed is compare's "max relative difference: X" (nntile against cpu).
# Python: $PYTHON if set, else the repository's .venv/bin/python if present, else python3.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 0
fi
py=${PYTHON:-}
if [[ -z $py ]]; then
    if [[ -x $here/../.venv/bin/python ]]; then py=$here/../.venv/bin/python; else py=python3; fi
fi
if [[ $# -gt 0 && $1 != -* ]]; then
    out=$1
    shift
else
    out=$(mktemp -d "${TMPDIR:-/tmp}/gpt2_cpu_vs_nntile.XXXXXX")
fi

"$py" "$here/train_gpt2_hf.py" train --device cpu --output-dir "$out/cpu" "$@"
"$py" "$here/train_gpt2_hf.py" train --device nntile --output-dir "$out/nntile" "$@"
echo "compare $out/nntile against $out/cpu:"
"$py" "$here/train_gpt2_hf.py" compare "$out/nntile" "$out/cpu"
