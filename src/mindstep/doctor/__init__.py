"""`mindstep doctor`: static checks for graph-mode pitfalls, and `--explain` for MindSpore errors."""
from .analysis import Finding, analyze_source
from .explain import explain
from .rules import RULES


def read_source(file: str) -> str:
    """A file's text as Python reads it: a UTF-8 BOM, a PEP 263 coding line, else UTF-8."""
    import tokenize

    with tokenize.open(file) as fh:
        return fh.read()


def analyze_file(file: str) -> list[dict]:
    """Findings for one file; a file that cannot be read or parsed is one `MS000` finding with the
    reason, never an exception, so one odd file does not hide the findings of the others."""
    try:
        return analyze_source(read_source(file), file)
    except SyntaxError as err:  # Python 2 code, a template, a broken file (IndentationError too)
        line, col, reason = err.lineno or 1, max((err.offset or 1) - 1, 0), f"SyntaxError: {err.msg}"
    except (UnicodeDecodeError, LookupError) as err:  # bytes its encoding cannot decode, an unknown codec
        line, col, reason = 1, 0, f"{type(err).__name__}: {err}"
    except (ValueError, RecursionError, MemoryError) as err:  # null bytes; nesting too deep for ast
        line, col, reason = 1, 0, f"{type(err).__name__}: {err}"
    except OSError as err:
        line, col, reason = 1, 0, f"{type(err).__name__}: {err.strerror or err}"
    finding = Finding(file, line, col, "MS000").as_dict()
    finding["message"] = f"{finding['message']}: {reason}"
    return [finding]


def analyze_paths(paths) -> list[dict]:
    """Findings for every .py file under the given files/directories (an unreadable file is one
    `MS000` finding and the run goes on)."""
    import os

    findings = []
    for path in paths:
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(root, f) for root, _, names in os.walk(path) for f in names if f.endswith(".py"))
        for file in files:
            findings.extend(analyze_file(file))
    return findings


__all__ = ["RULES", "analyze_file", "analyze_paths", "analyze_source", "explain", "read_source"]
