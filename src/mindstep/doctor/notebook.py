"""Jupyter notebooks: their code cells as one Python text the rules read, and the way back from a
line of that text to `cell:line`.

IPython syntax is not Python: line magics (`%matplotlib inline`), shell lines (`!pip install`,
`files = !ls`), help (`obj?`) and cell magics other than the timing ones (`%%bash`, `%%writefile`)
are blanked, keeping every line in place. A cell that is still not Python (Python 2, a broken
cell) is blanked too and reported as one `MS000` finding naming the cell; the other cells are read.
"""
from __future__ import annotations

import ast
import json
import re

# cell magics whose body is Python that runs (timed or captured)
PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun")
_SHELL_ASSIGN = re.compile(r"^\s*[\w.,\s]+=\s*[!%]")


def _python_lines(lines: list) -> list:
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is not None and lines[first].strip().startswith("%%"):
        if not lines[first].strip().startswith(PYTHON_CELL_MAGICS):
            return [""] * len(lines)
        lines = lines[:first] + [""] + lines[first + 1:]
    out = []
    for ln in lines:
        s = ln.strip()
        if s.startswith(("%", "!", "?")) or s.endswith("?") or _SHELL_ASSIGN.match(ln):
            out.append("")
        else:
            out.append(ln)
    return out


def notebook_source(text: str):
    """(python text, cells, broken): `cells[i]` is (cell number, line in cell) for line i+1 of the
    text; `broken` lists (cell number, reason) for code cells that are not Python."""
    nb = json.loads(text)
    cells = nb.get("cells")
    if cells is None:  # nbformat 3 kept them in worksheets
        cells = [c for ws in nb.get("worksheets", []) for c in ws.get("cells", [])]
    parts, where, broken = [], [], []
    for number, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", cell.get("input", ""))
        source = "".join(source) if isinstance(source, list) else str(source)
        lines = _python_lines(source.split("\n"))
        try:
            ast.parse("\n".join(lines))
        except (SyntaxError, ValueError) as err:
            broken.append((number, getattr(err, "lineno", None) or 1, f"{type(err).__name__}: {getattr(err, 'msg', err)}"))
            lines = [""] * len(lines)
        parts += lines
        where += [(number, i) for i in range(1, len(lines) + 1)]
    return "\n".join(parts) + "\n", where, broken
