"""`mindstep doctor`: static checks for graph-mode pitfalls, and `--explain` for MindSpore errors."""
from .analysis import Finding, analyze_source
from .explain import explain
from .notebook import notebook_source
from .project import Project, project_facts
from .rules import RULES


def read_source(file: str) -> str:
    """A file's text as Python reads it: a UTF-8 BOM, a PEP 263 coding line, else UTF-8; for a
    notebook, its code cells (see `mindstep.doctor.notebook`)."""
    import tokenize

    if file.endswith(".ipynb"):
        with open(file, encoding="utf-8") as fh:
            return notebook_source(fh.read())[0]
    with tokenize.open(file) as fh:
        return fh.read()


def analyze_file(file: str, project: Project | None = None) -> list[dict]:
    """Findings for one file (`project`: facts from the files checked with it); a file that cannot
    be read or parsed is one `MS000` finding with the reason, never an exception, so one odd file
    does not hide the findings of the others. A notebook's findings carry `cell` (its number in
    the notebook, from 1) and `line` within that cell."""
    try:
        if file.endswith(".ipynb"):
            return _analyze_notebook(file, project)
        return analyze_source(read_source(file), file, project)
    except SyntaxError as err:  # Python 2 code, a template, a broken file (IndentationError too)
        line, col, reason = err.lineno or 1, max((err.offset or 1) - 1, 0), f"SyntaxError: {err.msg}"
    # undecodable bytes (UnicodeDecodeError is a ValueError), an unknown codec, null bytes, nesting too deep
    except (ValueError, LookupError, RecursionError, MemoryError) as err:
        line, col, reason = 1, 0, f"{type(err).__name__}: {err}"
    except OSError as err:
        line, col, reason = 1, 0, f"{type(err).__name__}: {err.strerror or err}"
    finding = Finding(file, line, col, "MS000").as_dict()
    finding["message"] = f"{finding['message']}: {reason}"
    return [finding]


def _analyze_notebook(file: str, project) -> list[dict]:
    with open(file, encoding="utf-8") as fh:
        text, where, broken = notebook_source(fh.read())
    findings = analyze_source(text, file, project)
    for f in findings:
        f["cell"], f["line"] = where[f["line"] - 1] if f["line"] <= len(where) else (None, f["line"])
    for cell, line, reason in broken:
        finding = Finding(file, line, 0, "MS000").as_dict()
        finding.update(cell=cell, message=f"{finding['message']}: cell {cell}: {reason}")
        findings.append(finding)
    return sorted(findings, key=lambda f: (f.get("cell") or 0, f["line"], f["col"], f["rule"]))


def location(finding: dict) -> str:
    """`path:line:col`, or `path:cell:line:col` for a notebook's finding."""
    cell = f"{finding['cell']}:" if finding.get("cell") is not None else ""
    return f"{finding['path']}:{cell}{finding['line']}:{finding['col'] + 1}"


def rule_codes(text: str, flag: str) -> list[str]:
    """`--select`/`--ignore` values as ruff and flake8 take them: comma-separated codes or code
    prefixes (`MS01` is MS010-MS016). An unknown one is an error naming the valid codes."""
    codes = [c.strip().upper() for c in text.split(",") if c.strip()]
    if not codes:
        raise ValueError(f"{flag} needs rule codes, e.g. {flag} MS001,MS004; got {text!r}")
    unknown = [c for c in codes if not any(r.startswith(c) for r in RULES)]
    if unknown:
        raise ValueError(f"{flag}: no rule has the code or prefix {', '.join(unknown)}; valid codes: "
                         f"{', '.join(sorted(RULES))} (or a prefix of them, e.g. MS01)")
    return codes


def select_rules(findings: list[dict], select=None, ignore=None) -> list[dict]:
    """Keep findings whose rule matches a `select` prefix (all when None) and no `ignore` prefix."""
    def matches(rule, prefixes):
        return any(rule.startswith(p) for p in prefixes)

    return [f for f in findings if (select is None or matches(f["rule"], select))
            and not (ignore and matches(f["rule"], ignore))]


CONFIG_KEYS = ("select", "ignore")


def find_config(start: str):
    """The nearest `pyproject.toml` at or above `start` (a file or folder), as ruff looks for it."""
    import os

    here = os.path.abspath(start if os.path.isdir(start) else os.path.dirname(os.path.abspath(start)))
    while True:
        candidate = os.path.join(here, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def load_config(path: str) -> dict:
    """`[tool.mindstep.doctor]` of a pyproject.toml: `select` and `ignore`, lists of rule codes or
    prefixes. Anything else there is an error naming the valid keys."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib

    with open(path, "rb") as fh:
        try:
            section = tomllib.load(fh).get("tool", {}).get("mindstep", {}).get("doctor", {})
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path} is not valid TOML ({err}); fix it or run the doctor from another folder") from None
    unknown = sorted(set(section) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"{path}: [tool.mindstep.doctor] has unknown key(s) {', '.join(unknown)}; valid keys: "
                         f"{', '.join(CONFIG_KEYS)}")
    out = {}
    for key in CONFIG_KEYS:
        if key in section:
            value = section[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{path}: [tool.mindstep.doctor] {key} must be a list of rule codes, e.g. "
                                 f'{key} = ["MS013"]; got {value!r}')
            out[key] = rule_codes(",".join(value), f"[tool.mindstep.doctor] {key}") if value else []
    return out


def python_files(paths) -> list[str]:
    """The given files, and every .py and .ipynb file under the given folders (not inside
    `.ipynb_checkpoints`, Jupyter's autosave copies), in a stable order."""
    import os

    files = []
    for path in paths:
        files += [path] if os.path.isfile(path) else sorted(
            os.path.join(root, f) for root, _, names in os.walk(path) if ".ipynb_checkpoints" not in root.split(os.sep)
            for f in names if f.endswith((".py", ".ipynb")))
    return files


def analyze_paths(paths, stats: dict | None = None) -> list[dict]:
    """Findings for every .py file under the given files/directories, each with the facts of its
    project (a GRAPH_MODE set in one file makes its project's `construct`s graph code; see
    `mindstep.doctor.project`); an
    unreadable file is one `MS000` finding and the run goes on. A `stats` dict is filled with
    `files`, `seconds` and `slowest` ([seconds, file] of the slowest file)."""
    import time

    start = time.perf_counter()
    files = python_files(paths)
    projects = project_facts(files, read_source)
    findings, slowest = [], [0.0, None]
    for file in files:
        t0 = time.perf_counter()
        findings.extend(analyze_file(file, projects[file]))
        slowest = max(slowest, [time.perf_counter() - t0, file], key=lambda s: s[0])
    if stats is not None:
        stats.update(files=len(files), seconds=time.perf_counter() - start, slowest=slowest)
    return findings


__all__ = ["RULES", "Project", "analyze_file", "analyze_paths", "analyze_source", "explain", "find_config",
           "load_config", "location", "notebook_source", "project_facts", "python_files", "read_source", "rule_codes", "select_rules"]
