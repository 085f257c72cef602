#!/usr/bin/env bash
# Command (b): builds everything and runs the test suite with CTest, except the
# long sweeps (label "long"; run those with: ctest --test-dir build -L long).
# Arguments go to ctest, e.g.:  bash scripts/test.sh -R forward -V
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/build.sh
exec ctest --test-dir "${FLASHCL_BUILD_DIR:-build}" --output-on-failure -LE long "$@"
