#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws tpcomm's JSON reports as PNG charts.

    scripts/plot.py REPORT.json [REPORT.json ...] [-o OUT.png] [--check]

- `tpcomm bench --json` reports: latency against message size, one line per algorithm (NCCL's
  dashed), log axes; with an NCCL row, a second panel shows each algorithm's speed-up over it.
- `tpcomm bench --audit --json` reports (those with an `audit` section), one or several (a
  world size each, hot and `--cold`): per operation and shape, the built-in choice's time over
  the fastest other path's against size, one line per world size (cold ones dashed), the margin
  a loss must exceed shaded (max(3%, 0.2 µs): 1.03 shown), and the audit's losses marked.
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
# tools/audit.hpp: the rows that are not paths a group can take, and the margin a loss exceeds.
AUDIT_NOT_PATHS = ("nccl_direct", "memcpy", "allreduce")
AUDIT_MARGIN_RATIO = 1.03
# What a run's shape is made of: `tpcomm bench` writes it in each row (with `cold`); reports
# written before it did may carry it at their top level.
SHAPE_FACTS = ("hidden", "top_k", "shared_expert", "vocab")
ELEMENT_BYTES = {"double": 8, "float": 4, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
                 "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "f8e4m3": 1, "f8e5m2": 1}


def human_bytes(n, digits=None):
    for unit in ("B", "K", "M", "G"):
        if abs(n) < 1024 or unit == "G":
            return f"{n:.{digits}g}{unit}" if digits else f"{n:g}{unit}"
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


def run_fact(doc, key):
    """A fact of the run (`cold`, `hidden`, ...): its first row's, else the report's, else None."""
    rows = doc.get("rows") or [{}]
    return rows[0].get(key, doc.get(key))


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def fastest_other(doc):
    """(op, size) -> (time, algo) of the fastest path other than the one auto took, each path's
    median over the audit's rounds, as tools/audit.cpp reduces them."""
    times = {}  # (op, size) -> algo -> [time_us]
    paths = {}  # (op, size, algo) -> served_by
    for r in doc.get("rows", []):
        col = r.get("out_of_place")
        if r.get("algo") in AUDIT_NOT_PATHS or not isinstance(col, dict) or "time_us" not in col:
            continue
        key = (r.get("op"), r.get("size"))
        times.setdefault(key, {}).setdefault(r["algo"], []).append(col["time_us"])
        paths.setdefault(key + (r["algo"],), r.get("served_by", ""))
    out = {}
    for key, algos in times.items():
        if "auto" not in algos:
            continue
        auto_path = paths[key + ("auto",)]
        others = [(median(us), algo) for algo, us in algos.items()
                  if algo != "auto" and paths[key + (algo,)] != auto_path]
        if others:
            out[key] = min(others)
    return out


def shape_label(op, facts):
    parts = [op]
    if facts.get("hidden"):
        parts.append(f"hidden {facts['hidden']}")
    if facts.get("top_k"):
        parts.append(f"top-{facts['top_k']}" + (" + shared" if facts.get("shared_expert") else ""))
    if facts.get("vocab"):
        parts.append(f"vocab {facts['vocab']}")
    return ", ".join(parts)


def size_label(size, facts, dtype):
    """The size, with the tokens it holds where the row length is known."""
    row = facts.get("vocab") or facts.get("hidden")
    es = ELEMENT_BYTES.get(dtype)
    short = human_bytes(size, digits=3)  # 5760 B: 5.62K, not 5.625K
    if row and es and size % (row * es) == 0:
        return f"{short}\n{size // (row * es)} tok"
    return short


def plot_audit(docs, names, plt, matplotlib):
    """Panels per operation and shape; a line per (world size, hot or cold). Reports that do not
    record their shape (`hidden`, ...) and would share a line keep their own, named by file."""
    panels = {}  # (op, facts) -> {(world, cold, file or ""): [(size, ratio, loss, best_algo)]}
    owners = {}  # (op, facts, world, cold) -> the report that drew that line first
    dtypes = {}
    for doc, name in zip(docs, names):
        audit = doc.get("audit")
        if not isinstance(audit, list):
            raise ValueError("a report without an audit section among audit reports")
        facts = tuple((k, run_fact(doc, k)) for k in SHAPE_FACTS if run_fact(doc, k))
        cold = bool(run_fact(doc, "cold"))
        others = fastest_other(doc)
        for p in audit:
            key = (p["op"], facts)
            dtypes.setdefault(key, run_fact(doc, "type"))
            other = others.get((p["op"], p["size"]))
            if other:
                ratio, best = p["builtin_us"] / other[0], other[1]
            elif p["best_algo"] != "auto":
                ratio, best = p["builtin_us"] / p["best_us"], p["best_algo"]
            else:
                continue  # no other path timed at this size
            owner = owners.setdefault(key + (p["world_size"], cold), name)
            tag = "" if owner == name else os.path.basename(name)
            line = panels.setdefault(key, {}).setdefault((p["world_size"], cold, tag), [])
            line.append((p["size"], ratio, bool(p.get("loss")), best))
    if not panels:
        raise ValueError("the audit reports have no point with another path to compare")
    for key, lines in panels.items():  # the first of reports sharing a line named too
        for world, cold, tag in list(lines):
            if tag and (world, cold, "") in lines:
                first = os.path.basename(owners[key + (world, cold)])
                lines[(world, cold, first)] = lines.pop((world, cold, ""))
    n = len(panels)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    worlds = sorted({line[0] for lines in panels.values() for line in lines})
    colors = {w: f"C{i}" for i, w in enumerate(worlds)}
    for ax, (key, lines) in zip(axes.flat, sorted(panels.items(), key=str)):
        op, facts, dtype = key[0], dict(key[1]), dtypes[key]
        ax.axhspan(1.0, AUDIT_MARGIN_RATIO, color="#DDDDDD", zorder=0,
                   label="margin: max(3%, 0.2 µs)")
        ax.axhline(1.0, color="black", linewidth=0.8)
        sizes = set()
        for (world, cold, tag), pts in sorted(lines.items()):
            pts.sort()
            sizes.update(s for s, *_ in pts)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "--" if cold else "-", marker="o",
                    markersize=3, color=colors[world],
                    label=", ".join([f"{world} ranks"] + ["cold"] * cold + [tag] * bool(tag)))
            for size, ratio, loss, best in pts:
                if loss:
                    ax.plot(size, ratio, "x", color="red", markersize=9, markeredgewidth=2)
                    ax.annotate(best, (size, ratio), textcoords="offset points", xytext=(4, 4),
                                fontsize=7, color="red")
        if any(loss for pts in lines.values() for *_, loss, _ in pts):
            ax.plot([], [], "x", color="red", markersize=9, markeredgewidth=2,
                    label="loss (the audit's; beside it, the faster path)")
        ax.set_xscale("log", base=2)
        ratios = [p[1] for pts in lines.values() for p in pts]
        if max(ratios) / min(ratios) > 4:  # a path far behind would flatten the rest
            ax.set_yscale("log")
            plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        else:  # the margin's band no taller than a few percent of the panel
            lo, hi = ax.get_ylim()
            ax.set_ylim(min(lo, 0.9), max(hi, 1.1))
        sizes = sorted(sizes)
        step = max(1, len(sizes) // 8)
        ax.set_xticks(sizes[::step])
        ax.set_xticklabels([size_label(s, facts, dtype) for s in sizes[::step]], fontsize=8)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_title(shape_label(op, facts), fontsize=10)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("auto / fastest other path")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    version = docs[0].get("version", "")
    fig.suptitle(f"tpcomm bench {version} --audit: the built-in choice's time over the fastest "
                 "other path's (above 1: another path is faster)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
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
    p.add_argument("report", nargs="+",
                   help="a tpcomm bench --json or tpcomm step --json file; several: tpcomm bench "
                        "--audit reports, drawn together")
    p.add_argument("-o", "--output",
                   help="the PNG to write (default: the first REPORT with .png)")
    p.add_argument("--check", action="store_true",
                   help="exit 77 without matplotlib, and verify the PNG (for the tests)")
    a = p.parse_args()
    out = a.output or os.path.splitext(a.report[0])[0] + ".png"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401 (used as matplotlib.ticker)
    except ImportError:
        print("plot.py needs matplotlib: apt-get install python3-matplotlib (Debian/Ubuntu) or "
              "python3 -m pip install matplotlib", file=sys.stderr)
        return 77 if a.check else 1
    docs = []
    for path in a.report:
        with open(path, encoding="utf-8") as f:
            docs.append(json.load(f))
        tool = docs[-1].get("tool")
        if tool not in ("tpcomm bench", "tpcomm step"):
            print(f"{path}: not a tpcomm bench or tpcomm step report (tool: {tool!r})",
                  file=sys.stderr)
            return 1
        if len(a.report) > 1 and "audit" not in docs[-1]:
            print(f"{path}: several reports are drawn together only as audits, and this one has "
                  "no audit section (tpcomm bench --audit --json)", file=sys.stderr)
            return 1
    doc = docs[0]
    if "audit" in doc:
        fig = plot_audit(docs, a.report, plt, matplotlib)
    elif doc.get("tool") == "tpcomm bench":
        fig = plot_bench(doc, plt, matplotlib)
    else:
        fig = plot_step(doc, plt, matplotlib)
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
