"""Idioms of MindSpore's own tutorials that train wrong inside a step, caught when the step is built.

A user who moves a hand-written loop onto `TrainStep` keeps what the step now does for them, and
three of MindSpore's tutorial idioms then silently change training:

- **the loss scaled in forward** (the mixed-precision tutorial's `loss_scaler.scale(loss)`): the step
  scales the loss itself when it has a loss scale, and unscales only what it scaled; either way the
  update comes out multiplied by the tutorial's scale (65536 by default). Refused (`ValueError`): no
  forward that scales its loss trains right inside a step, so there is nothing to warn about.
- **the loss divided by the accumulation steps** (the gradient-accumulation tutorial's
  `return loss / accumulate_step`): with `accumulate=k` the step already averages k micro-batches, so
  every update is 1/k of the big-batch update. A `PortingWarning`, not a refusal: what is found is a
  division of the returned loss by a constant or a global equal to k, which could in principle be a
  coincidence (a loss halved on purpose with accumulate=2); the warning names the line.
- **the network converted twice** (`auto_mixed_precision(net, "O2")` or `custom_mixed_precision`
  or `net.to_float(float16)` kept, and `precision=` given too): MindSpore's docs warn against
  converting twice, and mindstep's precision table would no longer say what runs in float16.
  Refused: keep one of the two.
"""
from __future__ import annotations

import ast
import functools
import inspect
import linecache
import os
import re
import sys
import textwrap
import types
import warnings

from mindspore import nn

from ._discover import _attr, _UNKNOWN, closure_values
from .precision import MARK

try:  # private: the Cells `auto_mixed_precision` (O2/O3) and `custom_mixed_precision` wrap a network in
    from mindspore.train.amp import _OutputTo16, _OutputTo32
    _AMP_WRAPPERS = (_OutputTo16, _OutputTo32)
except ImportError:  # pragma: no cover - depends on the MindSpore version
    _AMP_WRAPPERS = ()

_CONVERTERS = ("auto_mixed_precision", "custom_mixed_precision", "to_float")
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


class PortingWarning(UserWarning):
    """A step's forward keeps an idiom of a hand-written loop that the step already does (see
    `mindstep._porting`); the message names the line and the fix."""


def _where(file: str, line: int) -> str:
    text = linecache.getline(file, line).strip()
    return f"{file}:{line}" + (f" (`{text}`)" if text else "")


def check_scaler_calls(calls: list, who: str = "TrainStep", give: str = "TrainStep(..., loss_scale=loss_scaler)") -> None:
    """Refuse a forward that calls a `mindspore.amp` loss scaler's `scale`/`unscale` (`calls`: the
    `(file, line, method)` the step's code reading found, `mindstep._discover.Found.scaler_calls`)."""
    if not calls:
        return
    file, line, method = calls[0]
    raise ValueError(
        f"{who}: forward calls a mindspore.amp loss scaler's `{method}` at {_where(file, line)}. The step does "
        f"the loss scaling itself: it scales the loss, unscales the gradients, skips an update whose gradients "
        f"overflow and adjusts the scale. With the scaling also in forward, every update comes out multiplied "
        f"by the scaler's value. Remove the `{method}` call from forward (return the plain loss) and give the "
        f"scaler to the step instead: {give} trains as the tutorial's loop does.")


def _function(forward):
    """The Python function behind `forward` and the object bound as its `self` (or None)."""
    if isinstance(forward, functools.partial):
        return _function(forward.func)
    if isinstance(forward, types.MethodType):
        return forward.__func__, forward.__self__
    if isinstance(forward, types.FunctionType):
        return forward, None
    call = getattr(type(forward), "construct" if isinstance(forward, nn.Cell) else "__call__", None)
    return (call, forward) if isinstance(call, types.FunctionType) else (None, None)


def _parsed(fn):
    """(the `def` node of `fn`, its first line in the file); None where its source is not readable."""
    try:
        lines, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    return (node, max(start, 1)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _own_nodes(fn_node):
    """The nodes of a function's own body, not of the functions and classes defined inside it."""
    stack = list(fn_node.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _locals(fn_node) -> set:
    args = fn_node.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    for node in _own_nodes(fn_node):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _value(node, fn, self_obj, local: set):
    """What a divisor stands for, read without running anything: a constant, or the object a global,
    closure variable or attribute chain (`self.k`, `cfg.accumulate_step`) holds; `_UNKNOWN` for
    anything else (a local, a call, an arithmetic expression), which is what a token count or a batch
    size computed in forward is."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if self_obj is not None and node.id == _first_arg(fn):
            return self_obj
        if node.id in local:
            return _UNKNOWN
        return closure_values(fn).get(node.id, fn.__globals__.get(node.id, _UNKNOWN))
    if isinstance(node, ast.Attribute):
        owner = _value(node.value, fn, self_obj, local)
        return _UNKNOWN if owner is _UNKNOWN else _attr(owner, node.attr)
    return _UNKNOWN


def _first_arg(fn) -> str | None:
    names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    return names[0] if names else None


def _returned_losses(fn_node):
    """The expressions a function returns as its loss: a return value, or the first element of a
    returned tuple (`return loss, logits`)."""
    for node in _own_nodes(fn_node):
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value
            yield value.elts[0] if isinstance(value, ast.Tuple) and value.elts else value


def _divisions(fn_node, loss):
    """`(divisor node, line)` of the divisions that make the returned `loss`: `... / d` itself, or for a
    returned name, `name = ... / d` and `name /= d` in the function."""
    if isinstance(loss, ast.BinOp) and isinstance(loss.op, ast.Div):
        yield loss.right, loss.lineno
    if not isinstance(loss, ast.Name):
        return
    for node in _own_nodes(fn_node):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == loss.id for t in node.targets) \
                and isinstance(node.value, ast.BinOp) and isinstance(node.value.op, ast.Div):
            yield node.value.right, node.lineno
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div) and isinstance(node.target, ast.Name) \
                and node.target.id == loss.id:
            yield node.value, node.lineno


def check_predivided(forward, accumulate: int, who: str = "TrainStep") -> None:
    """Warn (`PortingWarning`) when `forward` returns its loss divided by a number equal to
    `accumulate` (> 1): a constant, a global or closure variable, or an attribute holding it."""
    if accumulate <= 1:
        return
    fn, self_obj = _function(forward)
    parsed = _parsed(fn) if fn is not None else None
    if parsed is None:
        return
    fn_node, start = parsed
    local = _locals(fn_node)
    for loss in _returned_losses(fn_node):
        for divisor, line in _divisions(fn_node, loss):
            value = _value(divisor, fn, self_obj, local)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or float(value) != float(accumulate):
                continue
            file, lineno = fn.__code__.co_filename, start + line - 1
            warnings.warn_explicit(
                f"{who}: forward divides its loss by `{ast.unparse(divisor)}` (= {value}) at {_where(file, lineno)}, "
                f"and the step accumulates accumulate={accumulate} micro-batches: it already averages their "
                f"gradients, so each update would be 1/{accumulate} of the big-batch update. Dividing by the "
                f"accumulation steps belongs to a hand-written accumulation loop; remove the division and return "
                f"the micro-batch's loss.", PortingWarning, file, lineno)
            return


def _conversion(cell) -> str | None:
    """How `cell` was put in lower precision before the step, as the call that did it; or None."""
    level = getattr(cell, "_amp_level", "")
    if level in ("O1", "O2", "O3", "auto"):
        return f"auto_mixed_precision(..., {level!r})"
    if _AMP_WRAPPERS and isinstance(cell, _AMP_WRAPPERS):
        return "auto_mixed_precision(...) or custom_mixed_precision(...)"
    if re.fullmatch(re.escape(type(cell).__name__) + r"_\d+", type(cell).__module__ or ""):
        return "custom_mixed_precision(...) (a network rewritten with casts)"
    flags = cell.get_flags()
    if flags.get("fp16") or flags.get("bf16"):
        return f"to_float({'float16' if flags.get('fp16') else 'bfloat16'})"
    return None


def _caller_file() -> str | None:
    """The file of the innermost frame outside mindstep: the user's script that builds the step."""
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)).startswith(_PACKAGE):
        frame = frame.f_back
    return None if frame is None else frame.f_code.co_filename


def _converter_lines(file: str | None) -> list:
    """The lines of `file` that call `auto_mixed_precision`, `custom_mixed_precision` or `to_float`."""
    try:
        tree = ast.parse("".join(linecache.getlines(file))) if file else None
    except SyntaxError:
        tree = None
    if tree is None:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in _CONVERTERS:
                found.append(node.lineno)
    return sorted(set(found))


def check_converted(nets, precision, who: str = "TrainStep") -> None:
    """Refuse `precision=` (a level or policy other than float32) for networks that were already
    converted to lower precision (`_conversion`), unless mindstep converted them itself."""
    for net in nets:
        own = getattr(net, MARK, None) is not None
        for name, cell in net.cells_and_names():
            how = _conversion(cell)
            if how is None or (own and how.startswith("to_float")):
                continue
            file = _caller_file()
            lines = _converter_lines(file)
            where = (f" (at {', '.join(_where(file, n) for n in lines[:3])})" if lines else "")
            part = f"its cell {name!r}" if name else "it"
            shown = type(getattr(net, "_backbone", net)).__name__  # an `_OutputTo32` shows what it wraps
            raise ValueError(
                f"{who}: precision={precision!r} converts the network {shown} to mixed precision, but "
                f"{part} was converted already by {how}{where}. MindSpore's docs warn against converting a network "
                f"twice, and the two conversions overlap. Keep one: remove your conversion and keep precision= "
                f"(mindstep.precision lists what each level runs in float16; keep_fp32= keeps cells in float32), or "
                f"keep your conversion and drop precision= (then pass loss_scale= yourself if it needs one).")

