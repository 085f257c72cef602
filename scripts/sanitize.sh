#!/usr/bin/env bash
# Builds flashcl with AddressSanitizer + UndefinedBehaviorSanitizer (and
# LeakSanitizer, part of ASan) in its own build directory and runs the default
# test suite (ctest -LE long) under them. docs/reliability.md has the details.
#
#   FLASHCL_SANITIZE_BUILD_DIR  build directory (default: build-asan)
#   FLASHCL_SANITIZE            sanitizers (default: address,undefined; "thread" for TSan)
#   CMAKE_ARGS                  extra arguments for the configure step
# Arguments go to ctest, e.g.:  bash scripts/sanitize.sh -R test_decode -V
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"

build_dir="${FLASHCL_SANITIZE_BUILD_DIR:-build-asan}"
sanitize="${FLASHCL_SANITIZE:-address,undefined}"
jobs="$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)"

bash scripts/bootstrap.sh
# RelWithDebInfo: optimised like the release build, with line numbers in the reports.
# shellcheck disable=SC2086 # CMAKE_ARGS is a list of words on purpose
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHCL_SANITIZE="$sanitize" ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"

# detect_leaks=1: LeakSanitizer at exit; the suppressions (tests/lsan.supp) only
#   cover allocations made inside the OpenCL driver stack (PoCL, LLVM, the ICD
#   loader, CLBlast), never flashcl's.
# Any finding (ASan, LSan, UBSan with halt_on_error) exits non-zero and fails the test.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$repo/tests/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-suppressions=$repo/tests/tsan.supp:halt_on_error=1:second_deadlock_stack=1}"

cd "$build_dir"
exec ctest --output-on-failure -LE long -j "$jobs" "$@"
