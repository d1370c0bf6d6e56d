"""What one file cannot say about itself: facts from the other files of its project.

Which code MindSpore compiles is a project-wide question: projects set GRAPH_MODE in `train.py`
(often from a config value) and define their Cells elsewhere. A file's project is the nearest
folder above it with a README, pyproject.toml, setup.py, setup.cfg, requirements.txt or .git (a
model zoo's every model folder has its own README and train.py: one PyNative model does not
become graph code because its neighbour sets GRAPH_MODE). `project_facts(files)` reads the files
once, cheaply (only those whose text can hold the fact are parsed), before the rules run.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass

from ._syntax import kw, last

# MindSpore's optimizer classes (and mindcv's AdamW, Lion, NAdam): building one is the precondition
# of a state-name clash, and Parameters created in a subclass of one are its own state, not a clash.
OPTIMIZER_BASES = {"Optimizer", "Adam", "AdamWeightDecay", "AdamOffload", "AdamW", "LazyAdam", "Momentum", "SGD",
                   "RMSProp", "Lamb", "LARS", "Adagrad", "Adadelta", "Adamax", "FTRL", "ProximalAdagrad", "Rprop",
                   "ASGD", "Lion", "NAdam"}


def sets_graph_mode(nodes) -> bool:
    """A `set_context(mode=...)` that is GRAPH_MODE, 0, or a value read from a config or argument
    (MindSpore's model zoos default it to 0); PYNATIVE_MODE and 1 are not."""
    for node in nodes:
        if isinstance(node, ast.Call) and last(node.func) == "set_context":
            mode = kw(node, "mode")
            if mode is None or (isinstance(mode, ast.Constant) and mode.value != 0):
                continue
            if not last(mode).startswith("PYNATIVE"):
                return True
    return False


def builds_optimizer(nodes) -> bool:
    """The code builds, calls or defines a MindSpore optimizer (`nn.Adam(...)`, `create_optimizer(...)`,
    `self.optimizer(grads)`, `class Lion(nn.Optimizer)`)."""
    for node in nodes:
        if isinstance(node, ast.Call):
            name = last(node.func.func if isinstance(node.func, ast.Call) else node.func)
            if name in OPTIMIZER_BASES or name.lower().endswith("optimizer"):
                return True
        elif isinstance(node, ast.ClassDef) and any(last(b) in OPTIMIZER_BASES for b in node.bases):
            return True
    return False


@dataclass(frozen=True)
class Project:
    """What one file cannot say about itself, from the other files of its project."""
    graph_mode: bool = False  # some file calls set_context(mode=GRAPH_MODE, 0, or a config value)


MARKERS = ("README.md", "README.rst", "README.txt", "README", "pyproject.toml", "setup.py", "setup.cfg",
           "requirements.txt", ".git")


def project_root(file: str, cache: dict) -> str:
    """The nearest folder at or above `file`'s with a project marker; the file's own folder if none."""
    start = here = os.path.dirname(os.path.abspath(file))
    seen = []
    while here not in cache:
        seen.append(here)
        if any(os.path.exists(os.path.join(here, m)) for m in MARKERS):
            cache[here] = here
            break
        parent = os.path.dirname(here)
        if parent == here:
            cache[here] = start
            break
        here = parent
    for folder in seen:
        cache[folder] = cache[here]
    return cache[start]


def _graph_mode(file, read) -> bool:
    try:
        text = read(file)
    except (OSError, SyntaxError, ValueError, LookupError):  # a bad coding line is a SyntaxError
        return False
    if "set_context" not in text:
        return False
    try:
        return sets_graph_mode(ast.walk(ast.parse(text)))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False  # reported by the per-file pass


def project_facts(files, read) -> dict:
    """file -> the `Project` facts of its project (its root's files among `files`); `read(file)`
    gives a file's text (a file that cannot be read or parsed adds nothing: the per-file pass
    reports it)."""
    cache, roots = {}, {}
    for file in files:
        roots.setdefault(project_root(file, cache), []).append(file)
    facts = {}
    for members in roots.values():
        project = Project(graph_mode=any(_graph_mode(f, read) for f in members))
        facts.update((f, project) for f in members)
    return facts
