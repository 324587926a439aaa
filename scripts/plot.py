#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws tpcomm's JSON reports as PNG charts.

    scripts/plot.py REPORT.json [-o OUT.png] [--check]

- `tpcomm bench --json` reports: latency against message size, one line per algorithm (NCCL's
  dashed), log axes; with an NCCL row, a second panel shows each algorithm's speed-up over it.
- `tpcomm step --json` reports: for each token count, one bar per variant, stacked by component
  (each component's reductions timed alone, and the compute gaps), with the whole step measured
  as one graph marked on top and the share of it that tpcomm's chosen paths save.

Needs python3 and matplotlib (Debian/Ubuntu: apt-get install python3-matplotlib; elsewhere
python3 -m pip install matplotlib). With --check (the tests), a missing matplotlib exits 77
(skipped) and the PNG is verified after drawing.
"""
import argparse
import json
import os
import sys

NCCL_ALGOS = ("nccl", "nccl_direct")
COMPONENTS = (("attn_reduce", "attention reductions", "#4C72B0"),
              ("mlp_reduce", "MLP / MoE reductions", "#55A868"),
              ("lm_head", "LM head", "#C44E52"))
COMPUTE_COLOR = "#BBBBBB"


def human_bytes(n):
    for unit in ("B", "K", "M", "G"):
        if abs(n) < 1024 or unit == "G":
            return f"{n:g}{unit}"
        n /= 1024
    return f"{n:g}G"


def plot_bench(doc, plt, matplotlib):
    rows = doc.get("rows", [])
    if not rows:
        raise ValueError("the bench report has no rows")
    series = {}  # algo -> [(size, time_us)]
    for r in rows:
        col = r.get("out_of_place") or r.get("in_place")
        if not isinstance(col, dict) or "time_us" not in col:
            continue
        series.setdefault(r["algo"], []).append((r["size"], col["time_us"]))
    if not series:
        raise ValueError("the bench report has no timed rows")
    first = rows[0]
    nccl = next((a for a in ("nccl_direct", "nccl") if a in series), None)
    panels = 2 if nccl and len(series) > 1 else 1
    fig, axes = plt.subplots(panels, 1, figsize=(9, 4.5 * panels), squeeze=False,
                             sharex=True)
    ax = axes[0][0]
    for algo in sorted(series, key=lambda a: (a in NCCL_ALGOS, a)):
        pts = sorted(series[algo])
        style = "--" if algo in NCCL_ALGOS else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", markersize=3,
                label=algo)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=(2, 5)))
    ax.yaxis.set_minor_formatter(plain)
    ax.set_ylabel("time per operation (µs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    mode = "CUDA graph replay" if first.get("graph") else "eager"
    ax.set_title(f"tpcomm bench {doc.get('version', '')}: {first.get('op', '?')}, "
                 f"{doc.get('world_size', '?')} ranks, {first.get('type', '?')}, {mode}")
    if panels == 2:
        base = dict(series[nccl])
        bx = axes[1][0]
        for algo in sorted(series):
            if algo == nccl:
                continue
            pts = [(s, base[s] / t) for s, t in sorted(series[algo]) if s in base and t > 0]
            if pts:
                bx.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                        label=algo)
        bx.axhline(1.0, color="black", linewidth=0.8)
        bx.set_xscale("log", base=2)
        bx.set_ylabel(f"speed-up over {nccl}")
        bx.grid(True, which="both", alpha=0.3)
        bx.legend(fontsize=8, ncol=2)
    bottom = axes[-1][0]
    bottom.set_xlabel("message size (bytes)")
    sizes = sorted({s for pts in series.values() for s, _ in pts})
    step = max(1, len(sizes) // 10)
    bottom.set_xticks(sizes[::step])
    bottom.set_xticklabels([human_bytes(s) for s in sizes[::step]], rotation=0)
    fig.tight_layout()
    return fig


def plot_step(doc, plt, matplotlib):
    configs = doc.get("configs", [])
    if not configs:
        raise ValueError("the step report has no configurations")
    model = doc.get("model", {})
    compute = doc.get("compute_us", 0) or 0
    fig, axes = plt.subplots(1, len(configs), figsize=(3.2 * len(configs) + 1.5, 5.2),
                             squeeze=False)
    for ax, cfg in zip(axes[0], configs):
        names = [v["variant"] for v in cfg["variants"]]
        top = 0.0
        missing = []
        for i, v in enumerate(cfg["variants"]):
            if not v.get("available"):
                missing.append(i)
                continue
            bottom = 0.0
            if compute > 0:
                ax.bar(i, compute, color=COMPUTE_COLOR, edgecolor="white")
                bottom = compute
            for key, _, color in COMPONENTS:
                h = v.get("components_us", {}).get(key, 0)
                ax.bar(i, h, bottom=bottom, color=color, edgecolor="white")
                bottom += h
            step = v["step_us"]
            ax.plot([i - 0.4, i + 0.4], [step, step], color="black", linewidth=2)
            label = f"{step:.0f} µs"
            if v.get("saving_share") is not None:
                label += f"\ntpcomm saves {100 * v['saving_share']:.0f}%"
            ax.text(i, max(step, bottom), label, ha="center", va="bottom", fontsize=8)
            top = max(top, step, bottom)
        for i in missing:
            ax.text(i, (top or 1) * 0.05, "not\navailable\n(see the\nreport)", ha="center",
                    va="bottom", color="gray", fontsize=8)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names)
        ax.set_ylim(0, top * 1.25 if top > 0 else 1)
        ax.set_title(f"{cfg['tokens']} token{'s' if cfg['tokens'] != 1 else ''} per rank",
                     fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("time per decode step (µs)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, _, c in COMPONENTS]
    labels = [f"{name} (alone)" for _, name, _ in COMPONENTS]
    if compute > 0:
        handles.insert(0, plt.Rectangle((0, 0), 1, 1, color=COMPUTE_COLOR))
        labels.insert(0, f"compute gaps ({doc.get('gaps_per_step', 0)} × "
                         f"{doc.get('compute_us_per_gap', 0):g} µs)")
    handles.append(plt.Line2D([0], [0], color="black", linewidth=2))
    labels.append("whole step, one graph")
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    moe = ", MoE" if model.get("moe") else ""
    fig.suptitle(f"tpcomm step: {model.get('name', '?')} (hidden {model.get('hidden_size')}, "
                 f"{model.get('num_layers')} layers, vocab {model.get('vocab_size')}{moe}), "
                 f"tp {doc.get('tp')}, {doc.get('gpu', '')}", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return fig


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", help="a tpcomm bench --json or tpcomm step --json file")
    p.add_argument("-o", "--output", help="the PNG to write (default: REPORT with .png)")
    p.add_argument("--check", action="store_true",
                   help="exit 77 without matplotlib, and verify the PNG (for the tests)")
    a = p.parse_args()
    out = a.output or os.path.splitext(a.report)[0] + ".png"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401 (used as matplotlib.ticker)
    except ImportError:
        print("plot.py needs matplotlib: apt-get install python3-matplotlib (Debian/Ubuntu) or "
              "python3 -m pip install matplotlib", file=sys.stderr)
        return 77 if a.check else 1
    with open(a.report, encoding="utf-8") as f:
        doc = json.load(f)
    tool = doc.get("tool")
    if tool == "tpcomm bench":
        fig = plot_bench(doc, plt, matplotlib)
    elif tool == "tpcomm step":
        fig = plot_step(doc, plt, matplotlib)
    else:
        print(f"{a.report}: not a tpcomm bench or tpcomm step report (tool: {tool!r})",
              file=sys.stderr)
        return 1
    fig.savefig(out, dpi=120)
    if a.check:
        with open(out, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                print(f"{out}: not a PNG", file=sys.stderr)
                return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
