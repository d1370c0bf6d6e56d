"""Which networks a training function uses, found by reading its code (nothing runs).

`TrainStep` must prepare the networks that `forward` trains (training mode, precision casts, the
composed-operator pass) before compiling. Users write `forward` in many shapes: a closure over
`net`, a module-level function using a *global* `net` (the README's own style), a method of a Cell
or of their own object (`self.net`), a function that calls helpers, a `functools.partial`. A
closure-only search missed globals, and a module-level script then trained BatchNorm in inference
mode and silently ignored `precision=`.

`find(fn)` follows what the code can reach, without calling it:

- the values a name load resolves to (`LOAD_GLOBAL`, `LOAD_DEREF`, a method's `self`, a parameter's
  default value), and attribute chains on them (`self.model.backbone`, `models.net`), read off the
  bytecode with `dis`; properties are not evaluated;
- recursively, the functions, bound methods, `functools.partial`s and callable objects it reaches,
  the code nested in it (inner functions, comprehensions), and the `construct` of user-defined
  Cells; the contents of lists, tuples and dicts it loads;
- never into MindSpore, numpy or the standard library.

What it cannot see (a network reached through a subscript with a computed key, `getattr(obj, name)`
with a variable name, a value created while the function runs) is what `TrainStep(nets=[...])` is
for; `TrainStep` cross-checks the result against the optimizer's parameters.
"""
from __future__ import annotations

import dis
import functools
import inspect
import sys
import types
import warnings
from dataclasses import dataclass, field

import mindspore as ms
from mindspore import amp, nn

from ._errors import bad_type

_UNKNOWN = object()
_LIBRARIES = {"mindspore", "numpy", "builtins"} | set(getattr(sys, "stdlib_module_names", ()))
_LOAD_NAME = {"LOAD_GLOBAL", "LOAD_NAME"}
_LOAD_DEREF = {"LOAD_DEREF", "LOAD_CLASSDEREF"}
_LOAD_FAST = {"LOAD_FAST", "LOAD_FAST_CHECK"}
_LOAD_ATTR = {"LOAD_ATTR", "LOAD_METHOD"}
_MAX_CONTAINER = 1000  # elements looked at per list/tuple/dict


@dataclass
class Found:
    """What `find` reached: Cells (outermost first found, none inside another), bare Parameters,
    and where the code reads `scale`/`unscale` of a `mindspore.amp` loss scaler (`(file, line,
    method)`: the loss-scaling idiom of MindSpore's mixed-precision tutorial, see `mindstep._porting`)."""

    cells: list = field(default_factory=list)
    parameters: list = field(default_factory=list)
    scaler_calls: list = field(default_factory=list)


def _library(obj) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.split(".")[0] in _LIBRARIES


def _attr(obj, name: str):
    """`getattr(obj, name)` without running a property; `_UNKNOWN` when it is not there."""
    if isinstance(obj, nn.Cell):  # sub-cells and Parameters live in these dicts, not __dict__
        for store in ("_cells", "_params"):
            values = obj.__dict__.get(store) or {}
            if name in values:
                return values[name]
    try:
        if isinstance(inspect.getattr_static(obj, name), property):
            return _UNKNOWN
        return getattr(obj, name)
    except Exception:  # noqa: BLE001 - any failing attribute is simply not followed
        return _UNKNOWN


_SCALER_METHODS = ("scale", "unscale")


def _line(ins, last: int) -> int:
    """The source line of a bytecode instruction (`positions` from Python 3.11, `starts_line` before)."""
    positions = getattr(ins, "positions", None)
    if positions is not None and positions.lineno is not None:
        return positions.lineno
    starts = getattr(ins, "starts_line", None)
    return starts if isinstance(starts, int) and not isinstance(starts, bool) else last


class _Walker:
    def __init__(self):
        self.cells: list = []
        self.parameters: list = []
        self.scaler_calls: list = []
        self._seen: set = set()

    def visit(self, value, depth: int = 0) -> None:
        if value is _UNKNOWN or value is None or depth > 20:
            return
        key = id(value)
        if key in self._seen:
            return
        self._seen.add(key)
        if isinstance(value, ms.Parameter):
            self.parameters.append(value)
        elif isinstance(value, nn.Cell):
            self.cells.append(value)
            construct = getattr(type(value), "construct", None)
            if isinstance(construct, types.FunctionType) and not _library(type(value)):
                self.code(construct, depth + 1, self_value=value)
        elif isinstance(value, types.MethodType):
            self.visit(value.__self__, depth + 1)
            if isinstance(value.__func__, types.FunctionType) and not _library(value.__func__):
                self.code(value.__func__, depth + 1, self_value=value.__self__)
        elif isinstance(value, types.FunctionType):
            if not _library(value):
                self.code(value, depth + 1)
        elif isinstance(value, functools.partial):
            for item in (value.func, *value.args, *value.keywords.values()):
                self.visit(item, depth + 1)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in list(value)[:_MAX_CONTAINER]:
                self.visit(item, depth + 1)
        elif isinstance(value, dict):
            for item in list(value.values())[:_MAX_CONTAINER]:
                self.visit(item, depth + 1)
        elif not isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType)) and not _library(type(value)):
            call = getattr(type(value), "__call__", None)  # a user object used as a function
            if isinstance(call, types.FunctionType):
                self.code(call, depth + 1, self_value=value)

    def code(self, fn: types.FunctionType, depth: int, self_value=_UNKNOWN) -> None:
        """Resolve the loads in `fn`'s code (and in the code nested in it), visiting each value."""
        code = fn.__code__
        derefs = closure_values(fn)
        locals_ = {}
        positional = code.co_varnames[:code.co_argcount]
        defaults = fn.__defaults__ or ()
        locals_.update(zip(positional[len(positional) - len(defaults):], defaults))
        locals_.update(fn.__kwdefaults__ or {})
        if self_value is not _UNKNOWN and positional:
            locals_[positional[0]] = self_value
        self._scan(code, fn.__globals__, derefs, locals_, depth)

    def _scan(self, code, globals_: dict, derefs: dict, locals_: dict, depth: int) -> None:
        key = ("code", id(code), id(locals_.get(code.co_varnames[0])) if code.co_varnames else 0)
        if key in self._seen:
            return
        self._seen.add(key)
        builtins = globals_.get("__builtins__", {})
        builtins = builtins if isinstance(builtins, dict) else vars(builtins)
        current = _UNKNOWN
        line = code.co_firstlineno
        for ins in dis.get_instructions(code):
            line = _line(ins, line)
            name = ins.argval if isinstance(ins.argval, str) else None
            if ins.opname in _LOAD_ATTR and name in _SCALER_METHODS and isinstance(current, amp.LossScaler):
                self.scaler_calls.append((code.co_filename, line, name))
            if ins.opname in _LOAD_NAME and name:
                current = globals_.get(name, builtins.get(name, _UNKNOWN))
            elif ins.opname in _LOAD_DEREF and name:
                current = derefs.get(name, _UNKNOWN)
            elif ins.opname in _LOAD_FAST and name:
                current = locals_.get(name, _UNKNOWN)
            elif ins.opname in _LOAD_ATTR and name:
                current = _attr(current, name) if current is not _UNKNOWN else _UNKNOWN
            else:
                current = _UNKNOWN
                continue
            self.visit(current, depth)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):  # nested functions and comprehensions
                self._scan(const, globals_, derefs, {}, depth + 1)


def closure_values(fn) -> dict:
    """The values of `fn`'s closure variables by name; an empty cell (a variable not assigned yet) is
    left out."""
    values = {}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            values[name] = cell.cell_contents
        except ValueError:  # an empty closure cell
            pass
    return values


def _outermost(cells: list) -> list:
    """Drop the Cells that are inside another found Cell (the outer one covers them)."""
    inner = set()
    for cell in cells:
        inner.update(id(c) for name, c in cell.cells_and_names() if name)
    return [c for c in cells if id(c) not in inner]


def find(fn) -> Found:
    """The Cells and bare Parameters that `fn` can reach, read off its code without running it.

    Args:
        fn: the user's forward: a function, a bound method, a `functools.partial`, a Cell or a
            callable object.

    Returns:
        A `Found` with the outermost Cells (a Cell inside another found one is left out) in the
        order they were reached, and the Parameters the code uses directly.

    Example:
        >>> net = nn.Dense(2, 1)
        >>> def forward(x):
        ...     return net(x).sum()
        >>> find(forward).cells == [net]
        True
    """
    walker = _Walker()
    walker.visit(fn)
    return Found(_outermost(walker.cells), walker.parameters, walker.scaler_calls)


class NetworkWarning(UserWarning):
    """Some of the optimizer's parameters belong to no network that `TrainStep` found."""


@dataclass
class Networks:
    """The networks a step trains, as `TrainStep` prepares them.

    `trained`: the Cells owning optimizer parameters (put in training mode, cast by `precision=`,
    rewritten by `optimize=`); `loss_cells`: Cells without parameters (the loss: computed in the
    output dtype); `cells`: every Cell found (a frozen teacher too, which is left as it is).
    """

    trained: list
    loss_cells: list
    cells: list
    scaler_calls: list = field(default_factory=list)  # `Found.scaler_calls`


def _shown(names: list, limit: int = 6) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(repr(n) for n in names[:limit]) + more


def check_nets(nets) -> list:
    """Validate `TrainStep(nets=...)`: one Cell or a non-empty list of Cells."""
    items = [nets] if isinstance(nets, nn.Cell) else nets
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(c, nn.Cell) for c in items):
        raise bad_type("nets", nets, "an nn.Cell or a non-empty list of the nn.Cells that forward trains",
                       "Pass the networks themselves, e.g. TrainStep(forward, opt, nets=[net]).")
    return list(items)


def resolve(forward, optimizer, nets=None, *, needs: list[str] = (), owners=()) -> Networks:
    """Find (or take, when `nets` is given) the networks `forward` trains, and check them against
    the optimizer's parameters.

    Optimizer parameters that no found Cell (nor `owners`, e.g. a learned loss weighting) owns, and
    that `forward` does not use directly, are orphans: their network would run in the wrong mode and
    precision. With orphans, the settings listed in `needs` (e.g. ``"precision='O2'"``) raise a
    ValueError, since they would silently not apply; otherwise a `NetworkWarning` names them.
    """
    found = find(forward)
    cells = check_nets(nets) if nets is not None else found.cells
    if nets is not None:  # the loss Cells (no parameters) still come from the code
        cells = cells + [c for c in found.cells if not c.trainable_params() and c not in cells]
    opt_ids = {id(p) for p in optimizer.parameters}
    owned = {id(p) for c in list(cells) + list(owners) for p in c.get_parameters()}
    owned.update(id(p) for p in found.parameters)
    orphans = [p.name for p in optimizer.parameters if id(p) not in owned]
    if orphans:
        where = ("the networks given in `nets=`" if nets is not None else
                 "the networks found in forward's code (its closure, the globals and attributes it "
                 "uses, the functions and methods it calls)")
        fix = ("Pass every network the optimizer trains, e.g. TrainStep(forward, opt, nets=[net]), so it is put "
               "in training mode (BatchNorm batch statistics, Dropout) and gets the precision settings.")
        what = (f"{len(orphans)} of the optimizer's {len(opt_ids)} parameters ({_shown(orphans)}) belong to none of "
                f"{where}" + ("" if cells else " (none was found)"))
        if needs:
            raise ValueError(f"TrainStep: {what}, but {' and '.join(needs)} need(s) those networks. {fix}")
        warnings.warn(f"TrainStep: {what}; they are trained as they are, in whatever mode their networks are. "
                      f"{fix}", NetworkWarning, stacklevel=3)
    trained = [c for c in cells if any(id(p) in opt_ids for p in c.trainable_params())]
    loss_cells = [c for c in cells if not c.trainable_params()]
    return Networks(trained, loss_cells, cells, found.scaler_calls)


def train_mode(nets) -> None:
    """Put the trained networks in training mode, if something (an evaluation) switched them off."""
    for net in nets:
        if not net.training:
            net.set_train(True)
