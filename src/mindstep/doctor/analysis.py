"""Static analysis of training code (Python `ast`, nothing is executed).

`analyze_source(text, path)` returns findings `{path, line, col, rule, message, fix, severity}`.

Which code counts as *graph code* (compiled by MindSpore, where the pitfalls bite):
functions decorated with `jit` / `ms.jit` / `mindspore.jit`, functions passed to `jit(...)`,
functions those call by name (transitively, within the file; this covers the forward function
behind `value_and_grad`), and `construct` methods when the file switches to `GRAPH_MODE`.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .rules import RULES

OPTIMIZER_WORDS = ("opt", "optimizer", "optim")
MUTATORS = {"append", "extend", "insert", "pop", "update", "clear", "setdefault", "add", "remove", "discard",
            "popitem", "sort", "reverse"}
LABEL_WORDS = ("label", "labels", "target", "targets", "y", "mask", "masks", "ids", "token", "tokens", "idx")
# Names MindSpore's optimizers give their own state: per-parameter prefixes, and whole names.
STATE_PREFIXES = ("accum.", "moment1.", "moment2.", "moments.", "mean_grad.", "mean_square.", "prev.",
                  "lamb_m.", "lamb_v.")
STATE_NAMES = ("global_step", "learning_rate", "beta1_power", "beta2_power")
# An optimizer's own state is no clash: Parameters created in a subclass of these (mindcv's AdamW,
# Lion and NAdam create `beta1_power`; subclasses re-bind their base's `global_step`) are its own.
OPTIMIZER_BASES = {"Optimizer", "Adam", "AdamWeightDecay", "AdamOffload", "AdamW", "LazyAdam", "Momentum", "SGD",
                   "RMSProp", "Lamb", "LARS", "Adagrad", "Adadelta", "Adamax", "FTRL", "ProximalAdagrad", "Rprop",
                   "ASGD", "Lion", "NAdam"}


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


def _dotted(node) -> str:
    """`ms.ops.AllReduce` -> 'ms.ops.AllReduce'; anything else -> ''."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _last(node) -> str:
    name = _dotted(node)
    return name.rsplit(".", 1)[-1] if name else ""


def _is_jit(node) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return _dotted(target) in ("jit", "ms.jit", "mindspore.jit")


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


class Module:
    """Indexes one file: its functions, module-level names, and which functions are graph code."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        # child -> parent, built once: every "what encloses this node" question is a walk up, not a
        # walk of the whole tree per node (which made one file with 300 lambdas take 37 s)
        self.nodes = list(ast.walk(tree))  # walked once; the checks below iterate this list
        self.parents = {child: node for node in self.nodes for child in ast.iter_child_nodes(node)}
        self.functions: dict[str, list] = {}
        for node in self.nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)
        self.module_assign_counts: dict[str, int] = {}
        for node in tree.body:
            for target in _assign_targets(node):
                self.module_assign_counts[target] = self.module_assign_counts.get(target, 0) + 1
        self.global_writes = set()
        for node in self.nodes:
            if isinstance(node, ast.Global):
                fn = _enclosing_assigns(self, node)
                self.global_writes |= set(node.names) & fn
        self.graph_mode = any(_dotted(n) in ("ms.GRAPH_MODE", "mindspore.GRAPH_MODE", "context.GRAPH_MODE",
                                             "GRAPH_MODE") for n in self.nodes if isinstance(n, (ast.Attribute, ast.Name)))
        self.jit_names = self._jit_names()
        self.jit_wrapped = {n.args[0].id for n in self.nodes if isinstance(n, ast.Call) and _is_jit(n)
                            and n.args and isinstance(n.args[0], ast.Name)}
        self.graph_functions = self._graph_functions()

    def _jit_names(self) -> set:
        """Names bound to jitted functions: decorated defs and `x = jit(f)` assignments."""
        names = set()
        for defs in self.functions.values():
            for fn in defs:
                if any(_is_jit(d) for d in fn.decorator_list):
                    names.add(fn.name)
        for node in self.nodes:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _is_jit(node.value):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        return names

    def _graph_functions(self) -> list:
        roots = []
        for defs in self.functions.values():
            for fn in defs:
                if any(_is_jit(d) for d in fn.decorator_list):
                    roots.append(fn)
                elif fn.name == "construct" and self.graph_mode:
                    roots.append(fn)
        for node in self.nodes:
            if isinstance(node, ast.Call) and _is_jit(node) and node.args and isinstance(node.args[0], ast.Name):
                roots.extend(self.functions.get(node.args[0].id, []))
        grad_targets = self._grad_targets()
        seen, queue = set(), list(roots)
        while queue:
            fn = queue.pop()
            if id(fn) in seen:
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


def analyze_source(text: str, path: str = "<string>") -> list[dict]:
    """All findings in one file's source, sorted by line."""
    tree = ast.parse(text, filename=path)
    mod = Module(tree)
    found: list[Finding] = []

    def add(node, rule):
        found.append(Finding(path, node.lineno, node.col_offset, rule))

    for fn in mod.graph_functions:
        _check_graph_function(mod, fn, add)
    _check_module(mod, add)
    unique = {(f.line, f.col, f.rule): f for f in found}
    lines = text.splitlines()
    kept = [f for f in unique.values() if not _suppressed(lines[f.line - 1] if f.line <= len(lines) else "", f.rule)]
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
    dicts = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and (
        isinstance(n.value, ast.Dict) or (isinstance(n.value, ast.Call) and _dotted(n.value.func) == "dict"))
        for t in n.targets if isinstance(t, ast.Name)}
    opt_call_line = None
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
            if name.startswith(("np.", "numpy.")) and name not in ("np.float32", "np.float16", "np.int32", "np.int64"):
                add(node, "MS010")
            if last == "step" and any(w in base_name.lower() for w in ("sched", "scheduler", "lr")):
                add(node, "MS011")
            if isinstance(node.func, ast.Name) and node.func.id.lower() in OPTIMIZER_WORDS or \
                    (isinstance(node.func, ast.Attribute) and node.func.attr in OPTIMIZER_WORDS):
                opt_call_line = node.lineno if opt_call_line is None else min(opt_call_line, node.lineno)
        elif isinstance(node, ast.Lambda):
            add(node, "MS004")
        elif isinstance(node, ast.Global):
            add(node, "MS001")
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id not in local \
                        and t.value.id in mod.module_assign_counts:
                    add(node, "MS001")
                if isinstance(t, ast.Name) and t.id in params and isinstance(node.value, (ast.ListComp, ast.List)):
                    add(node, "MS007")
        elif isinstance(node, ast.If):
            for sub in ast.walk(node.test):
                if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mod) and any(
                        isinstance(o, ast.Name) and o.id in params for o in (sub.left, sub.right)):
                    add(node, "MS007")
                    break
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            if mod.module_assign_counts.get(node.id, 0) > 1 or node.id in mod.global_writes:
                add(node, "MS002")
    _check_allreduce(fn, opt_call_line, add)
    if fn.name in mod.jit_names or fn.name in mod.jit_wrapped or any(_is_jit(d) for d in fn.decorator_list):
        for arg in fn.args.args:
            if arg.arg in ("net", "network", "model", "optimizer", "opt", "loss_fn"):
                add(arg, "MS015")


def _check_allreduce(fn, opt_call_line, add) -> None:
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func.func if isinstance(node.func, ast.Call) else node.func
        if _last(callee) not in ("AllReduce", "all_reduce"):
            continue
        if opt_call_line is not None and node.lineno > opt_call_line:
            add(node, "MS012")
        elif not _averaged(fn, node):
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
    jitted_call_lines = [n.lineno for n in mod.nodes if isinstance(n, ast.Call)
                         and isinstance(n.func, ast.Name) and n.func.id in mod.jit_names]
    first_jit_call = min(jitted_call_lines) if jitted_call_lines else None
    for node in mod.nodes:
        if isinstance(node, ast.Lambda):
            parent_call = _parent_call_of(mod, node)
            if parent_call is not None and (_is_jit(parent_call) or _last(parent_call.func) in ("value_and_grad", "grad")):
                add(node, "MS004")
        if not isinstance(node, ast.Call):
            continue
        last = _last(node.func)
        if first_jit_call is not None and node.lineno > first_jit_call and (
                last in ("load_param_into_net", "set_data") or (last == "load_checkpoint" and len(node.args) > 1)):
            add(node, "MS005")
        if _is_jit(node) or (isinstance(node.func, ast.Call) and _is_jit(node.func)):
            mode = _kw(node if _is_jit(node) else node.func, "capture_mode")
            if isinstance(mode, ast.Constant) and mode.value == "trace":
                add(node, "MS006")
        if last in ("cast", "astype") and _casts_label_to_half(node):
            add(node, "MS008")
        if last == "Parameter" and _state_name(node) and not _in_optimizer_class(mod, node):
            add(node, "MS009")
        if last == "control_depend":
            add(node, "MS016")
        if isinstance(node.func, ast.Name) and node.func.id in mod.jit_names:
            for arg in node.args:
                if _varies_per_call(mod, node, arg):
                    add(arg, "MS003")
    for defs in mod.functions.values():
        for fn in defs:
            for dec in fn.decorator_list:
                if isinstance(dec, ast.Call) and _is_jit(dec):
                    mode = _kw(dec, "capture_mode")
                    if isinstance(mode, ast.Constant) and mode.value == "trace":
                        add(dec, "MS006")


def _parent_call_of(mod, target):
    """The call that takes `target` as an argument (positional or keyword), if any."""
    parent = mod.parents.get(target)
    if isinstance(parent, ast.keyword):
        parent = mod.parents.get(parent)
    if isinstance(parent, ast.Call) and (target in parent.args or target in [k.value for k in parent.keywords]):
        return parent
    return None


def _casts_label_to_half(call: ast.Call) -> bool:
    if _last(call.func) == "cast" and len(call.args) >= 2:
        subject, dtype = call.args[0], call.args[1]
    elif _last(call.func) == "astype" and isinstance(call.func, ast.Attribute) and call.args:
        subject, dtype = call.func.value, call.args[0]
    else:
        return False
    half = _last(dtype) in ("float16", "bfloat16", "half") or (isinstance(dtype, ast.Constant) and dtype.value in ("float16", "bfloat16"))
    return half and isinstance(subject, ast.Name) and subject.id.lower() in LABEL_WORDS


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
                    return True
    return False
