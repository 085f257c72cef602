#!/usr/bin/env python3
"""Checks flashcl's outputs against PyTorch on the same machine.

For each shape: fresh random q, k, v, dO (fp16 or bf16) on the GPU; flashcl runs
forward and backward through tools/flashcl-run (public API, raw files); PyTorch
runs scaled_dot_product_attention (flash backend where it applies, else the
default) and a float64 reference on the same inputs. Reports relative L2 errors
of O, LSE, dQ, dK, dV against the float64 reference for flashcl and for SDPA, and
flashcl against SDPA. A shape passes when flashcl's error is within the dtype's
tolerance (fp16 2e-3, bf16 1e-2) and no output holds NaN. Exit status 1 if any
shape fails.

    python3 tools/sdpa_check.py --run build/tools/flashcl-run [--dtype f16] [--deterministic 0,1]
    python3 tools/sdpa_check.py --run build/tools/flashcl-run --all-head-dims --deterministic 0,1

--all-head-dims replaces the default shapes by one shape per supported head
dim (every multiple of 8 from 8 to 256), causal and not in turn, Nq != Nk
every third, GQA 4:2; --head-dims narrows it (e.g. 208-256) where one device
call cannot hold all 32. --deterministic takes a list: each shape runs once per
dQ mode on the same inputs. Without CUDA, PyTorch runs on the CPU (its SDPA
then takes the math backend) and flashcl-run on its default OpenCL device.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

TOL = {"f16": 2e-3, "bf16": 1e-2}
TORCH_DT = {"f16": torch.float16, "bf16": torch.bfloat16}

# (batch, nq, nk, hq, hkv, d, causal)
SHAPES = [
    (2, 1024, 1024, 16, 16, 128, 0),
    (2, 1024, 1024, 16, 16, 128, 1),
    (1, 777, 2048, 8, 2, 128, 1),
    (2, 1000, 1000, 16, 4, 64, 0),
    (1, 513, 2048, 8, 8, 64, 1),
]


def all_head_dim_shapes():
    """One (batch, nq, nk, hq, hkv, d, causal) per multiple of 8 up to 256."""
    out = []
    for i, d in enumerate(range(8, 257, 8)):
        nq, nk = (190, 333) if i % 3 == 2 else (257, 257)
        out.append((1, nq, nk, 4, 2, d, i % 2))
    return out


DEV = "cuda" if torch.cuda.is_available() else "cpu"


def rel(a, b):
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("nan")
    den = b.norm().item()
    return (a - b).norm().item() / (den if den > 0 else 1.0)


def to_file(t, path, dt):
    """t: (B, H, N, d) -> BNHD raw file in the storage dtype."""
    x = t.detach().transpose(1, 2).contiguous().to(TORCH_DT[dt])
    x.view(torch.int16).cpu().numpy().tofile(path)


def from_file(path, shape_bnhd, dt):
    raw = np.fromfile(path, dtype=np.int16).reshape(shape_bnhd)
    return torch.from_numpy(raw).view(TORCH_DT[dt]).float().to(DEV).transpose(1, 2)


def reference(q, k, v, do, causal, group):
    """float64 attention forward and backward in (B, H, N, d); bottom-right causal."""
    q, k, v, do = (x.double().detach().requires_grad_(x is not do) for x in (q, k, v, do))
    kk = k.repeat_interleave(group, dim=1)
    vv = v.repeat_interleave(group, dim=1)
    s = q @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (nk - nq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.softmax(s, dim=-1) @ vv
    o.backward(do)
    return o, lse, q.grad, k.grad, v.grad


def run_flashcl(args, q, k, v, do, shape, mode):
    """flashcl-run's (o, lse, dq, dk, dv) on these inputs, or its error text."""
    b, nq, nk, hq, hkv, d, causal = shape
    dt = args.dtype
    with tempfile.TemporaryDirectory() as tmp:
        for name, t in (("q", q), ("k", k), ("v", v), ("do", do)):
            to_file(t, os.path.join(tmp, name + ".bin"), dt)
        cmd = [args.run, "--dir", tmp, "--batch", str(b), "--nq", str(nq), "--nk", str(nk), "--hq", str(hq),
               "--hkv", str(hkv), "--d", str(d), "--dtype", dt, "--causal", str(causal), "--bwd",
               "--deterministic", mode, "--kernel", args.kernel]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return r.stderr.strip() or f"exit status {r.returncode}"
        lse = np.fromfile(os.path.join(tmp, "lse.bin"), dtype=np.float32).reshape(b, hq, nq)
        return (from_file(os.path.join(tmp, "o.bin"), (b, nq, hq, d), dt), torch.from_numpy(lse).to(DEV),
                from_file(os.path.join(tmp, "dq.bin"), (b, nq, hq, d), dt),
                from_file(os.path.join(tmp, "dk.bin"), (b, nk, hkv, d), dt),
                from_file(os.path.join(tmp, "dv.bin"), (b, nk, hkv, d), dt))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True, help="path of the flashcl-run executable")
    ap.add_argument("--dtype", default="f16", choices=sorted(TOL))
    ap.add_argument("--deterministic", default="1", help="dQ modes, e.g. 1 or 0,1")
    ap.add_argument("--all-head-dims", action="store_true",
                    help="one shape per head dim 8, 16, ..., 256 instead of the default shapes")
    ap.add_argument("--head-dims", default="",
                    help="with --all-head-dims, only these head dims (e.g. 208,216,256 or 208-256)")
    ap.add_argument("--kernel", default="auto")
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    dt = args.dtype
    modes = [m.strip() for m in args.deterministic.split(",") if m.strip()]
    if not modes or any(m not in ("0", "1") for m in modes):
        ap.error("--deterministic takes 0, 1 or 0,1")
    shapes = all_head_dim_shapes() if args.all_head_dims else SHAPES
    if args.head_dims:
        if not args.all_head_dims:
            ap.error("--head-dims needs --all-head-dims")
        keep = set()
        for part in args.head_dims.split(","):
            lo, _, hi = part.strip().partition("-")
            try:
                keep.update(range(int(lo), int(hi or lo) + 1))
            except ValueError:
                ap.error(f"--head-dims: bad item {part!r}")
        shapes = [s for s in shapes if s[5] in keep]
        if not shapes:
            ap.error("--head-dims selects no multiple of 8 from 8 to 256")
    device_name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    print(f"# torch {torch.__version__}, {device_name}, dtype {dt}, seed {args.seed}, "
          f"deterministic {','.join(modes)}, kernel {args.kernel}")
    print("B,Nq,Nk,Hq,Hkv,d,causal,det,out,flashcl_vs_f64,sdpa_vs_f64,flashcl_vs_sdpa")
    failed = 0
    for (b, nq, nk, hq, hkv, d, causal) in shapes:
        q = torch.randn(b, hq, nq, d, device=DEV).to(TORCH_DT[dt])
        k = torch.randn(b, hkv, nk, d, device=DEV).to(TORCH_DT[dt])
        v = torch.randn(b, hkv, nk, d, device=DEV).to(TORCH_DT[dt])
        do = torch.randn(b, hq, nq, d, device=DEV).to(TORCH_DT[dt])
        ref = reference(q, k, v, do, causal, hq // hkv)

        # SDPA: its is_causal is top-left aligned, so give it the bottom-right mask
        # explicitly when nq != nk (then the flash backend does not apply).
        qs, ks, vs = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        mask = None
        if causal and nq != nk:
            i = torch.arange(nq, device=DEV)[:, None]
            j = torch.arange(nk, device=DEV)[None, :]
            mask = j <= i + (nk - nq)
        o_s = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=bool(causal and mask is None),
                                             enable_gqa=hq != hkv)
        o_s.backward(do)
        sdpa = (o_s, None, qs.grad, ks.grad, vs.grad)

        for mode in modes:
            mine = run_flashcl(args, q, k, v, do, (b, nq, nk, hq, hkv, d, causal), mode)
            tag = f"{b},{nq},{nk},{hq},{hkv},{d},{causal},{mode}"
            if isinstance(mine, str):
                print(f"{tag},error,{mine}")
                failed += 1
                continue
            for idx, name in enumerate(("o", "lse", "dq", "dk", "dv")):
                e_f = rel(mine[idx], ref[idx])
                e_s = rel(sdpa[idx], ref[idx]) if sdpa[idx] is not None else float("nan")
                e_fs = rel(mine[idx], sdpa[idx]) if sdpa[idx] is not None else float("nan")
                # LSE is fp32 in flashcl: hold it to the fp32 scale of its magnitude.
                tol = 1e-5 if name == "lse" else TOL[dt]
                ok = math.isfinite(e_f) and e_f <= tol
                failed += not ok
                print(f"{tag},{name},{e_f:.3e},{e_s:.3e},{e_fs:.3e}{'' if ok else ',FAIL'}")
            sys.stdout.flush()
    print("# " + ("all shapes within tolerance" if not failed else f"{failed} output(s) out of tolerance"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
