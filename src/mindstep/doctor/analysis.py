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
from .project import OPTIMIZER_BASES, Project, builds_optimizer, sets_graph_mode
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
        project = project or Project()
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
            if isinstance(node, ast.Global):
                fn = _enclosing_assigns(self, node)
                self.global_writes |= set(node.names) & fn
        self.file_graph_mode = sets_graph_mode(self.nodes) or any(
            _dotted(n) in ("ms.GRAPH_MODE", "mindspore.GRAPH_MODE", "context.GRAPH_MODE", "GRAPH_MODE")
            for n in self.nodes if isinstance(n, (ast.Attribute, ast.Name)))
        self.graph_mode = project.graph_mode or self.file_graph_mode
        self.builds_optimizer = builds_optimizer(self.nodes)
        self.jit_names = self._jit_names()
        self.jit_wrapped = {n.args[0].id for n in self.nodes if isinstance(n, ast.Call) and _is_jit(self, n)
                            and n.args and isinstance(n.args[0], ast.Name)}
        self.graph_functions = self._graph_functions()
        self.graph_calls = {c.func.id for fn in self.graph_functions for c in ast.walk(fn)
                            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}

    @functools.cached_property
    def tensor_params(self) -> dict:
        """id(graph function) -> its parameters that receive tensors. A jitted function's or a
        `construct`'s inputs are tensors; a helper's are only those that graph code passes
        tensors to (`_init_state(shape, dtype)` takes a shape, and its numpy is a constant)."""
        roots = {id(fn) for fn in self.graph_functions if fn.name == "construct" or fn.name in self.jit_names
                 or fn.name in self.jit_wrapped or any(_is_jit(self, d) for d in fn.decorator_list)}
        found = {id(fn): (set(_params(fn)) - {"self", "cls"}) if id(fn) in roots else set()
                 for fn in self.graph_functions}
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
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if alias.name == "numpy":
                        self.numpy_names.add(bound)
                    elif alias.name.split(".")[0] == "mindspore":
                        # `import mindspore.numpy as np` binds np to MindSpore's numpy, not numpy's
                        (self.ms_modules.add(bound), self.numpy_names.discard(bound))
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if node.module.split(".")[0] == "mindspore":
                        self.ms_modules.add(bound)
                        self.numpy_names.discard(bound)
                    else:
                        self.foreign_names.add(bound)

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
                elif fn.name == "construct" and self.graph_mode:
                    roots.append(fn)
        for node in self.nodes:
            if isinstance(node, ast.Call) and _is_jit(self, node) and node.args and isinstance(node.args[0], ast.Name):
                roots.extend(self.functions.get(node.args[0].id, []))
        grad_targets = self._grad_targets()
        seen, queue = set(), list(roots)
        while queue:
            fn = queue.pop()
            if id(fn) in seen or any(_last(d) in HOST_AT_COMPILE for d in fn.decorator_list):
                continue
            seen.add(id(fn))
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                    name = grad_targets.get(call.func.id, call.func.id)
                    queue.extend(self.functions.get(name, []))
        return [fn for defs in self.functions.values() for fn in defs if id(fn) in seen]

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
    dicts = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and (
        isinstance(n.value, ast.Dict) or (isinstance(n.value, ast.Call) and _dotted(n.value.func) == "dict"))
        for t in n.targets if isinstance(t, ast.Name)}
    opt_call_line = None
    tensors = None  # the function's tensor-valued names, worked out when a numpy call needs them
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            name, last = _dotted(node.func), _last(node.func)
            base = node.func.value if isinstance(node.func, ast.Attribute) else None
            base_name = base.id if isinstance(base, ast.Name) else ""
            if last in MUTATORS and base_name and base_name not in local and base_name in mod.module_assign_counts:
                add(node, "MS001")
            if last == "update" and base_name in dicts:
                add(node, "MS014")
            if name == "print":
                add(node, "MS013")
            if last in ("asnumpy", "item", "tolist") and isinstance(node.func, ast.Attribute):
                add(node, "MS010")
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


def _rebound_after_compile(mod, name: str, fn) -> bool:
    """A module-level name assigned again at a point where `fn` may have been compiled already: after
    the first module-level statement that runs compiled code (`Module.first_run_line`), or, where no
    such statement is seen, after `fn`'s definition. A network rebound before anything compiled
    (`model = auto_mixed_precision(model, 'O2')` under `model = Network()`) is read at its last value."""
    lines = mod.module_assign_lines.get(name, [])
    if len(lines) < 2:
        return False
    since = mod.first_run_line or _top_statement(mod, fn).lineno
    return any(line > since for line in lines[1:])


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
            if isinstance(mode, ast.Constant) and mode.value == "trace":
                add(node, "MS006")
        if last in ("cast", "astype") and _casts_integers_to_half(mod, node):
            add(node, "MS008")
        # measured on MindSpore 2.10: the clash needs the Parameter and an optimizer with that state
        # in one ms.jit function (the same names ran fine in a GRAPH_MODE TrainOneStepCell, and in a
        # simulation with no optimizer), so this file must jit and build or call an optimizer
        if last == "Parameter" and mod.jit_names | mod.jit_wrapped and mod.builds_optimizer and _state_name(node) \
                and not _in_optimizer_class(mod, node):
            add(node, "MS009")
        if last == "control_depend":
            add(node, "MS016")
        if isinstance(node.func, ast.Name) and node.func.id in mod.jit_names:
            for arg in node.args:
                if _varies_per_call(mod, node, arg):
                    add(arg, "MS003")
    _check_loads(mod, add)
    for defs in mod.functions.values():
        for fn in defs:
            for dec in fn.decorator_list:
                if isinstance(dec, ast.Call) and _is_jit(mod, dec):
                    mode = _kw(dec, "capture_mode")
                    if isinstance(mode, ast.Constant) and mode.value == "trace":
                        add(dec, "MS006")


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
    if mod.file_graph_mode:
        return True
    parent = mod.parents.get(call)
    return isinstance(parent, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id in mod.graph_calls for t in parent.targets)


LOADS = ("load_param_into_net", "set_data", "load_checkpoint")


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _check_loads(mod, add) -> None:
    """MS005 in the order code runs: in one scope, a weight load after a call that runs a jitted
    function (directly or through a function of this file that does), into a net that function
    uses. A load in another function, or in `__main__` before `train()` is called, is not one."""
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
            if call.lineno > min(jit_lines) and _last(call.func) in LOADS:
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
    return False


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


def _varies_per_call(mod, call, arg) -> bool:
    """A Python number that changes from call to call: a loop counter, or a number bumped in the loop."""
    if isinstance(arg, ast.Call) and _last(arg.func) in ("float", "int", "item"):
        return True
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
    scope_of = mod.scope_of
    values = [n.value for n in mod.nodes if isinstance(n, ast.Assign) and scope_of[n] is scope
              and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]

    def number(v):
        return (isinstance(v, ast.Constant) and isinstance(v.value, (int, float)) and not isinstance(v.value, bool)) \
            or (isinstance(v, ast.UnaryOp) and number(v.operand)) \
            or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in ("int", "float", "len"))

    return bool(values) and all(number(v) for v in values)
