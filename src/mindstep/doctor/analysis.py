"""Static analysis of training code (Python `ast`, nothing is executed).

`analyze_source(text, path)` returns findings `{path, line, col, rule, message, fix, severity}`.

Which code counts as *graph code* (compiled by MindSpore, where the pitfalls bite):
functions decorated with `jit` / `ms.jit` / `mindspore.jit` or MindSpore 1.x's `ms_function`,
functions passed to them, functions those call by name (transitively, within the file; this covers
the forward function behind `value_and_grad`), and `construct` methods when the file mentions
`GRAPH_MODE` or any file of the project (every file checked in one run) sets it with
`set_context(mode=...)`: projects set the mode in `train.py`, often from a config value.

The rules need facts about values (is this a Tensor or a Python number, an integer label or a float
target); they take them from the code around the finding (what a name was bound to, what it is
passed to) and stay silent where the code does not say, so that a finding is evidence, not a guess.
"""
from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass

from ._syntax import dotted as _dotted, kw as _kw, last as _last
from .project import OPTIMIZER_BASES, Project, builds_optimizer, modes_set
from .rules import RULES

OPTIMIZER_WORDS = ("opt", "optimizer", "optim")
MUTATORS = {"append", "extend", "insert", "pop", "update", "clear", "setdefault", "add", "remove", "discard",
            "popitem", "sort", "reverse"}
# Names MindSpore's optimizers give their own state: per-parameter prefixes, and whole names.
STATE_PREFIXES = ("accum.", "moment1.", "moment2.", "moments.", "mean_grad.", "mean_square.", "prev.",
                  "lamb_m.", "lamb_v.")
STATE_NAMES = ("global_step", "learning_rate", "beta1_power", "beta2_power")


@dataclass
class Finding:
    path: str
    line: int
    col: int
    rule: str

    def as_dict(self) -> dict:
        rule = RULES[self.rule]
        return {"path": self.path, "line": self.line, "col": self.col, "rule": self.rule,
                "message": rule.message, "fix": rule.fix, "severity": rule.severity}


JIT_NAMES = ("jit", "ms_function")  # ms_function: MindSpore 1.x's name for jit
# decorators whose function MindSpore runs in Python while compiling, on constant inputs: its numpy,
# prints and lists are host code, not graph code
HOST_AT_COMPILE = ("constexpr", "primexpr", "_primexpr")


def _is_jit(mod, node) -> bool:
    """A reference to MindSpore's jit: `jit`/`ms_function` unless imported from another library
    (numba's `jit`), or `<a MindSpore module>.jit` (`ms.jit`, `mindspore.jit`, `api.ms_function`)."""
    target = node.func if isinstance(node, ast.Call) else node
    name = _dotted(target)
    if name in JIT_NAMES:
        return name not in mod.foreign_names
    head, _, last = name.rpartition(".")
    return last in JIT_NAMES and head.split(".")[0] in mod.ms_modules


class Module:
    """Indexes one file: its functions, module-level names, and which functions are graph code."""

    def __init__(self, tree: ast.Module, project: Project | None = None):
        given, project = project, project or Project()
        self.tree = tree
        # child -> parent, built once: every "what encloses this node" question is a walk up, not a
        # walk of the whole tree per node (which made one file with 300 lambdas take 37 s)
        self.nodes = list(ast.walk(tree))  # walked once; the checks below iterate this list
        self.parents = {child: node for node in self.nodes for child in ast.iter_child_nodes(node)}
        self._imports()
        self.functions: dict[str, list] = {}
        for node in self.nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)
        self.module_assign_counts: dict[str, int] = {}
        self.module_assign_lines: dict[str, list] = {}  # name -> the lines of its module-level assignments
        for node in tree.body:
            for target in _assign_targets(node):
                self.module_assign_counts[target] = self.module_assign_counts.get(target, 0) + 1
                self.module_assign_lines.setdefault(target, []).append(node.lineno)
        self.global_writes = set()
        for node in self.nodes:
            if isinstance(node, ast.Global) and not self._before_compile(node):
                fn = _enclosing_assigns(self, node)
                self.global_writes |= set(node.names) & fn
        own = modes_set(self.nodes)
        # a file's own explicit mode wins for its own code; judged alone, a file that only mentions
        # GRAPH_MODE (`mode = GRAPH_MODE if ... else ...`) counts as setting it
        self.file_graph_mode = "graph" in own or (not own and given is None and any(
            _dotted(n) in ("ms.GRAPH_MODE", "mindspore.GRAPH_MODE", "context.GRAPH_MODE", "GRAPH_MODE")
            for n in self.nodes if isinstance(n, (ast.Attribute, ast.Name))))
        self.graph_mode = ("graph" in own) if own else (project.graph_mode or self.file_graph_mode)
        self.project_jits = project.jits
        self.eval_graph_mode = self.graph_mode if project.eval_graph_mode is None or own else project.eval_graph_mode
        self.builds_optimizer = builds_optimizer(self.nodes)
        self._class_methods = {}
        self.jit_names = self._jit_names()
        self.jit_wrapped = {n.args[0].id for n in self.nodes if isinstance(n, ast.Call) and _is_jit(self, n)
                            and n.args and isinstance(n.args[0], ast.Name)}
        self.graph_functions = self._graph_functions()
        self.graph_calls = {c.func.id for fn in self.graph_functions for c in ast.walk(fn)
                            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}

    def _before_compile(self, node) -> bool:
        """A `global` statement in an `__init__`, or in a function that only `__init__`s call (by
        name): it runs when the network is built, before anything compiles (mindformers'
        `init_gather_index` under a `gather_index_inited` flag), so the graph reads its last value."""
        fns = [a for a in _ancestors(self, node) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if not fns:
            return False
        outer = fns[-1]
        if outer.name == "__init__":
            return True
        callers = self.calls_by_name.get(outer.name, [])
        return bool(callers) and all(any(isinstance(a, ast.FunctionDef) and a.name == "__init__"
                                         for a in _ancestors(self, c)) for c in callers)

    def assigns_in(self, scope) -> list:
        """The assignments whose scope is `scope` (indexed once)."""
        index = self.__dict__.get("_assigns_index")
        if index is None:
            index = self.__dict__["_assigns_index"] = {}
            for n in self.nodes:
                if isinstance(n, ast.Assign):
                    index.setdefault(id(self.scope_of[n]), []).append(n)
        return index.get(id(scope), [])

    @functools.cached_property
    def calls_by_name(self) -> dict:
        """name -> the calls `name(...)` in the file (one walk, not one per question)."""
        out = {}
        for c in self.nodes:
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name):
                out.setdefault(c.func.id, []).append(c)
        return out

    @functools.cached_property
    def parameter_attrs(self) -> set:
        """`self.<name>` attributes the file binds to a `Parameter(...)`."""
        return {t.attr for n in self.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                and _last(n.value.func) == "Parameter"
                for t in n.targets if isinstance(t, ast.Attribute) and _dotted(t.value) == "self"}

    @functools.cached_property
    def class_constructs(self) -> dict:
        """class name -> the `construct` defs of the classes of that name in this file."""
        constructs = {}
        for node in self.nodes:
            if isinstance(node, ast.ClassDef):
                defs = [m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "construct"]
                if defs:
                    constructs.setdefault(node.name, []).extend(defs)
        return constructs

    @functools.cached_property
    def cell_attrs(self) -> dict:
        """`self.<attr> = SomeCell(...)` -> {attr: the `construct` defs of SomeCell}, for classes of this file."""
        constructs = self.class_constructs
        out = {}
        for n in self.nodes:
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _last(n.value.func) in constructs:
                for t in n.targets:
                    if isinstance(t, ast.Attribute) and _dotted(t.value) == "self":
                        out.setdefault(t.attr, []).extend(constructs[_last(n.value.func)])
        return out

    def _python_value_params(self, found: dict) -> None:
        """A `construct` whose parent Cell passes it Python values (`self.pos_embd(B, H, W)` with
        `B, H, W = x.shape`, mindcv's EdgeNeXt): those parameters are compile-time constants, not
        tensors, at every call site of this file."""
        cells = self.cell_attrs
        if not cells:
            return
        sites = {}
        for fn in self.graph_functions:
            tensors = None
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                        and _dotted(call.func.value) == "self" and call.func.attr in cells:
                    tensors = _tensor_names(fn, found[id(fn)]) if tensors is None else tensors
                    for callee in cells[call.func.attr]:
                        sites.setdefault(id(callee), []).append((call, tensors))
        for fn in self.graph_functions:
            if id(fn) not in sites or _passes_star(sites[id(fn)]):
                continue
            names = [n for n in _params(fn) if n != "self"]
            constant = set(names)
            for call, tensors in sites[id(fn)]:
                for i, arg in enumerate(call.args):
                    if i < len(names) and _mentions_tensor(arg, tensors):
                        constant.discard(names[i])
                for k in call.keywords:
                    if k.arg in constant and _mentions_tensor(k.value, tensors):
                        constant.discard(k.arg)
            found[id(fn)] -= constant

    @functools.cached_property
    def tensor_params(self) -> dict:
        """id(graph function) -> its parameters that receive tensors. A jitted function's or a
        `construct`'s inputs are tensors; a helper's are only those that graph code passes
        tensors to (`_init_state(shape, dtype)` takes a shape, and its numpy is a constant)."""
        roots = {id(fn) for fn in self.graph_functions if fn.name == "construct" or fn.name in self.jit_names
                 or fn.name in self.jit_wrapped or any(_is_jit(self, d) for d in fn.decorator_list)}
        found = {id(fn): (set(_params(fn)) - {"self", "cls"}) if id(fn) in roots else set()
                 for fn in self.graph_functions}
        self._python_value_params(found)
        for _ in range(4):  # a few rounds follow helpers of helpers
            changed = False
            for fn in self.graph_functions:
                tensors = _tensor_names(fn, found[id(fn)])
                for call in ast.walk(fn):
                    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
                        continue
                    for callee in self.functions.get(call.func.id, []):
                        if id(callee) not in found or id(callee) in roots:
                            continue
                        names = _params(callee)
                        passed = {names[i] for i, a in enumerate(call.args) if i < len(names)
                                  and _mentions_tensor(a, tensors)}
                        passed |= {k.arg for k in call.keywords if k.arg in names and _mentions_tensor(k.value, tensors)}
                        if not passed <= found[id(callee)]:
                            found[id(callee)] |= passed
                            changed = True
            if not changed:
                break
        return found

    @functools.cached_property
    def runs_jit(self) -> set:
        """Names of the jitted functions and of this file's functions that call one (transitively)."""
        calls = {id(fn): [c for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)]
                 for defs in self.functions.values() for fn in defs}
        runs = set(self.jit_names)
        for _ in range(len(self.functions) + 1):
            more = {fn.name for defs in self.functions.values() for fn in defs
                    if fn.name not in runs and any(c.func.id in runs for c in calls[id(fn)])}
            if not more:
                break
            runs |= more
        return runs

    @functools.cached_property
    def _module_modes(self) -> list:
        """(line, mode) of the module-level `set_context(mode=...)` statements, in order."""
        out = []
        for st in self.tree.body:
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                modes = modes_set([st.value]) - {"unset"}
                if len(modes) == 1:
                    out.append((st.lineno, modes.pop()))
        return out

    def mode_at(self, line: int):
        """The mode the module's own statements set last before `line` ('graph', 'pynative'), None if
        none did: a notebook that switches to PyNative for one section runs that section eagerly."""
        before = [mode for at, mode in self._module_modes if at < line]
        return before[-1] if before else None

    @functools.cached_property
    def _callers(self) -> dict:
        """function name -> the names of this file's functions that call it by name."""
        out = {}
        for defs in self.functions.values():
            for fn in defs:
                for c in ast.walk(fn):
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Name):
                        out.setdefault(c.func.id, set()).add(fn.name)
                        # grad_fn(x, y) runs the forward that value_and_grad wraps
                        out.setdefault(self.grad_targets.get(c.func.id, c.func.id), set()).add(fn.name)
        return out

    @functools.cached_property
    def _module_calls(self) -> list:
        """(line, names it calls) of each module-level statement that is not a def or class."""
        return [(st.lineno, {c.func.id for c in ast.walk(st) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)})
                for st in self.tree.body if not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]

    @functools.cached_property
    def _wrappers(self) -> dict:
        """name -> the module-level names bound to a call that takes it (`sink = data_sink(step, ...)`)."""
        out = {}
        for st in self.tree.body:
            if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call):
                for a in st.value.args:
                    if isinstance(a, ast.Name):
                        out.setdefault(a.id, set()).update(t.id for t in st.targets if isinstance(t, ast.Name))
        return out

    def lines_calling(self, name: str) -> list:
        """The module-level statements that call `name`, or a function of this file that calls it."""
        cache = self.__dict__.setdefault("_lines_calling_cache", {})
        if name not in cache:
            cache[name] = self._lines_calling(name)
        return cache[name]

    def _lines_calling(self, name: str) -> list:
        names, queue = {name}, [name]
        while queue:
            current = queue.pop()
            # `sink_process = data_sink(train_step, ...)`: calling the wrapper runs the function
            for caller in self._callers.get(current, set()) | self._wrappers.get(current, set()):
                if caller not in names:
                    names.add(caller)
                    queue.append(caller)
        return [line for line, called in self._module_calls if called & names]

    @functools.cached_property
    def first_run_line(self) -> int | None:
        """The line of the first module-level statement that runs compiled code (calls a jitted
        function or a function that calls one); None when no statement is seen to."""
        if not self.jit_names:
            return None
        for statement in self.tree.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in self.runs_jit
                   for c in ast.walk(statement)):
                return statement.lineno
        return None

    @functools.cached_property
    def scope_of(self) -> dict:
        """node -> the scope it runs in: the module, or the innermost function, lambda or class body.
        One pass: `self.nodes` is breadth-first, so a node's parent is placed before the node (except
        the shared `Load`/`Add` singletons, whose scope does not matter)."""
        scope = {self.tree: self.tree}
        for node in self.nodes[1:]:
            parent = self.parents[node]
            scope[node] = parent if isinstance(parent, SCOPES) else scope.get(parent, self.tree)
        return scope

    def _imports(self) -> None:
        """Which names are MindSpore modules, real numpy, or imported from other libraries."""
        self.ms_modules = {"ms", "mindspore"}
        self.numpy_names, self.foreign_names = set(), set()
        self.random_modules, self.random_functions = set(), set()  # Python's random / numpy.random
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if alias.name == "numpy":
                        self.numpy_names.add(bound)
                    elif alias.name in ("random", "numpy.random") and (alias.asname or alias.name == "random"):
                        self.random_modules.add(bound)
                    elif alias.name.split(".")[0] == "mindspore":
                        # `import mindspore.numpy as np` binds np to MindSpore's numpy, not numpy's
                        (self.ms_modules.add(bound), self.numpy_names.discard(bound))
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if node.module in ("random", "numpy.random") and alias.name in RANDOM_FUNCTIONS:
                        self.random_functions.add(bound)
                    elif node.module == "numpy" and alias.name == "random":
                        self.random_modules.add(bound)
                    if node.module.split(".")[0] == "mindspore":
                        self.ms_modules.add(bound)
                        self.numpy_names.discard(bound)
                    else:
                        self.foreign_names.add(bound)

    @functools.cached_property
    def jit_methods(self) -> set:
        """Names of `@jit` methods (defs in a class body)."""
        return {fn.name for defs in self.functions.values() for fn in defs
                if isinstance(self.parents.get(fn), ast.ClassDef) and any(_is_jit(self, d) for d in fn.decorator_list)}

    def _jit_names(self) -> set:
        """Names bound to jitted functions: decorated defs and `x = jit(f)` assignments."""
        names = set()
        for defs in self.functions.values():
            for fn in defs:
                if any(_is_jit(self, d) for d in fn.decorator_list):
                    names.add(fn.name)
        for node in self.nodes:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _is_jit(self, node.value):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        return names

    def _graph_functions(self) -> list:
        roots = []
        for defs in self.functions.values():
            for fn in defs:
                if any(_is_jit(self, d) for d in fn.decorator_list):
                    roots.append(fn)
                elif fn.name == "construct" and self.graph_mode and _may_be_cell(self, fn):
                    roots.append(fn)
        for node in self.nodes:
            if isinstance(node, ast.Call) and _is_jit(self, node) and node.args and isinstance(node.args[0], ast.Name):
                roots.extend(self.functions.get(node.args[0].id, []))
        grad_targets = self.grad_targets
        seen, queue = set(), list(roots)
        while queue:
            fn = queue.pop()
            if id(fn) in seen or any(_last(d) in HOST_AT_COMPILE for d in fn.decorator_list):
                continue
            seen.add(id(fn))
            # the evaluation run, which takes the evaluation side of `if self.training`, is PyNative
            inference = set() if self.eval_graph_mode else _inference_nodes(fn)
            for call in ast.walk(fn):
                if id(call) in inference:
                    continue
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                    name = grad_targets.get(call.func.id, call.func.id)
                    queue.extend(self.functions.get(name, []))
                    # model(x) where model = Seq2Seq(...), a Cell of this file: its construct compiles
                    # with the function (a notebook's @jit step calling the model it built)
                    queue.extend(self.instance_constructs.get(call.func.id, []))
                elif isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                        and isinstance(call.func.value, ast.Name) and call.func.value.id == "self":
                    # self.helper(x) from graph code compiles the helper too (a method of the same
                    # class; a Cell attribute's own construct is a root of its own)
                    queue.extend(self.methods(fn).get(call.func.attr, []))
        return [fn for defs in self.functions.values() for fn in defs if id(fn) in seen]

    @functools.cached_property
    def instance_constructs(self) -> dict:
        """Module-level `name = SomeCell(...)` for classes of this file -> [SomeCell.construct]."""
        constructs = self.class_constructs
        out = {}
        for n in self.tree.body:
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name) \
                    and constructs.get(n.value.func.id):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = constructs[n.value.func.id]
        return out

    def methods(self, fn) -> dict:
        """name -> [def] of the methods of the class `fn` is a method of ({} for a function)."""
        cls = self.parents.get(fn)
        if not isinstance(cls, ast.ClassDef):
            return {}
        return self._class_methods.setdefault(id(cls), {m.name: [m] for m in cls.body
                                                         if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))})

    @functools.cached_property
    def grad_targets(self) -> dict:
        return self._grad_targets()

    @functools.cached_property
    def cross_entropy_names(self) -> set:
        """Names (`loss_fn`, `self.loss`) the file binds to a cross-entropy loss Cell."""
        out = set()
        for n in self.nodes:
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _last(n.value.func).lower() in CROSS_ENTROPY:
                out |= {_dotted(t) for t in n.targets if _dotted(t)}
        return out

    def _grad_targets(self) -> dict:
        """`grad_fn = value_and_grad(forward, ...)` -> {'grad_fn': 'forward'}."""
        out = {}
        for node in self.nodes:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and _last(node.value.func) in ("value_and_grad", "grad") and node.value.args \
                    and isinstance(node.value.args[0], ast.Name):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = node.value.args[0].id
        return out


TRAINING_FLAGS = {"training", "is_training", "return_loss", "is_train", "phase_train", "train_mode"}


def _training_flag(test):
    """True for `if self.training:` (and is_training, return_loss...), False for `if not self.training:`,
    None for any other test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _training_flag(test.operand)
        return None if inner is None else not inner
    if isinstance(test, (ast.Name, ast.Attribute)) and _last(test) in TRAINING_FLAGS:
        return True
    return None


def _returns_when_training(statement) -> bool:
    """`if self.training: ... return loss` with no else: what follows it is the evaluation side."""
    return isinstance(statement, ast.If) and _training_flag(statement.test) is True and not statement.orelse \
        and bool(statement.body) and isinstance(statement.body[-1], ast.Return)


def _passes_star(sites) -> bool:
    """A call site passes *args or **kwargs: which parameter gets what is unknown."""
    return any(isinstance(a, ast.Starred) for call, _ in sites for a in call.args) or \
        any(k.arg is None for call, _ in sites for k in call.keywords)


def _assign_targets(node) -> list:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _ancestors(mod, node):
    """The nodes enclosing `node`, innermost first."""
    node = mod.parents.get(node)
    while node is not None:
        yield node
        node = mod.parents.get(node)


def _enclosing_assigns(mod, global_node) -> set:
    """The names assigned anywhere in the outermost function around `global_node`."""
    fns = [a for a in _ancestors(mod, global_node) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return {t for n in ast.walk(fns[-1]) for t in _assign_targets(n)} if fns else set()


def _local_names(fn) -> set:
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
    if fn.args.vararg:
        names.add(fn.args.vararg.arg)
    if fn.args.kwarg:
        names.add(fn.args.kwarg.arg)
    for node in ast.walk(fn):
        names.update(_assign_targets(node))
        if isinstance(node, (ast.For, ast.comprehension)):
            names.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not fn:
            names.add(node.name)
        if isinstance(node, ast.Assign):
            for t in node.targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
        if isinstance(node, ast.withitem) and node.optional_vars is not None:
            names.update(n.id for n in ast.walk(node.optional_vars) if isinstance(n, ast.Name))
    return names


def analyze_source(text: str, path: str = "<string>", project: Project | None = None) -> list[dict]:
    """All findings in one file's source, sorted by line. `project`: facts from the other files
    checked with it (see `project_facts`); without it the file is judged on its own."""
    tree = ast.parse(text, filename=path)
    mod = Module(tree, project)
    found: list[Finding] = []

    def add(node, rule):
        found.append(Finding(path, node.lineno, node.col_offset, rule))

    for fn in mod.graph_functions:
        _check_graph_function(mod, fn, add)
    _check_module(mod, add)
    unique = {(f.line, f.col, f.rule): f for f in found}
    lines = text.splitlines()
    kept = [f for f in unique.values() if not _suppressed(lines[f.line - 1] if f.line <= len(lines) else "", f.rule)]
    for f in kept:  # ast counts UTF-8 bytes; editors and SARIF count characters
        if f.line <= len(lines):
            f.col = len(lines[f.line - 1].encode("utf-8")[:f.col].decode("utf-8", errors="ignore"))
    return [f.as_dict() for f in sorted(kept, key=lambda f: (f.line, f.col, f.rule))]


# flake8's convention: `# noqa` silences every finding on its line, `# noqa: MS009,MS010` those codes
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,?\s*[A-Z]+[0-9]+)*))?", re.IGNORECASE)


def _suppressed(line: str, rule: str) -> bool:
    for match in _NOQA.finditer(line):
        codes = match.group("codes")
        if codes is None or rule in re.split(r"[\s,]+", codes.upper()):
            return True
    return False


def _check_graph_function(mod: Module, fn, add) -> None:
    local = _local_names(fn)
    params = {a.arg for a in fn.args.args}
    jit_root = fn.name in mod.jit_names or fn.name in mod.jit_wrapped
    opt_call_line = None
    tensors = None  # the function's tensor-valued names, worked out when a numpy call needs them
    inference = set() if mod.eval_graph_mode else _inference_nodes(fn)
    for node in ast.walk(fn):
        if id(node) in inference:
            continue
        if isinstance(node, ast.Call):
            name, last = _dotted(node.func), _last(node.func)
            base = node.func.value if isinstance(node.func, ast.Attribute) else None
            base_name = base.id if isinstance(base, ast.Name) else ""
            if last in MUTATORS and base_name and base_name not in local and base_name in mod.module_assign_counts:
                add(node, "MS001")
            if name == "print" and not (_conditional(mod, node, fn) and _has_message(node)):
                add(node, "MS013")
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("asnumpy", "item", "tolist") \
                    and _reads_a_tensor(mod, fn, node, local, params):
                add(node, "MS010")
            if _random_call(mod, node):
                add(node, "MS018")
            if name.split(".")[0] in mod.numpy_names and "." in name:
                tensors = _tensor_names(fn, mod.tensor_params[id(fn)]) if tensors is None else tensors
                # numpy on shapes and settings (np.sqrt(self.head_dim), np.ones(C)) is a constant
                # folded at compile time; only numpy on a tensor leaves the graph
                if any(_mentions_tensor(a, tensors) for a in node.args + [k.value for k in node.keywords]):
                    add(node, "MS010")
            if last == "step" and any(w in base_name.lower() for w in ("sched", "scheduler", "lr")):
                add(node, "MS011")
            if isinstance(node.func, ast.Name) and node.func.id.lower() in OPTIMIZER_WORDS or \
                    (isinstance(node.func, ast.Attribute) and node.func.attr in OPTIMIZER_WORDS):
                opt_call_line = node.lineno if opt_call_line is None else min(opt_call_line, node.lineno)
        elif isinstance(node, ast.Dict) and any(k is None for k in node.keys):
            add(node, "MS014")  # {"loss": loss, **aux}: the unpacked entries get a tuple key (measured)
        elif isinstance(node, ast.Lambda) and _fails_to_parse(mod, node):
            add(node, "MS004")
        elif isinstance(node, ast.Global):
            add(node, "MS001")
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id not in local \
                        and t.value.id in mod.module_assign_counts:
                    add(node, "MS001")
                if isinstance(t, ast.Name) and t.id in params and _accumulates_into(node.value, t.id):
                    add(node, "MS007")
        elif isinstance(node, ast.If) and jit_root:  # a construct's or helper's arguments are tensors
            for sub in ast.walk(node.test):
                if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mod) and any(
                        isinstance(o, ast.Name) and o.id in params for o in (sub.left, sub.right)):
                    add(node, "MS007")
                    break
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            if node.id in mod.global_writes or _rebound_after_compile(mod, node.id, fn):
                add(node, "MS002")
    _check_allreduce(fn, opt_call_line, add)
    if fn.name in mod.jit_names or fn.name in mod.jit_wrapped or any(_is_jit(mod, d) for d in fn.decorator_list):
        for arg in fn.args.args:
            if arg.arg in ("net", "network", "model", "optimizer", "opt", "loss_fn"):
                add(arg, "MS015")


def _may_be_cell(mod, fn) -> bool:
    """A `construct` of a class with a base class (a Cell, or a class that may derive from one); a
    plain class's `construct` (`class ArgmaxPost:` in a serving script) is ordinary Python."""
    cls = mod.parents.get(fn)
    return not isinstance(cls, ast.ClassDef) or any(_last(b) != "object" for b in cls.bases)


def _inference_nodes(fn) -> set:
    """ids of the nodes on the side of `if self.training:` (or after `if self.training: return`) that
    only evaluation takes: not compiled by the training run when the evaluation run is PyNative."""
    inference = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and _training_flag(node.test) is not None:
            side = node.orelse if _training_flag(node.test) else node.body
            inference |= {id(n) for st in side for n in ast.walk(st)}
        for block in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if isinstance(block, list):
                after = next((i for i, st in enumerate(block) if _returns_when_training(st)), None)
                if after is not None:
                    inference |= {id(n) for st in block[after + 1:] for n in ast.walk(st)}
    return inference


def _reads_a_tensor(mod, fn, call, local, params) -> bool:
    """`x.asnumpy()`/`.item()`/`.tolist()` that reads a tensor's values on the host (node.func.attr,
    not the dotted name: x[0].asnumpy() and x.sum().item() have none). Not one: Parameter.item()
    (compiles, measured, STRICT syntax level too), and a tensor the function builds from constants
    (`x = ms.tensor(np.array([0, 1]))`, `ms.tensor([10]).asnumpy()`: folded at compile time)."""
    subject = call.func.value
    if call.func.attr == "item" and _dotted(subject).startswith("self.") and _dotted(subject)[5:] in mod.parameter_attrs:
        return False
    root = _root_name(subject)
    built = root in mod.ms_modules or root in mod.numpy_names
    if (root is None or root not in local or root in params) and not built:
        return True
    cache = mod.__dict__.setdefault("_tensor_names_cache", {})
    if id(fn) not in cache:
        cache[id(fn)] = _tensor_names(fn, mod.tensor_params[id(fn)])
    tensors = cache[id(fn)]
    return (root in tensors and not built) or (built and _mentions_tensor(subject, tensors))


def _root_name(expr):
    """`x[0].sum()` -> 'x'; None when the expression does not start from a plain name."""
    while isinstance(expr, (ast.Subscript, ast.Attribute, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _conditional(mod, node, fn) -> bool:
    """`node` runs only on some calls: under an if/while/try handler, or after an `if` that returns
    or raises earlier in its block. A print with a message there is an error message in a branch
    decided at compile time (a shape or config check: the dead branch prints nothing, measured) or
    a deliberate log (an overflow message), not one that prints on every call."""
    child = node
    for parent in _ancestors(mod, node):
        if isinstance(parent, (ast.If, ast.IfExp, ast.While, ast.ExceptHandler)) and child is not getattr(parent, "test", None):
            return True
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and child in block:
                for earlier in block[:block.index(child)]:
                    if isinstance(earlier, ast.If) and any(isinstance(n, (ast.Return, ast.Raise)) for n in ast.walk(earlier)):
                        return True
        if parent is fn:
            return False
        child = parent
    return False


def _has_message(call) -> bool:
    """A print with a message (a string or f-string argument): an error message or a log line, not
    a debugging print of bare values (`print(x.shape)`, which under a config flag prints every call)."""
    return any(isinstance(a, ast.JoinedStr) or (isinstance(a, ast.Constant) and isinstance(a.value, str))
               or (isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr == "format")
               for a in call.args)


RANDOM_FUNCTIONS = {"random", "rand", "randn", "randint", "random_sample", "uniform", "normal", "choice", "shuffle",
                    "permutation", "gauss", "sample", "randrange", "standard_normal", "binomial", "beta", "poisson",
                    "triangular", "betavariate", "normalvariate", "getrandbits", "integers", "exponential"}


def _random_call(mod, call) -> bool:
    """`np.random.rand()`, `numpy.random.uniform(...)`, `random.random()` (Python's module): host random
    numbers, which graph compilation draws once and folds into the graph as a constant."""
    parts = _dotted(call.func).split(".")
    if len(parts) == 3 and parts[0] in mod.numpy_names and parts[1] == "random":
        return parts[2] in RANDOM_FUNCTIONS
    if len(parts) == 2 and parts[0] in mod.random_modules:
        return parts[1] in RANDOM_FUNCTIONS
    return len(parts) == 1 and parts[0] in mod.random_functions


def _rebound_after_compile(mod, name: str, fn) -> bool:
    """A module-level name assigned again at a point where `fn` may have been compiled already.
    Where the module's own statements run the compiled code (a script, a notebook's cells), in the
    order they run: the graph is stale when `fn` ran (compiled) after its definition and before the
    new binding, and runs again after it with no new definition in between (a notebook that defines
    its step again in each section compiles it again). Otherwise: after the first module-level
    statement that runs compiled code, or, where none is seen, after `fn`'s definition. A network
    rebound before anything compiled (`model = auto_mixed_precision(model, 'O2')` under `model =
    Network()`) is read at its last value."""
    lines = mod.module_assign_lines.get(name, [])
    if len(lines) < 2:
        return False
    top = _top_statement(mod, fn)
    # the module-level statements that run this function (not any jitted one)
    runs = mod.lines_calling(top.name) if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    if not runs:
        since = mod.first_run_line or top.lineno
        return any(line > since for line in lines[1:])
    # this definition of fn lives until the next `def` of its name
    until = min((n.lineno for n in mod.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == top.name and n.lineno > top.lineno), default=float("inf"))
    return any(top.lineno < line < until and any(top.lineno < r < line for r in runs)
               and any(line < r < until for r in runs) for line in lines[1:])


def _top_statement(mod, node):
    """The module-level statement that holds `node` (a function, or the class around a method)."""
    for parent in _ancestors(mod, node):
        if mod.parents.get(parent) is mod.tree:
            return parent
    return node


def _accumulates_into(value, name: str) -> bool:
    """`acc = [a + g for a, g in zip(acc, grads)]`: a list rebuilt by adding to its own items (a
    cast of every input, `inputs = [x.astype(f) for x in inputs]`, accumulates nothing)."""
    if not isinstance(value, ast.ListComp):
        return False
    reads_itself = any(isinstance(n, ast.Name) and n.id == name for g in value.generators for n in ast.walk(g.iter))
    return reads_itself and isinstance(value.elt, ast.BinOp) and isinstance(value.elt.op, ast.Add)


# attributes that are Python values at compile time, not tensors
STATIC_ATTRS = {"shape", "ndim", "dtype", "size"}
STATIC_CALLS = {"len", "isinstance", "type", "range", "int", "float", "bool", "str"}
# `self.shape(x)` (P.Shape()), `ops.shape(x)`, `F.rank(x)`: compile-time values too
SHAPE_CALLS = {"shape", "Shape", "rank", "Rank", "dtype", "DType", "get_shape"}


def _mentions_tensor(expr, tensors: set) -> bool:
    """Does `expr` use a tensor's value (not only its shape, rank or dtype)?"""
    if isinstance(expr, ast.Attribute) and expr.attr in STATIC_ATTRS:
        return False
    if isinstance(expr, ast.Call) and ((isinstance(expr.func, ast.Name) and expr.func.id in STATIC_CALLS)
                                       or _last(expr.func) in SHAPE_CALLS):
        return False
    if isinstance(expr, ast.Name):
        return expr.id in tensors
    return any(_mentions_tensor(child, tensors) for child in ast.iter_child_nodes(expr))


def _params(fn) -> list:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]


def _tensor_names(fn, inputs: set) -> set:
    """Names that hold tensors in a graph function: its tensor inputs, and what is computed from
    them (`_, _, C = x.shape` makes C a Python int, not a tensor)."""
    tensors = set(inputs)
    assigns = [n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value]
    for _ in range(3):  # a few rounds settle chains like a = x + 1; b = a * 2
        for node in assigns:
            if _mentions_tensor(node.value, tensors):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                tensors |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return tensors


def _check_allreduce(fn, opt_call_line, add) -> None:
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func.func if isinstance(node.func, ast.Call) else node.func
        if _last(callee) not in ("AllReduce", "all_reduce"):
            continue
        if opt_call_line is None or not any(isinstance(n, ast.Name) and "grad" in n.id.lower()
                                            for a in node.args for n in ast.walk(a)):
            continue  # not gradients: summing metrics, counts or overflow flags across ranks is the point
        if node.lineno > opt_call_line or not _averaged(fn, node):
            add(node, "MS012")


def _averaged(fn, call) -> bool:
    """Is the all-reduce result divided (by the group size) somewhere in the function?"""
    for node in ast.walk(fn):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            if call in ast.walk(node.left):
                return True
        if isinstance(node, ast.Assign) and call in ast.walk(node.value):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            for other in ast.walk(fn):
                if isinstance(other, ast.BinOp) and isinstance(other.op, ast.Div) and any(
                        isinstance(n, ast.Name) and n.id in names for n in ast.walk(other.left)):
                    return True
                if isinstance(other, ast.AugAssign) and isinstance(other.op, ast.Div) and \
                        isinstance(other.target, ast.Name) and other.target.id in names:
                    return True
    return False


def _check_module(mod: Module, add) -> None:
    for node in mod.nodes:
        if isinstance(node, ast.Lambda):
            parent_call = _parent_call_of(mod, node)
            if parent_call is not None and (_is_jit(mod, parent_call) or _compiled_grad(mod, parent_call)):
                add(node, "MS004")
        if not isinstance(node, ast.Call):
            continue
        last = _last(node.func)
        if _is_jit(mod, node) or (isinstance(node.func, ast.Call) and _is_jit(mod, node.func)):
            mode = _kw(node if _is_jit(mod, node) else node.func, "capture_mode")
            traced = node.args[0] if _is_jit(mod, node) and node.args else None
            decorator = isinstance(mod.parents.get(node), (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node in mod.parents[node].decorator_list  # judged with its function below
            if isinstance(mode, ast.Constant) and mode.value == "trace" and not decorator and _may_step(mod, traced):
                add(node, "MS006")
        if last in ("cast", "astype") and _casts_integers_to_half(mod, node):
            add(node, "MS008")
        # measured on MindSpore 2.10: the clash needs the Parameter and an optimizer with that state
        # in one ms.jit function (the same names ran fine in a GRAPH_MODE TrainOneStepCell, and in a
        # simulation with no optimizer), so this file must jit and build or call an optimizer
        # ... or in a file that builds the Parameters and the optimizer for a step another file of
        # its project jits
        # (where only another file jits, a Parameter a Cell holds as `self.x` is not one: the Cell
        # prefixes its sub-Cells' (the optimizers') state names, as in a TrainOneStepCell)
        if last == "Parameter" and mod.builds_optimizer and _state_name(node) and not _in_optimizer_class(mod, node) \
                and (mod.jit_names or mod.jit_wrapped or (mod.project_jits and not _cell_attribute(mod, node))):
            add(node, "MS009")
        if last == "control_depend":
            add(node, "MS016")
        if _calls_jitted(mod, node):
            for arg in list(node.args) + [k.value for k in node.keywords]:
                if _varies_per_call(mod, node, arg):
                    add(arg, "MS003")
                elif _python_list(mod, node, arg) and _runs_repeatedly(mod, node):
                    add(arg, "MS017")
    _check_loads(mod, add)
    for defs in mod.functions.values():
        for fn in defs:
            for dec in fn.decorator_list:
                if isinstance(dec, ast.Call) and _is_jit(mod, dec):
                    mode = _kw(dec, "capture_mode")
                    if isinstance(mode, ast.Constant) and mode.value == "trace" and _has_side_effects(mod, fn):
                        add(dec, "MS006")


SIDE_EFFECTS = {"value_and_grad", "grad", "assign", "assign_add", "assign_sub", "scatter_update", "depend",
                "GradOperation", "TrainOneStepCell"}


def _has_side_effects(mod, fn) -> bool:
    """A training step: it computes gradients, calls an optimizer, or assigns to Parameters (what
    a traced graph replays without); a pure function traces fine."""
    names = {fn.name} | {c.func.id for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    for name in names:
        for f in mod.functions.get(name, []):
            for c in ast.walk(f):
                if isinstance(c, ast.Call):
                    last = _last(c.func.func if isinstance(c.func, ast.Call) else c.func)
                    if last in SIDE_EFFECTS or last.lower() in OPTIMIZER_WORDS or last.lower().endswith("optimizer") \
                            or (isinstance(c.func, ast.Name) and c.func.id in mod.grad_targets):
                        return True
    return False


def _may_step(mod, traced) -> bool:
    """`ms.jit(f, capture_mode='trace')`: f is a training step, or not defined in this file (unknown)."""
    if not isinstance(traced, ast.Name) or traced.id not in mod.functions:
        return True
    return any(_has_side_effects(mod, fn) for fn in mod.functions[traced.id])


def _cell_attribute(mod, call) -> bool:
    """`self.step = Parameter(...)`: the Parameter is a Cell's attribute."""
    parent = mod.parents.get(call)
    return isinstance(parent, ast.Assign) and any(isinstance(t, ast.Attribute) and _dotted(t.value) == "self"
                                                  for t in parent.targets)


def _calls_jitted(mod, call) -> bool:
    """A call of a jitted function of this file (`step(x)`) or of a jitted method (`self.step(x)`,
    `model.step(x)`: a `@jit` def inside a class)."""
    if isinstance(call.func, ast.Name):
        return call.func.id in mod.jit_names
    return isinstance(call.func, ast.Attribute) and call.func.attr in mod.jit_methods


def _is_list_expr(value) -> bool:
    if isinstance(value, (ast.List, ast.ListComp)):
        return True
    if isinstance(value, ast.Call):
        return (isinstance(value.func, ast.Name) and value.func.id == "list") or \
            (isinstance(value.func, ast.Attribute) and value.func.attr == "tolist")
    return False


def _python_list(mod, call, arg) -> bool:
    """A Python list: a literal, a comprehension, `list(...)`, `.tolist()`, or a name the same scope
    bound to one (last binding before the call)."""
    if _is_list_expr(arg):
        return True
    if not isinstance(arg, ast.Name):
        return False
    scope = mod.scope_of[call]
    binds = [n for n in mod.assigns_in(scope) if n.lineno < call.lineno
             and any(isinstance(t, ast.Name) and t.id == arg.id for t in n.targets)]
    latest = max(binds, key=lambda n: n.lineno, default=None)
    return latest is not None and _is_list_expr(latest.value)


def _runs_repeatedly(mod, call) -> bool:
    """In a loop, or in a function (a step or method called per batch), not a one-off module-level call."""
    return any(isinstance(a, (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef, ast.comprehension))
               for a in _ancestors(mod, call))


def _fails_to_parse(mod, lam) -> bool:
    """A lambda in graph code that MindSpore 2.10 rejects (measured): one written inside the call
    to jit/value_and_grad/grad ('Parse Lambda Function Fail ... defined on a separate line'), or a
    map/filter lambda that reads a free variable ('Map operator don't support Closure with free
    variable'). `f = lambda v: v * 2` on its own line, and map(lambda s: s * 2, xs), compile."""
    call = _parent_call_of(mod, lam)
    if call is None:
        return False
    name = _last(call.func)
    if _is_jit(mod, call) or name in ("value_and_grad", "grad"):
        return True
    if name in ("map", "filter"):
        own = {a.arg for a in lam.args.args + lam.args.kwonlyargs + lam.args.posonlyargs}
        return any(isinstance(n, ast.Name) and n.id not in own and n.id not in dir(__builtins__)
                   for n in ast.walk(lam.body))
    return False


def _compiled_grad(mod, call) -> bool:
    """A `value_and_grad`/`grad` whose function gets compiled: in a file that sets GRAPH_MODE, or
    called from graph code. In PyNative a lambda there runs fine (measured), so only these are MS004.
    (The file's own mode, not its project's: a pipeline that sets GRAPH_MODE for one model does not
    make another model's eager training loop graph code.)"""
    if _last(call.func) not in ("value_and_grad", "grad"):
        return False
    if mod.file_graph_mode and mod.mode_at(_top_statement(mod, call).lineno) != "pynative":
        return True
    parent = mod.parents.get(call)
    return isinstance(parent, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id in mod.graph_calls for t in parent.targets)


LOADS = ("load_param_into_net", "set_data", "load_checkpoint")


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _check_loads(mod, add) -> None:
    """MS005 in the order code runs: in one scope, a weight load after a call that runs a jitted
    function (directly or through a function of this file that does) and before another such call,
    into a net that function uses. A load in another function, in `__main__` before `train()` is
    called, or after the last compiled call (the best weights loaded for a plain evaluation) is not one."""
    if not mod.jit_names:
        return
    scopes = [mod.tree] + [fn for defs in mod.functions.values() for fn in defs]
    calls = {id(s): [] for s in scopes}
    scope_of = mod.scope_of
    for node in mod.nodes:
        if isinstance(node, ast.Call) and id(scope_of[node]) in calls:
            calls[id(scope_of[node])].append(node)
    runs_jit = mod.runs_jit
    used = _names_used_by_graph_code(mod)
    for scope in scopes:
        jit_lines = [c.lineno for c in calls[id(scope)] if isinstance(c.func, ast.Name) and c.func.id in runs_jit]
        if not jit_lines:
            continue
        for call in calls[id(scope)]:
            # stale only when compiled code ran before the load and runs again after it (a load of the
            # best weights before evaluating with the plain network reads the new weights)
            if min(jit_lines) < call.lineno < max(jit_lines) and _last(call.func) in LOADS:
                target = _load_target(call)
                if target and (used is None or target in used):
                    add(call, "MS005")


def _load_target(call):
    """The root name of what a load writes: `load_param_into_net(net, ...)` -> 'net',
    `self.net.fc.weight.set_data(w)` -> 'net'; None for a load that writes no net."""
    last = _last(call.func)
    if last == "set_data":
        obj = call.func.value if isinstance(call.func, ast.Attribute) else None
    elif last == "load_param_into_net" and call.args:
        obj = call.args[0]
    elif last == "load_checkpoint" and len(call.args) > 1:
        obj = call.args[1]
    else:
        return None
    parts = _dotted(obj).split(".") if obj is not None else [""]
    return (parts[1] if parts[0] == "self" and len(parts) > 1 else parts[0]) or None


def _names_used_by_graph_code(mod):
    """Every name and attribute the file's graph code mentions; None when a jitted function's body
    is not in this file (`train = jit(imported_fn)`), so any load after it may matter."""
    if any(name not in mod.functions for name in mod.jit_wrapped):
        return None
    used = set()
    for fn in mod.graph_functions:
        for node in ast.walk(fn):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
    return used


def _parent_call_of(mod, target):
    """The call that takes `target` as an argument (positional or keyword), if any."""
    parent = mod.parents.get(target)
    if isinstance(parent, ast.keyword):
        parent = mod.parents.get(parent)
    if isinstance(parent, ast.Call) and (target in parent.args or target in [k.value for k in parent.keywords]):
        return parent
    return None


HALF = ("float16", "bfloat16", "half")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "int_", "long")
INT_PRODUCERS = ("argmax", "argmin", "Argmax", "Argmin", "arange", "randint", "topk_indices")
# ops whose argument at this position is an integer index or class label (not `embedding`: model
# code names Dense layers and embedding outputs that too)
INDEX_ARGS = {"onehot": 0, "one_hot": 0, "gather": 1, "gatherv2": 1, "gatherd": 2, "gather_elements": 2,
              "sparsesoftmaxcrossentropywithlogits": 1, "nll_loss": 1, "nllloss": 1}


def _half_cast(call: ast.Call):
    """`cast(x, float16)` / `x.astype(bfloat16)` -> (x, its target name or None); else None."""
    if _last(call.func) == "cast" and len(call.args) >= 2:
        subject, dtype = call.args[0], call.args[1]
    elif _last(call.func) == "astype" and isinstance(call.func, ast.Attribute) and call.args:
        subject, dtype = call.func.value, call.args[0]
    else:
        return None
    if not (_last(dtype) in HALF or (isinstance(dtype, ast.Constant) and dtype.value in HALF[:2])):
        return None
    return subject if isinstance(subject, ast.Name) else None


def _is_int_dtype(node) -> bool:
    return _last(node) in INT_DTYPES or (isinstance(node, ast.Constant) and node.value in INT_DTYPES)


def _produces_integers(value) -> bool:
    """An expression whose result is integer: an int cast, argmax/argmin, arange, randint."""
    if not isinstance(value, ast.Call):
        return False
    callee = value.func.func if isinstance(value.func, ast.Call) else value.func
    if _last(callee) in INT_PRODUCERS:
        return True
    if _last(value.func) == "cast" and len(value.args) >= 2:
        return _is_int_dtype(value.args[1])
    if _last(value.func) == "astype" and value.args:
        return _is_int_dtype(value.args[0])
    dtype = _kw(value, "dtype")
    return _last(value.func) in ("Tensor", "tensor") and dtype is not None and _is_int_dtype(dtype)


def _casts_integers_to_half(mod, call: ast.Call) -> bool:
    """MS008 on evidence, not on names: the value cast to fp16/bf16 holds integers (its latest
    binding before the cast is an int cast, argmax, arange...; or since that binding it was used as
    an index or class label: one_hot, gather, sparse cross-entropy), or the cast's result is used as
    one afterwards. A float mask, a one-hot label or a regression target named `label`, `y` or
    `mask` is not one, and neither is `x = self.embedding(x)` before `cast(x, float16)`."""
    subject = _half_cast(call)
    if subject is None:
        return False
    scope = next((a for a in _ancestors(mod, call) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))),
                 mod.tree)
    parent = mod.parents.get(call)
    results = {t.id for t in parent.targets if isinstance(t, ast.Name)} if isinstance(parent, ast.Assign) else set()
    binds = [n for n in ast.walk(scope) if isinstance(n, ast.Assign) and n.value is not call
             and n.lineno < call.lineno and any(isinstance(t, ast.Name) and t.id == subject.id for t in n.targets)]
    latest = max(binds, key=lambda n: n.lineno, default=None)
    if latest is not None and _produces_integers(latest.value):
        return True
    since = latest.lineno if latest is not None else 0
    for node in ast.walk(scope):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func.func if isinstance(node.func, ast.Call) else node.func
        index = INDEX_ARGS.get(_last(callee).lower())
        if index is None or len(node.args) <= index or not isinstance(node.args[index], ast.Name):
            continue
        used = node.args[index].id
        if (used == subject.id and since < node.lineno <= call.lineno) or (used in results and node.lineno >= call.lineno):
            return True
    return bool(results) and _reaches_class_label(mod, scope, results, call.lineno)


CROSS_ENTROPY = ("crossentropyloss", "cross_entropy", "softmaxcrossentropywithlogits", "nllloss", "nll_loss",
                 "sparsesoftmaxcrossentropywithlogits", "focalloss")


def _reaches_class_label(mod, scope, names: set, after: int) -> bool:
    """One of `names` is passed, after line `after`, to a function of this file (the forward behind a
    `value_and_grad`, the tutorial's shape) that gives that argument to a cross-entropy as its label:
    the cast value is a class index."""
    targets = mod.grad_targets
    for node in ast.walk(scope):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.lineno > after):
            continue
        for callee in mod.functions.get(targets.get(node.func.id, node.func.id), []):
            params = _params(callee)
            passed = {params[i] for i, a in enumerate(node.args) if i < len(params)
                      and isinstance(a, ast.Name) and a.id in names}
            passed |= {k.arg for k in node.keywords if k.arg in params and isinstance(k.value, ast.Name)
                       and k.value.id in names}
            if passed and any(_is_cross_entropy(mod, c) and len(c.args) > 1 and isinstance(c.args[1], ast.Name)
                              and c.args[1].id in passed for c in ast.walk(callee) if isinstance(c, ast.Call)):
                return True
    return False


def _is_cross_entropy(mod, call) -> bool:
    """A cross-entropy call: `ops.cross_entropy(...)`, `nn.CrossEntropyLoss()(...)`, or a name or
    `self.` attribute the file binds to a cross-entropy Cell (`loss_fn = nn.CrossEntropyLoss()`)."""
    callee = call.func.func if isinstance(call.func, ast.Call) else call.func
    if _last(callee).lower() in CROSS_ENTROPY:
        return True
    name = _dotted(callee)
    return bool(name) and name in mod.cross_entropy_names


def _state_name(call: ast.Call) -> bool:
    """The Parameter's name is one an optimizer uses: a state prefix (`accum.` + name), or exactly one
    of its whole names (`global_step`; `global_step_increase` is another name)."""
    name = _kw(call, "name") or (call.args[1] if len(call.args) > 1 else None)
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        return name.value.startswith(STATE_PREFIXES) or name.value in STATE_NAMES
    if isinstance(name, ast.JoinedStr) and name.values and isinstance(name.values[0], ast.Constant):
        return str(name.values[0].value).startswith(STATE_PREFIXES)
    if isinstance(name, ast.BinOp) and isinstance(name.left, ast.Constant) and isinstance(name.left.value, str):
        return name.left.value.startswith(STATE_PREFIXES)
    return False


def _in_optimizer_class(mod, node) -> bool:
    """`node` is inside a class deriving from a MindSpore optimizer (its own state, not a clash)."""
    return any(isinstance(a, ast.ClassDef) and any(_last(b) in OPTIMIZER_BASES or _last(b).endswith("Optimizer")
                                                   for b in a.bases) for a in _ancestors(mod, node))


NUMBER_CALLS = {"float", "int", "abs", "min", "max", "round", "len", "pow", "sqrt", "cos", "sin", "exp", "log"}


def _varies_per_call(mod, call, arg) -> bool:
    """A Python number that changes from call to call: a loop counter, a number bumped in the loop,
    or arithmetic on one (`1.0 / (epoch + 1)`)."""
    if isinstance(arg, ast.Call) and _last(arg.func) in ("float", "int", "item"):
        return True
    if isinstance(arg, (ast.BinOp, ast.UnaryOp)):
        names = [n for n in ast.walk(arg) if isinstance(n, ast.Name)]
        calls = [c for c in ast.walk(arg) if isinstance(c, ast.Call)]
        if all(_last(c.func) in NUMBER_CALLS for c in calls) and \
                not any(isinstance(n, ast.Attribute) for n in ast.walk(arg)
                        if not (isinstance(n, ast.Attribute) and _dotted(n).startswith("math."))):
            # every name a Python number (`x * epoch` may be a tensor times a counter: not one)
            varies = [_varies_per_call(mod, call, n) for n in names]
            return any(varies) and all(v or n.id == "math" or _is_python_number(mod, call, n.id)
                                       for v, n in zip(varies, names))
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "item":
        return True
    if not isinstance(arg, ast.Name):
        return False
    for loop in _ancestors(mod, call):
        if isinstance(loop, ast.For):
            if isinstance(loop.iter, ast.Call) and _last(loop.iter.func) in ("range", "enumerate"):
                targets = [n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)]
                if _last(loop.iter.func) == "enumerate":
                    targets = targets[:1]
                if arg.id in targets:
                    return True
            for node in ast.walk(loop):
                if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == arg.id:
                    return _is_python_number(mod, loop, arg.id)
    return False


def _is_python_number(mod, node, name: str) -> bool:
    """In the scope around `node`, `name` is bound only to Python numbers (`x = 0`, `float(...)`,
    `len(...)`); `x = ms.Tensor([0])` then `x += 1` is a tensor, and passing it does not recompile."""
    scope = next((a for a in _ancestors(mod, node) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))),
                 mod.tree)
    values = [n.value for n in mod.assigns_in(scope) if any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    # `max_len, batch = path.shape[1], targets.shape[0]` / `b, c = x.shape`: shape entries are ints
    for n in mod.assigns_in(scope):
        for t in n.targets:
            if isinstance(t, ast.Tuple) and any(isinstance(e, ast.Name) and e.id == name for e in t.elts):
                i = next(i for i, e in enumerate(t.elts) if isinstance(e, ast.Name) and e.id == name)
                values.append(n.value.elts[i] if isinstance(n.value, ast.Tuple) and i < len(n.value.elts) else n.value)

    def number(v):
        return (isinstance(v, ast.Constant) and isinstance(v.value, (int, float)) and not isinstance(v.value, bool)) \
            or (isinstance(v, ast.UnaryOp) and number(v.operand)) \
            or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("int", "float", "len")) \
            or (isinstance(v, ast.Attribute) and v.attr == "shape") \
            or (isinstance(v, ast.Subscript) and isinstance(v.value, ast.Attribute) and v.value.attr == "shape")

    return bool(values) and all(number(v) for v in values)
