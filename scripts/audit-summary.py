#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Lists every loss of `tpcomm bench --audit --json` reports, one line each.

    scripts/audit-summary.py REPORT.json [REPORT.json ...]

A loss is a size where the built-in choice (auto) was slower than the fastest other path by
more than max(3%, 0.2 µs) (tools/audit.hpp); each line names the report, the operation and its
shape, the world size, hot or cold, the size (and the tokens it holds), both paths and their
times. Then a line per report with its count of losses and points, and the reports that have no
audit section. Exits 0 whether or not there are losses, 1 where a report cannot be read.
Standard library only.
"""
import json
import os
import sys

# Facts of a run: `tpcomm bench` writes them in each row (with `cold`); reports written before it
# did may carry them at their top level (scripts/plot.py reads the same).
SHAPE_FACTS = ("hidden", "top_k", "shared_expert", "vocab")
ELEMENT_BYTES = {"double": 8, "float": 4, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
                 "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "f8e4m3": 1, "f8e5m2": 1}


def run_fact(doc, key):
    rows = doc.get("rows") or [{}]
    return rows[0].get(key, doc.get(key))


def shape(doc, op):
    parts = [op]
    if run_fact(doc, "hidden"):
        parts.append(f"hidden={run_fact(doc, 'hidden')}")
    if run_fact(doc, "top_k"):
        parts.append(f"top_k={run_fact(doc, 'top_k')}")
    if run_fact(doc, "shared_expert"):
        parts.append("shared_expert")
    if run_fact(doc, "vocab"):
        parts.append(f"vocab={run_fact(doc, 'vocab')}")
    return ",".join(parts)


def tokens(doc, size):
    """The rows (tokens) a size holds where the row length is known, else ''."""
    row = run_fact(doc, "vocab") or run_fact(doc, "hidden")
    es = ELEMENT_BYTES.get(run_fact(doc, "type"))
    return str(size // (row * es)) if row and es and size % (row * es) == 0 else ""


def main(paths):
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    header = (f"{'report':<36} {'operation':<44} {'ranks':>5} {'cache':<5} {'size':>10} "
              f"{'tokens':>6} {'auto (us)':>9} {'auto path':<28} {'best (us)':>9} {'best':<16} "
              f"{'best path':<28} {'ratio':>6}")
    lines, counts, without = [], [], []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 1
        audit = doc.get("audit")
        if not isinstance(audit, list):
            without.append(path)
            continue
        cache = "cold" if run_fact(doc, "cold") else "hot"
        name = os.path.basename(path)
        losses = [p for p in audit if p.get("loss")]
        counts.append(f"{name}: {len(losses)} of {len(audit)} points")
        for p in losses:
            lines.append(f"{name:<36} {shape(doc, p['op']):<44} {p['world_size']:>5} {cache:<5} "
                         f"{p['size']:>10} {tokens(doc, p['size']):>6} {p['builtin_us']:>9.2f} "
                         f"{p['builtin_path']:<28} {p['best_us']:>9.2f} {p['best_algo']:<16} "
                         f"{p['best_path']:<28} {p['builtin_us'] / p['best_us']:>6.3f}")
    print(f"# tpcomm bench --audit: {len(lines)} loss(es) in {len(counts)} report(s), auto "
          "slower than the fastest other path by more than max(3%, 0.2 us)")
    if lines:
        print(header)
        print("\n".join(lines))
    print("# points per report:")
    print("\n".join(f"#   {c}" for c in counts) if counts else "#   none")
    if without:
        print("# reports without an audit section (a run that failed before its end?):")
        print("\n".join(f"#   {p}" for p in without))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
