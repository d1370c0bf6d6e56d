"""Run `mindstep doctor` over a corpus of real MindSpore projects and print what a maintainer needs
to judge its rules: files read, time, the slowest file, graph-code reach (how many `construct`
methods were analysed as compiled code), and every finding with its source line.

    python tools/doctor_corpus.py CORPUS/*          # a row per folder (a repository)
    python tools/doctor_corpus.py --json out.json CORPUS/*

The corpus itself (public repositories fetched for the purpose) stays outside this repository.
"""
from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import sys

from mindstep import doctor
from mindstep.doctor.analysis import Module


def reach(files, projects) -> tuple[int, int]:
    """(construct methods analysed as graph code, construct methods) over the files."""
    compiled = total = 0
    for file in files:
        try:
            mod = Module(ast.parse(doctor.read_source(file)), projects[file])
        except (SyntaxError, ValueError, LookupError, RecursionError, MemoryError, OSError):
            continue
        graph = {id(fn) for fn in mod.graph_functions}
        for fn in mod.functions.get("construct", []):
            total += 1
            compiled += id(fn) in graph
    return compiled, total


def source_line(finding) -> str:
    try:
        if finding.get("cell"):  # the notebook's code as the doctor read it, and its (cell, line) map
            with open(finding["path"], encoding="utf-8") as fh:
                text, where, _ = doctor.notebook_source(fh.read())
            return text.splitlines()[where.index((finding["cell"], finding["line"]))].strip()
        return doctor.read_source(finding["path"]).splitlines()[finding["line"] - 1].strip()
    except (OSError, SyntaxError, ValueError, LookupError, IndexError, KeyError):
        return ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("projects", nargs="+", help="folders, a row each (a repository; its projects are found inside as the doctor finds them)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure and finding here")
    args = parser.parse_args(argv)
    rows, every = [], []
    for folder in args.projects:
        stats = {}
        findings = doctor.analyze_paths([folder], stats)
        files = doctor.python_files([folder])
        compiled, total = reach(files, doctor.project_facts(files, doctor.read_source))
        rows.append({"project": os.path.basename(os.path.normpath(folder)), "files": stats["files"],
                     "not_checked": sum(f["rule"] == "MS000" for f in findings), "seconds": stats["seconds"],
                     "slowest": stats["slowest"], "construct_compiled": compiled, "construct_total": total,
                     "rules": dict(collections.Counter(f["rule"] for f in findings))})
        every += [dict(f, source=source_line(f)) for f in findings]
    width = max(len(r["project"]) for r in rows)
    print(f"{'project':<{width}}  files  MS000  seconds  slowest s  construct compiled/all  findings")
    for r in rows:
        rules = ", ".join(f"{k} {v}" for k, v in sorted(r["rules"].items()) if k != "MS000") or "-"
        print(f"{r['project']:<{width}}  {r['files']:>5}  {r['not_checked']:>5}  {r['seconds']:>7.1f}  "
              f"{r['slowest'][0]:>9.2f}  {r['construct_compiled']:>9}/{r['construct_total']:<13}  {rules}")
    totals = collections.Counter()
    for r in rows:
        totals.update(r["rules"])
    print(f"total: {sum(r['files'] for r in rows)} files, {sum(r['seconds'] for r in rows):.1f} s, slowest file "
          f"{max(r['slowest'][0] for r in rows):.2f} s, construct {sum(r['construct_compiled'] for r in rows)}/"
          f"{sum(r['construct_total'] for r in rows)} compiled; "
          + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
    print()
    for f in every:
        if f["rule"] != "MS000":
            print(f"{f['rule']} {f['severity']:<7} {doctor.location(f).rsplit(':', 1)[0]}  | {f['source'][:110]}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"projects": rows, "findings": every}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
