#!/usr/bin/env bash
# PoCL (CPU) figures for BENCHMARKS.md's "Current figures": small sweeps, batch 1,
# 4 heads of d = 64 (hidden 256), so that memory grows with N as in the paper's Fig. 3.
# Run from the repository root with B pointing at a Release build's flashcl-bench:
#   B=build/tools/flashcl-bench bash docs/bench-data/pocl-cpu/commands.sh > docs/bench-data/pocl-cpu/bench.csv
B=${B:-build/tools/flashcl-bench}
echo "## fwd f32 flash+naive"
$B --n 256,512,1024,2048,4096 --d 64 --dtype f32 --causal 0 --algo flash,naive --batch-tokens 1 --hidden 256 --reps 3 --warmup 1 --no-check --csv
echo "## fwd+bwd f32 det 1"
$B --n 256,512,1024 --d 64 --dtype f32 --causal 0 --algo flash,naive --bwd --deterministic 1 --batch-tokens 1 --hidden 256 --reps 3 --warmup 1 --no-check --csv
echo "## decode"
$B --decode --n 1024,4096 --decode-batch 1 --d 64 --dtype f32 --reps 3 --warmup 1 --csv
