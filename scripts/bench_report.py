#!/usr/bin/env python3
"""Regenerate BENCHMARKS.md's "Current figures" and the plots in docs/img/.

Reads flashcl-bench --csv output (with optional "## section" lines between
runs, as written by a commands script) and, optionally, the outputs of
tools/sdpa_compare.py and tools/sdpa_bench.py (--bwd, --decode), one group of
files per device:

  python3 scripts/bench_report.py [--out BENCHMARKS.md] [--img docs/img] \\
      --device "NVIDIA H100 80GB HBM3 (NVIDIA OpenCL)" --slug h100 \\
      --date "2026-11-26 17:40 UTC" --commit a9b27f3 \\
      --commands docs/bench-data/h100/commands.sh \\
      docs/bench-data/h100/bench.csv docs/bench-data/h100/sdpa_*.* \\
      --device "PoCL CPU ..." --slug pocl ...

Each --device starts a group; the options and files after it belong to it.
The kind of each file is recognised from its content. --commands names the
script that produced the files: its "echo \"## ...\"" lines name the CSV's
sections and its flashcl-bench / sdpa_*.py lines are the commands, which the
tables quote (the k-th CSV header of a section is the k-th bench command of
that section). --note adds a sentence under the device's heading.

The generated Markdown replaces the text between the lines
"<!-- current-figures:begin -->" and "<!-- current-figures:end -->" of --out
(printed to stdout with --out -). The SVG plots (runtime and memory against
N, flash against naive, log-log, like Fig. 3 of the FlashAttention paper) are
written directly, without matplotlib. Python 3 standard library only.
"""
import argparse
import csv
import io
import math
import os
import re
import shlex
import sys

BEGIN = "<!-- current-figures:begin -->"
END = "<!-- current-figures:end -->"


# ---------------------------------------------------------------- inputs

def parse_commands(path):
    """Map section name -> list of flashcl-bench commands; plus the SDPA commands."""
    sections = {}
    sdpa = {}
    cur = ""
    bench_path = "build/tools/flashcl-bench"
    with open(path) as f:
        text = f.read()
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r'^echo\s+"##\s*(.*?)"', line)
        if m:
            cur = m.group(1)
            continue
        if line.startswith("#") or not line:
            continue
        m = re.match(r'^B=(?:\$\{B:-)?([^}\s]+)\}?$', line)
        if m:
            bench_path = m.group(1)
            continue
        # drop redirections and a leading timeout
        def clean(cmd):
            cmd = re.sub(r'\s*[12]?>+\s*\S+', '', cmd)
            cmd = re.sub(r'^timeout\s+\d+\s+', '', cmd)
            cmd = cmd.replace('$B', bench_path).replace('; echo "sdpa fwd rc=$?"', '')
            return cmd.strip().rstrip(';').strip()
        if line.startswith("$B ") or line.startswith("flashcl-bench "):
            sections.setdefault(cur, []).append(clean(line))
        elif "sdpa_compare.py" in line:
            sdpa["fwd"] = clean(line.split(";")[0])
        elif "sdpa_bench.py" in line:
            m = re.match(r'^for\s+(\w+)\s+in\s+([^;]+);\s*do\s+(.*?);\s*done', line)
            if m:
                var, values, body = m.group(1), m.group(2).split(), m.group(3)
                cmd = clean(body).replace("$" + var, "{" + "|".join(values) + "}")
            else:
                cmd = clean(line)
            sdpa["dec" if "--decode" in cmd else "bwd"] = cmd
    return sections, sdpa


def parse_bench_csv(path):
    """Rows of a flashcl-bench CSV, each with '_section' and '_block' (index of its header in the section)."""
    rows = []
    section, block, header = "", -1, None
    with open(path) as f:
        for line in f:
            if line.startswith("## "):
                section, block, header = line[3:].strip(), -1, None
                continue
            if not line.strip():
                continue
            if line.startswith("device,"):
                header = next(csv.reader([line]))
                block += 1
                continue
            if header is None:
                continue
            vals = next(csv.reader([line]))
            row = dict(zip(header, vals))
            row["_section"], row["_block"] = section, max(block, 0)
            row["_kind"] = "decode" if "kv_bytes" in header else "attn"
            rows.append(row)
    return rows


def classify(path):
    with open(path) as f:
        head = f.read(4096)
    if re.search(r'^device,', head, re.M) and ("pass," in head or "kv_bytes" in head):
        return "bench"
    if "| flashcl / flash |" in head or "flashcl / flash" in head:
        return "sdpa_fwd"
    if "batch,kv_len" in head:
        return "sdpa_dec"
    if "N,d,causal,batch,heads,pass" in head:
        return "sdpa_bwd"
    sys.exit(f"bench_report: {path}: not a flashcl-bench CSV or an sdpa_compare/sdpa_bench output")


def parse_sdpa_fwd(path):
    """sdpa_compare.py's Markdown table -> list of dicts, plus its '#' header line."""
    out, header, cols = [], "", None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("#"):
                header = line.lstrip("# ").strip()
            elif line.startswith("|") and cols is None:
                cols = [c.strip() for c in line.strip("|").split("|")]
            elif line.startswith("|") and not set(line) <= set("|-: "):
                vals = [c.strip() for c in line.strip("|").split("|")]
                out.append(dict(zip(cols, vals)))
    return out, header


def parse_sdpa_blocks(path):
    """sdpa_bench.py output: '# ...' header lines, each followed by CSV -> list of (header, rows)."""
    blocks = []
    with open(path) as f:
        text = f.read()
    cur = None
    for line in text.splitlines():
        if line.startswith("#"):
            cur = [line.lstrip("# ").strip(), None, []]
            blocks.append(cur)
        elif cur is not None and line.strip():
            if cur[1] is None:
                cur[1] = next(csv.reader([line]))
            else:
                cur[2].append(dict(zip(cur[1], next(csv.reader([line])))))
    return [(h, rows) for h, _, rows in blocks]


# ---------------------------------------------------------------- helpers

def f(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def ms(x):
    return "—" if x is None else (f"{x:.3f}" if x < 100 else f"{x:.1f}")


def num(x, nd=1):
    return "—" if x is None else f"{x:.{nd}f}"


def tflops_cell(x):
    """TFLOP/s with three significant figures below 1 (CPU devices)."""
    return "—" if x is None else (f"{x:.1f}" if x >= 10 else f"{x:.3g}")


def ratio(x):
    return "—" if x is None else f"{x:.2f}×"


def mib(b):
    if b is None:
        return "—"
    m = b / 2**20
    return f"{m:.0f}" if m >= 10 else f"{m:.1f}"


def flops(n, d, batch, heads, causal, factor):
    v = factor * n * n * d * batch * heads
    return v / 2 if causal else v


def bwd_sections(rows):
    """Sections whose runs timed the backward too (their forward rows belong to fwd+bwd)."""
    return {r["_section"] for r in rows if r["_kind"] == "attn" and r["pass"] == "bwd"}


def block_command(sections, row):
    cmds = sections.get(row["_section"], [])
    b = row["_block"]
    return cmds[b] if b < len(cmds) else None


def deterministic(cmd):
    m = re.search(r'--deterministic\s+(\d)', cmd or "")
    return int(m.group(1)) if m else 1


class Refs:
    """Numbers each distinct command and lists them under a table."""

    def __init__(self):
        self.cmds = []

    def ref(self, cmd):
        if cmd is None:
            return "?"
        if cmd not in self.cmds:
            self.cmds.append(cmd)
        return f"[{chr(ord('a') + self.cmds.index(cmd))}]"

    def render(self):
        return "".join(f"{chr(ord('a') + i)}. `{c}`\n" for i, c in enumerate(self.cmds))


# ---------------------------------------------------------------- tables

def forward_table(dev, rows, sections):
    # flash/naive pairs from forward-only sections (first forward of each (config, section))
    out = io.StringIO()
    refs = Refs()
    bws = bwd_sections(rows)
    keyed = {}
    order = []
    for r in rows:
        if r["_kind"] != "attn" or r["pass"] != "fwd" or r["_section"] in bws:
            continue
        k = (r["_section"], r["_block"], r["n"], r["d"], r["dtype"], r["causal"], r["batch"], r["heads"])
        if k not in keyed:
            keyed[k] = {}
            order.append(k)
        keyed[k][r["algo"]] = r
    if not order:
        return ""
    out.write("| N | d | dtype | causal | batch × heads | kernel | flash ms | flash TFLOP/s | naive ms | flash vs naive | flash MiB | naive MiB | cmd |\n")
    out.write("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for k in order:
        fl, nv = keyed[k].get("flash"), keyed[k].get("naive")
        if fl is None:
            continue
        fms, nms = f(fl["median_ms"]), (f(nv["median_ms"]) if nv else None)
        naive_cell = ms(nms) if nv is None or nv["status"] == "ok" else nv["status"]
        sp = nms / fms if (fms and nms) else None
        nmem = f(nv["total_bytes"]) if nv else None
        nmem_cell = mib(nmem) + (" (OOM)" if nv is not None and nv["status"] == "OOM" else "") if nv else "—"
        out.write(f"| {fl['n']} | {fl['d']} | {fl['dtype']} | {fl['causal']} | {fl['batch']} × {fl['heads']} | "
                  f"{fl.get('kernel') or fl.get('family')} | {ms(fms)} | {tflops_cell(f(fl['tflops']))} | {naive_cell} | "
                  f"{ratio(sp)} | {mib(f(fl['total_bytes']))} | {nmem_cell} | {refs.ref(block_command(sections, fl))} |\n")
    out.write("\n" + refs.render())
    return out.getvalue()


def fwdbwd_table(dev, rows, sections, sdpa_bwd):
    out = io.StringIO()
    refs = Refs()
    bws = bwd_sections(rows)
    groups, order = {}, []
    for r in rows:
        if r["_kind"] != "attn" or r["_section"] not in bws:
            continue
        cmd = block_command(sections, r)
        k = (r["_section"], r["_block"], r["n"], r["d"], r["dtype"], r["causal"], r["batch"], r["heads"])
        if k not in groups:
            groups[k] = {"cmd": cmd}
            order.append(k)
        groups[k][(r["algo"], r["pass"])] = r
    if not order:
        return ""
    # SDPA fwd+bwd (ms) per (backend, N, d, causal)
    sd = {}
    for header, srows in sdpa_bwd:
        m = re.search(r'backend (\w+)', header)
        be = m.group(1) if m else "?"
        for s in srows:
            if s.get("pass") == "fwd+bwd":
                sd[(be, s["N"], s["d"], s["causal"])] = f(s["ms"])
    have_sdpa = bool(sd)
    cols = "| N | d | dtype | causal | batch × heads | dQ mode | flash fwd ms | flash bwd ms | flash fwd+bwd ms | TFLOP/s | naive fwd+bwd ms | vs naive |"
    if have_sdpa:
        cols += " vs SDPA flash | vs SDPA cuDNN |"
    cols += " cmd |\n"
    out.write(cols)
    out.write("|" + "---|" * (cols.count("|") - 1) + "\n")
    for k in order:
        g = groups[k]
        ff, fb = g.get(("flash", "fwd")), g.get(("flash", "bwd"))
        if ff is None or fb is None:
            continue
        nf, nb = g.get(("naive", "fwd")), g.get(("naive", "bwd"))
        t = f(ff["median_ms"]) + f(fb["median_ms"])
        n, d, b, h, c = int(ff["n"]), int(ff["d"]), int(ff["batch"]), int(ff["heads"]), ff["causal"] == "1"
        tf = flops(n, d, b, h, c, 14) / (t * 1e-3) / 1e12
        nt = f(nf["median_ms"]) + f(nb["median_ms"]) if (nf and nb and nf["status"] == nb["status"] == "ok") else None
        det = deterministic(g["cmd"])
        line = (f"| {n} | {d} | {ff['dtype']} | {ff['causal']} | {b} × {h} | "
                f"{'deterministic' if det else 'atomic'} | {ms(f(ff['median_ms']))} | {ms(f(fb['median_ms']))} | "
                f"{ms(t)} | {tflops_cell(tf)} | {ms(nt)} | {ratio(nt / t if nt else None)} |")
        if have_sdpa:
            for be in ("flash", "cudnn"):
                s = sd.get((be, ff["n"], ff["d"], ff["causal"])) if ff["dtype"] == "f16" else None
                line += f" {ratio(s / t if s else None)} |"
        line += f" {refs.ref(g['cmd'])} |\n"
        out.write(line)
    out.write("\n" + refs.render())
    if have_sdpa:
        out.write("\nSDPA fwd+bwd (ms, same shapes, fp16): " + "; ".join(
            f"{be} N={n} d={d} causal={c}: {v:.3f}" for (be, n, d, c), v in sorted(sd.items())) + ".\n")
    return out.getvalue()


def sdpa_fwd_table(sdpa_fwd, header):
    if not sdpa_fwd:
        return ""
    out = io.StringIO()
    out.write("| N | d | causal | flashcl TFLOP/s | SDPA flash TFLOP/s | SDPA cuDNN TFLOP/s | vs SDPA flash | vs SDPA cuDNN |\n")
    out.write("|---|---|---|---|---|---|---|---|\n")
    for r in sdpa_fwd:
        fc, fl, cu = f(r.get("flashcl")), f(r.get("flash")), f(r.get("cudnn"))
        out.write(f"| {r['N']} | {r['d']} | {r['causal']} | {num(fc)} | {num(fl)} | {num(cu)} | "
                  f"{ratio(fc / fl if fc and fl else None)} | {ratio(fc / cu if fc and cu else None)} |\n")
    if header:
        out.write(f"\n(`{header}`; flashcl and SDPA ran in the same process.)\n")
    return out.getvalue()


def decode_table(rows, sections, sdpa_dec):
    out = io.StringIO()
    refs = Refs()
    drows = [r for r in rows if r["_kind"] == "decode"]
    if not drows:
        return ""
    sd = {}
    for header, srows in sdpa_dec:
        for s in srows:
            sd.setdefault((s["batch"], s["kv_len"], s["d"]), []).append(f(s["GB/s (K+V bytes read / time)"] if "GB/s (K+V bytes read / time)" in s else list(s.values())[-1]))
    cols = "| batch | KV length | d | dtype | heads (q / kv) | q_len | splits | ms | GB/s | host µs |"
    if sd:
        cols += " SDPA GB/s | vs SDPA |"
    cols += " cmd |\n"
    out.write(cols)
    out.write("|" + "---|" * (cols.count("|") - 1) + "\n")
    for r in drows:
        line = (f"| {r['batch']} | {r['n']} | {r['d']} | {r['dtype']} | {r['heads']} / {r['heads_kv']} | {r['q_len']} | "
                f"{r['splits']} | {ms(f(r['median_ms']))} | {num(f(r['gbps']))} | {num(f(r['host_us']))} |")
        if sd:
            s = [x for x in sd.get((r["batch"], r["n"], r["d"]), []) if x]
            g = f(r["gbps"])
            if s:
                line += " " + " / ".join(f"{x:.0f}" for x in s) + " | "
                lo, hi = g / max(s), g / min(s)
                line += (f"{lo:.2f}×" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}×") + " |"
            else:
                line += " — | — |"
        line += f" {refs.ref(block_command(sections, r))} |\n"
        out.write(line)
    out.write("\n" + refs.render())
    return out.getvalue()


# ---------------------------------------------------------------- plots

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def svg_plot(path, title, ylabel, series, xlabel="sequence length N"):
    """series: list of (label, color, dashed, [(x, y, hollow)]). Log-log axes."""
    pts = [(x, y) for _, _, _, p in series for x, y, _ in p if x and y]
    if not pts:
        return False
    W, H, L, R, T, B = 640, 440, 80, 200, 60, 56
    lx = [math.log10(x) for x, _ in pts]
    ly = [math.log10(y) for _, y in pts]
    x0, x1 = math.floor(min(lx) * 2) / 2, math.ceil(max(lx) * 2) / 2
    if x1 - x0 < 1:
        x1 = x0 + 1
    y0, y1 = math.floor(min(ly)), math.ceil(max(ly))
    if y1 - y0 < 1:
        y1 = y0 + 1
    pw, ph = W - L - R, H - T - B

    def X(x):
        return L + (math.log10(x) - x0) / (x1 - x0) * pw

    def Y(y):
        return T + ph - (math.log10(y) - y0) / (y1 - y0) * ph

    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         f'font-family="Helvetica,Arial,sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         ]
    for k, part in enumerate(title.split(": ", 1)):
        weight = ' font-weight="bold"' if k == 0 else ""
        s.append(f'<text x="{W / 2}" y="{22 + 18 * k}" text-anchor="middle" font-size="{14 - k}"{weight}>'
                 f'{esc(part)}</text>')
    # y grid: decades (labelled) and 2, 5 (light)
    for e in range(y0, y1 + 1):
        for m in (1, 2, 5):
            v = m * 10 ** e
            if math.log10(v) > y1 + 1e-9:
                continue
            yy = Y(v)
            s.append(f'<line x1="{L}" y1="{yy:.1f}" x2="{L + pw}" y2="{yy:.1f}" stroke="{"#ccc" if m == 1 else "#eee"}"/>')
            if m == 1:
                s.append(f'<text x="{L - 6}" y="{yy + 4:.1f}" text-anchor="end">{esc(fmt_pow(v, ylabel))}</text>')
    # x ticks: powers of two inside the range
    p2 = 2 ** math.ceil(math.log2(10 ** x0))
    while p2 <= 10 ** x1 * 1.0001:
        xx = X(p2)
        s.append(f'<line x1="{xx:.1f}" y1="{T}" x2="{xx:.1f}" y2="{T + ph}" stroke="#eee"/>')
        s.append(f'<text x="{xx:.1f}" y="{T + ph + 16}" text-anchor="middle">{fmt_n(p2)}</text>')
        p2 *= 2
    s.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    s.append(f'<text x="{L + pw / 2}" y="{H - 14}" text-anchor="middle">{esc(xlabel)} (log scale)</text>')
    s.append(f'<text transform="translate(18,{T + ph / 2}) rotate(-90)" text-anchor="middle">{esc(ylabel)} (log scale)</text>')
    for i, (label, color, dashed, p) in enumerate(series):
        p = [(x, y, h) for x, y, h in p if x and y]
        solid = [(x, y) for x, y, h in p if not h]
        if len(solid) > 1:
            d = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in solid)
            s.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"'
                     + (' stroke-dasharray="6,4"' if dashed else "") + "/>")
        for x, y, h in p:
            s.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="4" stroke="{color}" stroke-width="2" '
                     f'fill="{"white" if h else color}"><title>{esc(label)}: N={x}, {y:.4g}{" (OOM: required)" if h else ""}</title></circle>')
        ly_ = T + 10 + i * 20
        s.append(f'<line x1="{L + pw + 12}" y1="{ly_}" x2="{L + pw + 40}" y2="{ly_}" stroke="{color}" stroke-width="2"'
                 + (' stroke-dasharray="6,4"' if dashed else "") + "/>")
        s.append(f'<circle cx="{L + pw + 26}" cy="{ly_}" r="3.5" fill="{color}"/>')
        s.append(f'<text x="{L + pw + 46}" y="{ly_ + 4}">{esc(label)}</text>')
    if any(h for _, _, _, p in series for _, _, h in p):
        ly_ = T + 10 + len(series) * 20 + 6
        s.append(f'<circle cx="{L + pw + 26}" cy="{ly_}" r="3.5" fill="white" stroke="#333" stroke-width="2"/>')
        s.append(f'<text x="{L + pw + 46}" y="{ly_ + 4}">OOM (bytes required)</text>')
    s.append("</svg>")
    with open(path, "w") as fh:
        fh.write("\n".join(s) + "\n")
    return True


def esc(t):
    return str(t).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def fmt_n(n):
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def fmt_pow(v, unit):
    if "bytes" in unit:
        if v >= 1e9:
            return f"{v / 1e9:g} GB"
        if v >= 1e6:
            return f"{v / 1e6:g} MB"
        if v >= 1e3:
            return f"{v / 1e3:g} kB"
        return f"{v:g} B"
    return f"{v:g}"


def plots(dev, rows, img_dir, slug):
    """Runtime and memory against N for the forward, flash against naive, per (d, dtype, causal=0)."""
    bws = bwd_sections(rows)
    fw = [r for r in rows if r["_kind"] == "attn" and r["pass"] == "fwd" and r["_section"] not in bws
          and r["causal"] == "0"]
    keys = []
    for r in fw:
        k = (r["d"], r["dtype"])
        if k not in keys:
            keys.append(k)
    # keep the configurations swept over at least two N, one dtype per head dim (the first)
    keys = [k for k in keys if len({r["n"] for r in fw if (r["d"], r["dtype"]) == k}) > 1]
    keys = [k for i, k in enumerate(keys) if k[0] not in [x[0] for x in keys[:i]]]
    if not keys:
        return []
    tokens = {(int(r["batch"]) * int(r["n"])) for r in fw}
    batches = {r["batch"] for r in fw}
    shape = (f"batch·N = {tokens.pop()} tokens" if len(tokens) == 1 and len(batches) > 1
             else f"batch {batches.pop()}" if len(batches) == 1 else "batch varies")
    rt, mem = [], []
    for i, (d, dt) in enumerate(keys):
        for algo, dashed in (("flash", False), ("naive", True)):
            sel = {}
            for r in fw:
                if (r["d"], r["dtype"], r["algo"]) == (d, dt, algo) and r["n"] not in sel:
                    sel[r["n"]] = r
            pts_t = [(int(n), f(r["median_ms"]), False) for n, r in sel.items() if r["status"] == "ok"]
            pts_m = [(int(n), f(r["total_bytes"]), r["status"] != "ok") for n, r in sel.items()]
            color = PALETTE[(2 * i + (algo == "naive")) % len(PALETTE)]
            label = f"{algo} d={d} {dt}"
            rt.append((label, color, dashed, sorted(pts_t)))
            mem.append((label, color, dashed, sorted(pts_m)))
    os.makedirs(img_dir, exist_ok=True)
    heads = sorted({r["heads"] for r in fw})
    sub = f"{shape}, hidden {int(heads[0]) * int(keys[0][0])}" if len(heads) == 1 else shape
    out = []
    p1 = os.path.join(img_dir, f"{slug}-runtime.svg")
    if svg_plot(p1, f"{dev}: forward runtime ({sub})", "time per call, ms", rt):
        out.append(("runtime", p1))
    p2 = os.path.join(img_dir, f"{slug}-memory.svg")
    if svg_plot(p2, f"{dev}: forward memory ({sub})", "device memory, bytes", mem):
        out.append(("memory", p2))
    return out


# ---------------------------------------------------------------- main

def parse_groups(argv):
    top = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--out", default="BENCHMARKS.md")
    top.add_argument("--img", default="docs/img")
    top.add_argument("--invoked-as", default=None,
                     help="the command to print as the way to regenerate (default: this invocation)")
    i = argv.index("--device") if "--device" in argv else len(argv)
    args = top.parse_args(argv[:i])
    g = argparse.ArgumentParser(prog="bench_report.py --device")
    g.add_argument("--device", required=True)
    g.add_argument("--slug", required=True, help="file-name prefix of the device's plots")
    g.add_argument("--date", required=True)
    g.add_argument("--commit", required=True)
    g.add_argument("--commands", required=True)
    g.add_argument("--note", default="")
    g.add_argument("files", nargs="+")
    groups, rest = [], argv[i:]
    while rest:
        j = next((k for k in range(1, len(rest)) if rest[k] == "--device"), len(rest))
        groups.append(g.parse_args(rest[:j]))
        rest = rest[j:]
    if not groups:
        top.error("at least one --device group is needed")
    return args, groups


def main(argv):
    args, groups = parse_groups(argv)
    md = io.StringIO()
    md.write(BEGIN + "\n")
    md.write("## Current figures\n\n")
    md.write("Generated by `scripts/bench_report.py` from the files in [docs/bench-data/](docs/bench-data/); "
             "do not edit by hand. Regenerate with:\n\n```\n" +
             (args.invoked_as or "python3 scripts/bench_report.py " + " ".join(shlex.quote(a) for a in argv)) +
             "\n```\n\n")
    md.write("Each table gives the device, date and commit above it, and the exact commands below it "
             "(the `cmd` column). Ratios are speed ratios (the other's time / flashcl's time): "
             "above 1 means flashcl is faster. \"vs naive\" compares with flashcl's own naive path "
             "(CLBlast GEMMs and a softmax kernel, O(N²) memory); \"vs SDPA\" with PyTorch's "
             "`scaled_dot_product_attention` on the same GPU (FlashAttention-2 and cuDNN backends). "
             "Memory is the tensors plus flashcl's workspace (`total_bytes`); OOM rows did not fit "
             "and show what they would need. Older measurements are under [History](#history).\n\n")
    for grp in groups:
        sections, sdpa_cmds = parse_commands(grp.commands)
        rows, sfwd, sfwd_h, sbwd, sdec = [], [], "", [], []
        for p in grp.files:
            kind = classify(p)
            if kind == "bench":
                rows += parse_bench_csv(p)
            elif kind == "sdpa_fwd":
                sfwd, sfwd_h = parse_sdpa_fwd(p)
            elif kind == "sdpa_bwd":
                sbwd = parse_sdpa_blocks(p)
            elif kind == "sdpa_dec":
                sdec = parse_sdpa_blocks(p)
        dev = grp.device
        md.write(f"### {dev}\n\n")
        md.write(f"Measured {grp.date}, commit {grp.commit}; flashcl-bench reported the device as "
                 f"\"{rows[0]['device'] if rows else '?'}\". Commands: [`{grp.commands}`]({grp.commands}).")
        if grp.note:
            md.write(" " + grp.note)
        md.write("\n\n")
        t = forward_table(dev, rows, sections)
        if t:
            md.write(f"#### Forward ({dev}, {grp.date})\n\n" + t + "\n")
        t = sdpa_fwd_table(sfwd, sfwd_h)
        if t:
            md.write(f"#### Forward against PyTorch SDPA ({dev}, {grp.date})\n\n" + t)
            if "fwd" in sdpa_cmds:
                md.write(f"Command: `{sdpa_cmds['fwd']}`\n")
            md.write("\n")
        t = fwdbwd_table(dev, rows, sections, sbwd)
        if t:
            md.write(f"#### Forward + backward ({dev}, {grp.date})\n\n"
                     "TFLOP/s counts 14·N²·d per head and batch (4 forward + 10 backward, FlashAttention-2's "
                     "convention), half when causal.\n\n" + t)
            if sbwd and "bwd" in sdpa_cmds:
                md.write(f"SDPA command: `{sdpa_cmds['bwd']}`\n")
            md.write("\n")
        t = decode_table(rows, sections, sdec)
        if t:
            md.write(f"#### Decode ({dev}, {grp.date})\n\n"
                     "GB/s = K and V bytes read / median time of one call (host enqueue included).\n\n" + t)
            if sdec:
                hdr = sdec[0][0]
                md.write(f"\nSDPA: `{hdr}`; one value per run ({len(sdec)} runs)")
                if "dec" in sdpa_cmds:
                    md.write(f", command `{sdpa_cmds['dec']}` (its decode mode reports the default backend "
                             "whichever `--backend` is given)")
                md.write(".\n")
            md.write("\n")
        figs = plots(dev, rows, args.img, grp.slug)
        if figs:
            md.write(f"#### Runtime and memory against N ({dev}, {grp.date})\n\n")
            md.write("Forward, non-causal, flash against naive, log-log (as Fig. 3 of the FlashAttention paper); "
                     "hollow markers: OOM, at the memory the configuration would need.\n\n")
            for what, p in figs:
                rel = os.path.relpath(p, os.path.dirname(os.path.abspath(args.out)) if args.out != "-" else ".")
                md.write(f"![{dev}: forward {what} against N]({rel})\n")
            md.write("\n")
    md.write(END + "\n")
    block = md.getvalue()
    if args.out == "-":
        sys.stdout.write(block)
        return 0
    with open(args.out) as fh:
        text = fh.read()
    if BEGIN in text and END in text:
        a = text.index(BEGIN)
        b = text.index(END) + len(END) + 1
        text = text[:a] + block + text[b:]
    else:
        sys.exit(f"bench_report: {args.out} has no {BEGIN} / {END} lines (use --out - to print)")
    with open(args.out, "w") as fh:
        fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
