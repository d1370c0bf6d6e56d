"""Compare the doctor's findings on the corpus with the judged list (tests/doctor_corpus/judged.csv)
and print the precision table: per rule, findings, true, false, and any finding no one has judged.

    python tools/doctor_corpus.py --json after.json CORPUS/*     # run the doctor over the corpus
    python tools/doctor_judge.py after.json                        # the table for that run
    python tools/doctor_judge.py --column found_before             # the table the list records

A finding is matched to the list by repository folder (`owner__name`, as tools/doctor_corpus.py's
rows are named), file, line (`cell:line` in a notebook) and rule. Judge each unjudged finding by
reading the code (and, where the rule's claim is in doubt, a short MindSpore script: see
tools/doctor_evidence.py), add it to judged.csv with an excerpt under tests/doctor_corpus/excerpts,
and run again.
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import sys
from pathlib import Path

JUDGED = Path(__file__).resolve().parents[1] / "tests" / "doctor_corpus" / "judged.csv"


def _key(finding: dict, corpus_marker: str = "__") -> tuple | None:
    parts = Path(finding["path"]).parts
    repo_at = next((i for i, p in enumerate(parts) if corpus_marker in p), None)
    if repo_at is None:
        return None
    line = f"{finding['cell']}:{finding['line']}" if finding.get("cell") else str(finding["line"])
    return parts[repo_at].replace("__", "/"), "/".join(parts[repo_at + 1:]), line, finding["rule"]


def table(rows: list[dict], severity: str = "severity") -> str:
    """Per rule: findings, true, false; then per severity (`severity_before`: as the rules stood then)."""
    by_rule = collections.defaultdict(lambda: [0, 0, "", ""])
    for r in rows:
        entry = by_rule[r["rule"]]
        entry[0 if r["verdict"] == "true" else 1] += 1
        entry[2] = r[severity]
    lines = ["| rule | severity | findings | true | false |", "|---|---|---|---|---|"]
    totals = collections.Counter()
    for rule in sorted(by_rule):
        true, false, severity, _ = by_rule[rule]
        lines.append(f"| {rule} | {severity} | {true + false} | {true} | {false} |")
        totals[severity, "true"] += true
        totals[severity, "false"] += false
    for severity in ("error", "warning"):
        t, f = totals[severity, "true"], totals[severity, "false"]
        share = f"{100 * t / (t + f):.0f} % true" if t + f else "none"
        lines.append(f"| all {severity}s | | {t + f} | {t} | {f} ({share}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("findings", nargs="*", help="--json files of tools/doctor_corpus.py")
    parser.add_argument("--column", choices=("found_before", "found_after"),
                        help="print the table of the findings the judged list records for that run instead")
    parser.add_argument("--set", choices=("development", "held-out"),
                        help="only the repositories of that set (held-out: judged after the rules were settled)")
    args = parser.parse_args(argv)
    with open(JUDGED, newline="", encoding="utf-8") as fh:
        judged = [r for r in csv.DictReader(fh) if args.set is None or r["set"] == args.set]
    if args.column:
        print(table([r for r in judged if r[args.column] == "yes"],
                    "severity_before" if args.column == "found_before" else "severity"))
        return 0
    if not args.findings:
        parser.error("give a findings file, or --column")
    findings = []
    for path in args.findings:
        with open(path, encoding="utf-8") as fh:
            findings += [f for f in json.load(fh)["findings"] if f["rule"] != "MS000"]
    index = collections.defaultdict(list)
    for r in judged:
        index[r["repo"], r["file"], r["line"], r["rule"]].append(r)
    used, matched, unjudged = collections.Counter(), [], []
    for f in findings:
        key = _key(f)
        candidates = index.get(key, [])
        if used[key] < len(candidates):
            matched.append(candidates[used[key]])
            used[key] += 1
        else:
            unjudged.append(f)
    print(table(matched))
    for f in unjudged:
        print(f"UNJUDGED {f['rule']} {f['path']}:{f.get('cell') or ''}{':' if f.get('cell') else ''}{f['line']}")
    return 1 if unjudged else 0


if __name__ == "__main__":
    sys.exit(main())
