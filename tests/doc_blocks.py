"""Run the Python blocks of Markdown pages as their readers would: each page's blocks in order, as
one script in a fresh namespace, all pages in one fresh interpreter.

    python tests/doc_blocks.py OUT_DIR PAGE.md [PAGE.md ...]

A block whose first line is a comment starting `# needs:` (a device, a cluster) is shown, not run:
the reader sees the marker and its reason. Each page's script is written to OUT_DIR (MindSpore
compiles only functions whose source it can read) and runs with OUT_DIR/<page> as its working
directory. Prints `=== PAGE` before each page and `=== ok` after; a failing page stops the run with
its traceback.
"""
from __future__ import annotations

import os
import re
import runpy
import sys
from pathlib import Path

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
NEEDS = "# needs:"


def blocks(text: str) -> list[str]:
    """Every ```python block of a page, in order."""
    return FENCE.findall(text)


def runnable(text: str) -> list[str]:
    return [b for b in blocks(text) if not b.lstrip().startswith(NEEDS)]


def main(out_dir: str, pages: list[str]) -> int:
    for page in pages:
        code = runnable(Path(page).read_text(encoding="utf-8"))
        if not code:
            continue
        name = re.sub(r"[^A-Za-z0-9]+", "_", page.removesuffix(".md")).strip("_")
        work = Path(out_dir, name)
        work.mkdir(parents=True, exist_ok=True)
        script = work / f"{name}.py"
        script.write_text("\n".join(code), encoding="utf-8")
        print(f"=== {page} ({len(code)} blocks)", flush=True)
        here = os.getcwd()
        os.chdir(work)
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            os.chdir(here)
        print("=== ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
