#!/usr/bin/env bash
# Regenerates BENCHMARKS.md's "Current figures" and docs/img/*.svg from the
# measurements stored in docs/bench-data/ (python3, standard library only).
# To add a device or replace a measurement: put the flashcl-bench CSV (and any
# tools/sdpa_*.py outputs) with the script that produced them in
# docs/bench-data/<device>/, then edit the group below (date, commit, note).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
h100=docs/bench-data/h100
pocl=docs/bench-data/pocl-cpu
exec python3 scripts/bench_report.py --out BENCHMARKS.md --img docs/img \
  --invoked-as "bash scripts/bench_report.sh" \
  --device "NVIDIA H100 80GB HBM3, NVIDIA OpenCL" --slug h100 \
  --date "2026-11-27 06:22 UTC" --commit 6ac564f \
  --note "AUTO ran the tensor-core kernels (wgmma forward, wgmma backward at d = 64 and 128, mma.sync decode) for fp16 and bf16, and the portable kernels for fp32. PyTorch 2.11.0+cu130 SDPA ran in the same call on the same GPU." \
  --commands "$h100/commands.sh" \
  "$h100/bench.csv" "$h100/sdpa_fwd.md" "$h100/sdpa_bwd.txt" "$h100/sdpa_dec.txt" \
  --device "PoCL CPU device, 2-core development machine" --slug pocl \
  --date "2026-11-26 19:22 UTC" --commit c952eb0 \
  --note "PoCL's pthread device on the 2-core development machine, otherwise idle (load average 0.4 before the run); flash and naive of a row ran back to back. Batch 1 and 4 heads, so memory grows with N as in the paper's Fig. 3." \
  --commands "$pocl/commands.sh" \
  "$pocl/bench.csv"
