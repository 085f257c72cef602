#!/usr/bin/env python3
"""flashcl against every PyTorch SDPA backend, in one run and one table.

Runs flashcl-bench (forward, flash path, fp16) and then the same shapes through
torch.nn.functional.scaled_dot_product_attention with the flash, cuDNN,
memory-efficient and math backends, in this process, so that all figures come
from the same machine state. Prints one Markdown table: TFLOP/s of each, and
flashcl's speed relative to the flash backend (FlashAttention-2), SDPA time /
flashcl time. Not part of the library; needs PyTorch with CUDA.

  python3 tools/sdpa_compare.py --bench build/tools/flashcl-bench \\
      --n 512,1024,2048,4096,8192,16384 --d 64,128 --causal 0,1

Shapes follow flashcl-bench and sdpa_bench.py: batch = max(1, batch_tokens / N),
heads = hidden / d, fp16; TFLOP/s count 4*N^2*d per head, halved when causal.
A backend that cannot run a shape (no kernel for it, or out of memory) shows
"-". FLASHCL_DEVICE and the other flashcl variables pass through to the bench.
"""

import argparse
import csv
import io
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sdpa_bench import BACKENDS, ints, time_ms  # noqa: E402

ORDER = ["flash", "cudnn", "efficient", "math"]


def flashcl_rows(args):
    """(n, d, causal) -> TFLOP/s from flashcl-bench --csv."""
    cmd = [args.bench, "--csv", "--algo", "flash", "--no-check", "--dtype", "f16", "--d", args.d, "--n", args.n,
           "--causal", "both" if set(ints(args.causal)) == {0, 1} else args.causal, "--reps", str(args.reps),
           "--batch-tokens", str(args.batch_tokens), "--hidden", str(args.hidden)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = {}
    for r in csv.DictReader(io.StringIO(out)):
        if r["pass"] == "fwd" and r["algo"] == "flash" and r["status"] == "ok":
            rows[(int(r["n"]), int(r["d"]), int(r["causal"]))] = float(r["tflops"])
    return rows


def sdpa_tflops(backend, n, d, causal, args):
    b, h = max(1, args.batch_tokens // n), args.hidden // d
    try:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        with sdpa_kernel(BACKENDS[backend]):
            ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)), args.warmup,
                         args.reps)
        return 4.0 * n * n * d * b * h * (0.5 if causal else 1.0) / ms * 1e-9
    except (RuntimeError, torch.cuda.OutOfMemoryError):
        return None
    finally:
        q = k = v = None
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="path to flashcl-bench")
    ap.add_argument("--n", default="1024,2048,4096,8192,16384")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--backends", default=",".join(ORDER))
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    backends = [x for x in args.backends.split(",") if x]
    for x in backends:
        if x not in BACKENDS:
            ap.error(f"unknown backend {x}; choose from {', '.join(ORDER)}")

    fcl = flashcl_rows(args)
    print(f"# flashcl-bench {args.bench}; torch {torch.__version__}, {torch.cuda.get_device_name()}, fp16, "
          f"batch*N = {args.batch_tokens}, hidden {args.hidden}")
    print("| N | d | causal | flashcl | " + " | ".join(backends) + " | flashcl / flash |")
    print("|" + "---|" * (4 + len(backends) + 1))
    fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    for d in ints(args.d):
        for causal in ints(args.causal):
            for n in ints(args.n):
                mine = fcl.get((n, d, causal))
                theirs = {x: sdpa_tflops(x, n, d, causal, args) for x in backends}
                fl = theirs.get("flash")
                ratio = "-" if mine is None or not fl else f"{mine / fl:.2f}"
                print(f"| {n} | {d} | {causal} | {fmt(mine)} | " + " | ".join(fmt(theirs[x]) for x in backends) +
                      f" | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
