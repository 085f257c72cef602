#!/usr/bin/env bash
# Command (a): builds everything and runs flashcl-bench on the default device
# ($FLASHCL_DEVICE, else the first GPU, else the first device, e.g. PoCL's CPU).
# Arguments go to flashcl-bench, e.g.:
#   bash scripts/bench.sh --n 1k,2k,4k --d 64 --dtype f16 --causal 1 --csv
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Build chatter goes to stderr, so that `bash scripts/bench.sh --csv > out.csv`
# is CSV and nothing else.
bash scripts/build.sh >&2
exec "${FLASHCL_BUILD_DIR:-build}/tools/flashcl-bench" "$@"
