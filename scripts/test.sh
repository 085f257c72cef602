#!/usr/bin/env bash
# Command (b): builds everything and runs the test suite with CTest, except the
# long sweeps (label "long"; run those with: cd build && ctest -L long).
# Arguments go to ctest, e.g.:  bash scripts/test.sh -R forward -V
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/build.sh
# cd rather than --test-dir, which needs CMake >= 3.20 (Debian 11 has 3.18).
cd "${FLASHCL_BUILD_DIR:-build}"
# In parallel: kernel builds (single-threaded) dominate a cold run.
jobs="$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)"
exec ctest --output-on-failure -LE long -j "$jobs" "$@"
