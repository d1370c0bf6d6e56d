"""What one file cannot say about itself: facts from the other files of its project.

Which code MindSpore compiles is a project-wide question: projects set GRAPH_MODE in `train.py`
(often from a config value) and define their Cells elsewhere. What matters is the mode *of the run
that trains*, so the doctor follows it the way Python does:

1. A file's project is the nearest folder above it with a README (any spelling: `README_CN.md`,
   `readme.md`), pyproject.toml, setup.py, setup.cfg, requirements.txt or .git; a model zoo's every
   model folder is its own project.
2. Entry points are the project's files that set the mode (`set_context(mode=...)`) or configure
   the run without it (`set_context(device_target=...)`: the default mode), and the files that
   train (`Model.train`, a `TrainOneStepCell`, `value_and_grad`, `GradOperation`, `.fit(`) under a
   `__main__` guard without setting it. An entry point's mode is GRAPH when any of its
   `set_context` calls sets GRAPH_MODE, 0, or a value read from a config (model zoos default it to
   0); one that sets no mode itself takes GRAPH from a module it imports directly that sets it
   (mindyolo's `set_default(args)`), else it runs in PyNative, MindSpore 2.x's default.
3. The mode reaches every file an entry point imports, transitively, within the project (`import
   a.b`, `from .x import y`, `from src.model import Net`, packages' `__init__`s). Where entry
   points of both modes reach a file, the nearest (fewest imports away) decides: a model's own
   training script is nearer to its layers than another model's script that imports the whole
   library.
4. A file's `construct`s are graph code when the file itself sets GRAPH_MODE (its own explicit mode
   wins for its own code: a file that sets PYNATIVE_MODE is PyNative), or a file that jits imports
   it directly (its `@jit` method runs the network), else in the mode of the
   nearest training entry point that reaches it; a file no training
   entry point reaches takes the mode of the other entry points that reach it (a model's own
   pipeline script, export, eval), and a file no entry point reaches (loaded by name from a
   registry) the training entry points' mode, or in a project that does not train, GRAPH if any
   entry point sets it.
   An export, evaluation or preprocessing script that sets GRAPH_MODE does not make the model that
   trains in PyNative graph code.

`project_facts(files, read)` reads each file's text once and parses only the files whose text can
set the mode; imports are read with a regular expression, and the import graph is walked once per
entry point (breadth-first, each file once per walk).
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


def modes_set(nodes) -> set:
    """The modes the `set_context(mode=...)` calls among `nodes` set: 'graph' for GRAPH_MODE, 0, or a
    value read from a config or argument (MindSpore's model zoos default it to 0); 'pynative' for
    PYNATIVE_MODE or 1; 'unset' for a set_context that configures the run (device, memory) and
    leaves the mode at its default. A choice between the two on a command-line flag (`GRAPH_MODE if
    args.mode == "graph" else PYNATIVE_MODE`) is decided by the flag's argparse default in the file."""
    nodes = list(nodes)
    found, defaults, choices = set(), None, None
    for node in nodes:
        if isinstance(node, ast.Call) and last(node.func) == "set_context":
            mode = kw(node, "mode")
            if mode is None:
                if node.keywords and all(k.arg is not None for k in node.keywords):
                    found.add("unset")
                continue
            if isinstance(mode, ast.Name):  # mode = PYNATIVE_MODE if args.mode == "py" else GRAPH_MODE
                if choices is None:
                    choices = {t.id: n.value for n in nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.IfExp)
                               for t in n.targets if isinstance(t, ast.Name)}
                mode = choices.get(mode.id, mode)
            if isinstance(mode, ast.IfExp):
                defaults = _argparse_defaults(nodes) if defaults is None else defaults
                taken = _evaluate(mode.test, defaults)
                if taken is not None:
                    mode = mode.body if taken else mode.orelse
            if isinstance(mode, ast.Constant):
                found.add("graph" if mode.value == 0 else "pynative")
            else:
                found.add("pynative" if last(mode).startswith("PYNATIVE") else "graph")
    return found


def _argparse_defaults(nodes) -> dict:
    """`parser.add_argument("--mode", default="PYNATIVE")` -> {"mode": "PYNATIVE"}."""
    out = {}
    for node in nodes:
        if isinstance(node, ast.Call) and last(node.func) == "add_argument" and node.args \
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("--"):
            default = kw(node, "default")
            if isinstance(default, ast.Constant):
                out[node.args[0].value[2:].replace("-", "_")] = default.value
    return out


def _evaluate(test, defaults: dict):
    """The truth of a mode choice's test on the command line's defaults (`args.mode == "py"`,
    `args.mode.upper().startswith("GRAPH")`); None when the test is not of that form."""
    def value(expr):
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            return defaults.get(expr.attr)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in ("upper", "lower"):
            inner = value(expr.func.value)
            return getattr(inner, expr.func.attr)() if isinstance(inner, str) else None
        return None

    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant):
        left = value(test.left)
        if left is not None and isinstance(test.ops[0], (ast.Eq, ast.NotEq)):
            return (left == test.comparators[0].value) == isinstance(test.ops[0], ast.Eq)
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr in ("startswith", "endswith") \
            and test.args and isinstance(test.args[0], ast.Constant):
        subject = value(test.func.value)
        if isinstance(subject, str):
            return getattr(subject, test.func.attr)(test.args[0].value)
    return None


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
    graph_mode: bool = False  # the file's `construct`s compile in the run that trains (see the module doc)
    jits: bool = False  # some file of the project compiles a function with ms.jit / ms_function
    # the inference side of `if self.training:` compiles too: the evaluation scripts that reach the
    # file set GRAPH (None: no evaluation script reaches it, so as graph_mode)
    eval_graph_mode: bool | None = None


MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", "requirements.txt", ".git")
TRAINS = re.compile(r"\.train\(|TrainOneStep|value_and_grad|GradOperation|\.fit\(")
JITS = re.compile(r"@(?:\w+\.)*jit\b|\bjit\(|ms_function")
MAIN = re.compile(r"__name__\s*==\s*['\"]__main__['\"]")
IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]+)|import[ \t]+([^\n#;]+))",
                    re.M)


def _is_marker(name: str) -> bool:
    return name in MARKERS or name.lower().startswith("readme")


def project_root(file: str, cache: dict) -> str:
    """The nearest folder at or above `file`'s with a project marker; the file's own folder if none."""
    start = here = os.path.dirname(os.path.abspath(file))
    seen = []
    while here not in cache:
        seen.append(here)
        try:
            names = os.listdir(here)
        except OSError:
            names = []
        if any(_is_marker(n) for n in names):
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


@dataclass
class _File:
    modes: set  # the modes its own set_context calls set ('graph', 'pynative'); 'unset' kept apart
    configures: bool  # it calls set_context for the run (device, memory) without a mode
    trains: bool
    entry: bool
    jits: bool
    imports: list  # (level, dotted module, imported names)


def _imports(text: str) -> list:
    out = []
    for match in IMPORT.finditer(text):
        module, names, plain = match.groups()
        if plain is not None:
            out += [(0, part.split(" as ")[0].strip(), ()) for part in plain.split(",") if part.strip()]
        else:
            level = len(module) - len(module.lstrip("."))
            names = [n.split(" as ")[0].strip() for n in names.strip("()").replace("\\", " ").split(",")]
            out.append((level, module[level:], tuple(n for n in names if n.isidentifier())))
    return out


def _read(file, read) -> _File:
    try:
        text = read(file)
    except (OSError, SyntaxError, ValueError, LookupError):  # a bad coding line is a SyntaxError
        return _File(set(), False, False, False, False, [])
    modes = set()
    if "set_context" in text:
        try:
            modes = modes_set(ast.walk(ast.parse(text)))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass  # reported by the per-file pass
    configures = "unset" in modes
    modes.discard("unset")
    trains = bool(TRAINS.search(text))
    entry = bool(modes) or configures or (trains and bool(MAIN.search(text)))
    return _File(modes, configures, trains, entry, bool(JITS.search(text)), _imports(text))


def _resolve(file: str, root: str, imp, known: set) -> list:
    """The project's files an import statement loads, as (file, followed): the module and, for
    `from pkg import name`, the submodule `pkg/name.py` when there is one (followed: what they
    import runs in the same mode), and the packages above the module (not followed: a library's
    top `__init__` that imports every model it has does not make each model part of this run)."""
    level, module, names = imp
    here = os.path.dirname(file)
    if level:
        bases = [here]
        for _ in range(level - 1):
            bases = [os.path.dirname(bases[0])]
    else:  # the script's folder and the folders above it, up to the project root (sys.path as run)
        bases, folder = [], here
        while True:
            bases.append(folder)
            if folder == root or len(folder) <= len(root):
                break
            folder = os.path.dirname(folder)
    parts = module.split(".") if module else []
    found = []
    for base in bases:
        path = base
        hit = False
        for i, part in enumerate(parts):
            path = os.path.join(path, part)
            for candidate in (path + ".py", os.path.join(path, "__init__.py")):
                if candidate in known:
                    found.append((candidate, i == len(parts) - 1))
                    hit = True
        if parts and not hit:
            continue
        for name in names:
            for candidate in (os.path.join(path, name + ".py"), os.path.join(path, name, "__init__.py")):
                if candidate in known:
                    found.append((candidate, True))
        if found:
            break
    return found


def _distances(start, edges) -> dict:
    """file -> how many imports away from `start` it is; `edges[f]` holds (file, followed) pairs. Level
    by level: a file is expanded from the first level where a followed edge reaches it, whatever the
    order the edges are listed in (a file first seen through a parent package's `__init__`, which is
    not followed, is still expanded when a followed import reaches it at the same level)."""
    dist, expanded, frontier, level = {start: 0}, {start}, [start], 0
    while frontier:
        nxt = []
        for f in frontier:
            for g, followed in edges.get(f, ()):
                dist.setdefault(g, level + 1)
                if followed and g not in expanded:
                    expanded.add(g)
                    nxt.append(g)
        frontier, level = nxt, level + 1
    return dist


def _nearest_modes(starts, graph: set, edges) -> dict:
    """file -> is the nearest of `starts` that imports it (fewest imports away) a GRAPH one (any
    GRAPH one among the nearest). The nearest decides: a model's own training script is nearer to
    its layers than another model's script that imports the whole library."""
    best = {}
    for start in starts:
        for f, d in _distances(start, edges).items():
            if f not in best or d < best[f][0]:
                best[f] = (d, start in graph)
            elif d == best[f][0] and start in graph:
                best[f] = (d, True)
    return {f: g for f, (_, g) in best.items()}


def _project_modes(root: str, members: list, read) -> dict:
    info = {f: _read(f, read) for f in members}
    absolute = {f: os.path.abspath(f) for f in members}
    known, back = set(absolute.values()), {a: f for f, a in absolute.items()}
    edges = {}
    for f, facts in info.items():
        if facts.imports:
            edges[f] = {(back[t], followed) for imp in facts.imports
                        for t, followed in _resolve(absolute[f], root, imp, known)}
    entries = [f for f, facts in info.items() if facts.entry]
    training = [f for f in entries if info[f].trains]
    # an entry point that sets no mode itself runs in the mode a helper it imports sets
    # (`set_default(args)` in utils.py calling set_context(mode=args.ms_mode)), else in PyNative;
    # only its own imports count (a package __init__ that imports every model of a library reaches
    # other models' scripts)
    graph = {f for f in entries if "graph" in info[f].modes or (not info[f].modes and any(
        "graph" in info[g].modes for g, _ in edges.get(f, ())))}
    by_training = _nearest_modes(training, graph, edges)
    by_other = _nearest_modes([f for f in entries if f not in training], graph, edges)
    jits = any(facts.jits for facts in info.values())
    # a module that jits (a `@jit def _jit_forward(self, data): return self.network(data)`) compiles
    # the Cells of the modules it imports itself, whatever the mode
    under_jit = {g for f, facts in info.items() if facts.jits for g, followed in edges.get(f, ()) if followed}
    out = {}
    for f, facts in info.items():
        if facts.modes:
            compiled = "graph" in facts.modes
        elif f in under_jit:
            compiled = True
        elif f in by_training:
            compiled = by_training[f]
        elif f in by_other:
            compiled = by_other[f]
        elif training:
            compiled = any(t in graph for t in training)
        else:
            compiled = bool(graph)
        evaluated = ("graph" in facts.modes) if facts.modes else by_other.get(f)
        out[f] = Project(graph_mode=compiled, jits=jits, eval_graph_mode=evaluated)
    return out


def project_facts(files, read) -> dict:
    """file -> the `Project` facts of that file in its project (its root's files among `files`);
    `read(file)` gives a file's text (a file that cannot be read or parsed adds nothing: the
    per-file pass reports it)."""
    cache, roots = {}, {}
    for file in files:
        roots.setdefault(project_root(file, cache), []).append(file)
    facts = {}
    for root, members in roots.items():
        facts.update(_project_modes(root, members, read))
    return facts
