"""Read MindSpore profiler output: the top ops by total time, per mode."""
from __future__ import annotations

import csv
import glob
import os


def top_ops(profile_dir: str, n: int = 10) -> list[dict]:
    """Top-n op types by total compute time from `FRAMEWORK/cpu_op_type_info_*.csv` under profile_dir.

    Only the newest profiler run is read: each run writes a directory of its own
    (`<host>_<pid>_<timestamp>_ascend_ms`), and a directory reused by an earlier `--profile` run must
    not add that run's ops to this one's.

    Returns `[{"op", "total_ms", "calls", "percent"}]`; empty when the profiler wrote no CPU table
    (on GPU/Ascend read the trace in `ASCEND_PROFILER_OUTPUT/trace_view.json` instead).
    """
    paths = glob.glob(os.path.join(profile_dir, "**", "cpu_op_type_info_*.csv"), recursive=True)
    if paths:
        newest = os.path.dirname(max(paths, key=os.path.getmtime))
        paths = [p for p in paths if os.path.dirname(p) == newest]
    rows = {}
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                op = r["op_type"]
                agg = rows.setdefault(op, {"op": op, "total_ms": 0.0, "calls": 0})
                agg["total_ms"] += float(r["total_compute_time"])
                agg["calls"] += int(r["type_occurrences"])
    total = sum(r["total_ms"] for r in rows.values()) or 1.0
    ranked = sorted(rows.values(), key=lambda r: r["total_ms"], reverse=True)[:n]
    for r in ranked:
        r["percent"] = 100.0 * r["total_ms"] / total
    return ranked
