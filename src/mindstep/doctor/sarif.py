"""The doctor's findings as SARIF 2.1.0, the format code-scanning services read (GitHub's
`upload-sarif`, GitLab, Azure DevOps): one run, every rule described once, one result per finding.

Paths inside the base folder (the working directory by default) are written relative to it under
`%SRCROOT%`, as code-scanning expects; other paths become absolute `file://` URIs.
"""
from __future__ import annotations

import os
import pathlib
from urllib.parse import quote

from .rules import RULES

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def _rule(rule) -> dict:
    return {"id": rule.id, "name": rule.name,
            "shortDescription": {"text": rule.name.replace("-", " ")},
            "fullDescription": {"text": rule.message},
            "help": {"text": f"fix: {rule.fix}"},
            "defaultConfiguration": {"level": LEVELS[rule.severity]}}


def _location(path: str, base: str) -> dict:
    full = os.path.abspath(path)
    rel = os.path.relpath(full, base)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return {"uri": pathlib.Path(full).as_uri()}
    return {"uri": quote(pathlib.PurePath(rel).as_posix()), "uriBaseId": "%SRCROOT%"}


def to_sarif(findings: list[dict], version: str, base: str | None = None) -> dict:
    """A SARIF 2.1.0 log of `findings` (as `analyze_paths` returns them); `version` is the tool's."""
    base = os.path.abspath(base or os.getcwd())
    index = {rule_id: i for i, rule_id in enumerate(sorted(RULES))}
    results = [{
        "ruleId": f["rule"], "ruleIndex": index[f["rule"]], "level": LEVELS[f["severity"]],
        "message": {"text": (f"cell {f['cell']}, line {f['line']}: " if f.get("cell") else "")
                    + f"{f['message']}. Fix: {f['fix']}"},
        "locations": [{"physicalLocation": {
            "artifactLocation": _location(f["path"], base),
            "region": {"startLine": f["line"], "startColumn": f["col"] + 1}}}],
        **({"properties": {"cell": f["cell"]}} if f.get("cell") else {}),
    } for f in findings]
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [{
        "tool": {"driver": {"name": "mindstep doctor", "version": version, "semanticVersion": version,
                            "rules": [_rule(RULES[rule_id]) for rule_id in sorted(RULES)]}},
        "originalUriBaseIds": {"%SRCROOT%": {"uri": pathlib.Path(base).as_uri() + "/"}},
        "columnKind": "unicodeCodePoints",
        "results": results}]}
