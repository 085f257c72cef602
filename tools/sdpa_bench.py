#!/usr/bin/env python3
"""PyTorch SDPA reference timings, in flashcl-bench's terms (same shapes and FLOP count).

Used on the NVIDIA machine to put flashcl's figures next to
torch.nn.functional.scaled_dot_product_attention. Not part of the library.

  python3 tools/sdpa_bench.py --n 1024,4096,8192 --d 64,128 --backend flash [--bwd] [--causal 0,1]

  python3 tools/sdpa_bench.py --decode --n 1024,32768,131072 --decode-batch 1,8,64
  python3 tools/sdpa_bench.py --copy      # device-to-device copy bandwidth

Shapes follow flashcl-bench: batch = max(1, batch_tokens / N), heads = hidden / d,
fp16, layout (batch, heads, N, d). TFLOP/s counts 4*N^2*d per head (halved when
causal); --bwd reports forward+backward with 3.5x the forward FLOPs, as
FlashAttention-2 counts.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def ints(text):
    return [int(x) for x in text.split(",") if x]


def time_ms(fn, warmup, reps, calls=1):
    """Median over reps of the time per call of `calls` back-to-back calls between two events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="1024,2048,4096,8192,16384")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--causal", default="0")
    ap.add_argument("--backend", default=None, choices=sorted(BACKENDS),
                    help="default flash; with --decode, SDPA's own choice unless given")
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--decode", action="store_true",
                    help="q_len 1 against a contiguous cache: 32 query heads, 8 kv heads, d from --d (default 128)")
    ap.add_argument("--decode-batch", default="1,8,64")
    ap.add_argument("--calls", type=int, default=1,
                    help="--decode: back-to-back calls per timed span (time per call), as flashcl-bench --calls")
    ap.add_argument("--copy", action="store_true", help="device-to-device copy bandwidth of a 4 GiB tensor")
    args = ap.parse_args()
    if args.copy:
        src = torch.empty(1 << 31, device="cuda", dtype=torch.float16)
        dst = torch.empty_like(src)
        ms = time_ms(lambda: dst.copy_(src), args.warmup, args.reps)
        print(f"copy,{src.numel() * 2},{ms:.3f} ms,{2 * src.numel() * 2 / ms * 1e-6:.1f} GB/s (read + write)")
        return
    if args.decode:
        backend = f"backend {args.backend}" if args.backend else "SDPA default backend"
        print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, {backend}, fp16, q_len 1, "
              f"{args.calls} back-to-back call(s) per timed span")
        print("batch,kv_len,d,ms,GB/s (K+V bytes read / time)")
        d = 128 if args.d == "64,128" else ints(args.d)[0]
        for b in ints(args.decode_batch):
            for n in ints(args.n):
                if b * n * 8 * d * 2 * 2 > 40 * (1 << 30):
                    print(f"{b},{n},{d},skipped (cache larger than 40 GiB)")
                    continue
                q = torch.randn(b, 32, 1, d, device="cuda", dtype=torch.float16)
                k, v = (torch.randn(b, 8, n, d, device="cuda", dtype=torch.float16) for _ in range(2))
                call = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                try:
                    if args.backend:
                        with sdpa_kernel(BACKENDS[args.backend]):
                            ms = time_ms(call, args.warmup, args.reps, args.calls)
                    else:
                        ms = time_ms(call, args.warmup, args.reps, args.calls)
                    print(f"{b},{n},{d},{ms:.4f},{2 * k.numel() * 2 / ms * 1e-6:.1f}")
                except RuntimeError as e:  # the backend refuses this shape (e.g. GQA)
                    print(f"{b},{n},{d},unsupported ({str(e).splitlines()[0][:80]})")
                del q, k, v
                torch.cuda.empty_cache()
        return
    args.backend = args.backend or "flash"
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, backend {args.backend}, fp16")
    print("N,d,causal,batch,heads,pass,ms,tflops")
    for d in ints(args.d):
        for n in ints(args.n):
            for causal in ints(args.causal):
                b, h = max(1, args.batch_tokens // n), args.hidden // d
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, requires_grad=args.bwd)
                           for _ in range(3))
                flops = 4.0 * n * n * d * b * h * (0.5 if causal else 1.0)
                with sdpa_kernel(BACKENDS[args.backend]):
                    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                    ms = time_ms(fwd, args.warmup, args.reps)
                    print(f"{n},{d},{causal},{b},{h},fwd,{ms:.3f},{flops / ms * 1e-9:.1f}")
                    if args.bwd:
                        out = fwd()
                        grad = torch.randn_like(out)

                        def step():
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                            o.backward(grad)

                        ms = time_ms(step, args.warmup, args.reps)
                        print(f"{n},{d},{causal},{b},{h},fwd+bwd,{ms:.3f},{3.5 * flops / ms * 1e-9:.1f}")
                del q, k, v
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
