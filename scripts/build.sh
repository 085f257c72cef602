#!/usr/bin/env bash
# Shared by scripts/bench.sh and scripts/test.sh: dependencies, configure, build,
# and a check that flashcl can open an OpenCL device.
#
#   FLASHCL_BUILD_DIR   build directory (default: build)
#   CMAKE_ARGS          extra arguments for the configure step
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir="${FLASHCL_BUILD_DIR:-build}"
jobs="$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)"

bash scripts/bootstrap.sh
# shellcheck disable=SC2086 # CMAKE_ARGS is a list of words on purpose
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"

if [ -x "$build_dir/tools/flashcl-info" ]; then
  if ! "$build_dir/tools/flashcl-info" --check; then
    echo "build: no usable OpenCL device (see above); '$build_dir/tools/flashcl-info' lists what the ICD loader sees" >&2
    exit 2
  fi
fi
