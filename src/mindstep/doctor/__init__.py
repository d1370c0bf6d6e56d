"""`mindstep doctor`: static checks for graph-mode pitfalls, and `--explain` for MindSpore errors."""
from .analysis import analyze_source
from .explain import explain
from .rules import RULES


def analyze_paths(paths) -> list[dict]:
    """Findings for every .py file under the given files/directories."""
    import os

    findings = []
    for path in paths:
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(root, f) for root, _, names in os.walk(path) for f in names if f.endswith(".py"))
        for file in files:
            with open(file, encoding="utf-8") as fh:
                findings.extend(analyze_source(fh.read(), file))
    return findings


__all__ = ["RULES", "analyze_paths", "analyze_source", "explain"]
