"""How the step graph is run: eagerly, as a GRAPH_MODE Cell, or as an `ms.jit` function.

Three runners share one interface (`runner(*tensors) -> outputs`, `runner.compile_count`):

- ``"eager"``: the step Cell's `construct` runs op by op in PyNative (`TrainStep(jit=False)`).
- ``"cell"`` (the default for `jit=True`): the step Cell is called with the context switched to
  GRAPH_MODE for the duration of the call, then switched back. Measured on this project's CPU
  machines (see README "Why a GRAPH_MODE Cell"), this runs a small MLP step ~5x faster than
  `ms.jit(fn)` and a conv step ~1.2-1.6x faster, and it sees weights written from the host
  (`set_data`, `load_param_into_net`) while a plain `ms.jit` function keeps stale copies.
  After the first call of an input signature, its compiled graph is run directly
  (`_run_compiled`), without `Cell.__call__`'s per-call lookup and the mode switch.
- ``"function"``: `ms.jit(cell.construct)`, for users who want MindSpore's function-level jit.

Compiles are counted from MindSpore's own caches (the Cell's `compile_cache` phases, or the
global `ms_compile_cache` for `ms.jit`); both are private, so if a future MindSpore drops them the
count falls back to the number of distinct input signatures seen.
"""
from __future__ import annotations

import contextlib
import itertools
import logging

import mindspore as ms
import numpy as np

from ._context import drain_pynative, gc_frozen, graph_mode, pynative_mode, reset_pynative_grad
from ._errors import bad_type, bad_value

logger = logging.getLogger("mindstep")

COMPILERS = ("cell", "function")
_JIT_FUNCTIONS = itertools.count()  # numbers each `ms.jit` step function (see `Runner._jit_function`)

try:  # private, but the only exact record of what MindSpore compiled
    from mindspore.graph.api import ms_compile_cache as _MS_COMPILE_CACHE
except ImportError:  # pragma: no cover - depends on the MindSpore version
    _MS_COMPILE_CACHE = None

try:  # private; see `_run_compiled`
    from mindspore.graph.api import _cell_graph_executor as _CELL_EXECUTOR
    from mindspore.nn.cell import _DEFAULT_JIT_CONFIG
except ImportError:  # pragma: no cover - depends on the MindSpore version
    _CELL_EXECUTOR = None
if _CELL_EXECUTOR is not None and not (  # pragma: no cover - depends on the MindSpore version
        all(hasattr(_CELL_EXECUTOR, name) for name in ("_exec_pip", "has_compiled"))
        and all(hasattr(getattr(_CELL_EXECUTOR, "_graph_executor", None), name)
                for name in ("get_args_for_run", "set_jit_config"))):
    _CELL_EXECUTOR = None  # this MindSpore runs its graphs otherwise: every call takes `Cell.__call__`


def _eager(cell, tensors):
    """Run `cell.construct` in PyNative, whatever the caller's mode (under a global GRAPH_MODE the
    sub-Cells it calls would compile themselves instead of running eagerly; the step's grad function
    is built in PyNative for the same reason, see `_graph.StepGraph`); after an exception, reset
    PyNative's grad state and drop the errors of the ops still queued behind the one that raised."""
    try:
        with pynative_mode():
            return cell.construct(*tensors)
    except BaseException:
        drain_pynative()
        reset_pynative_grad()
        raise


def to_tensor(index: int, value):
    """Convert one batch element to a Tensor so no Python value is baked into the graph.

    Python floats become float32 and ints int32 scalars (as tensors they are graph *inputs*: a new
    value does not recompile, unlike a Python scalar argument). numpy arrays keep their dtype.
    """
    if isinstance(value, ms.Tensor):
        if value.size == 0:
            raise bad_value(f"batch[{index}]", value, "a non-empty tensor",
                            f"Its shape {tuple(value.shape)} has no elements: skip empty batches before calling the step.")
        return value
    if isinstance(value, bool):
        return ms.Tensor(value, ms.bool_)
    if isinstance(value, int):
        return ms.Tensor(value, ms.int32)
    if isinstance(value, float):
        return ms.Tensor(value, ms.float32)
    if isinstance(value, (np.ndarray, np.generic)):
        value = np.asarray(value)
        if value.dtype.kind not in "biuf":
            raise bad_type(f"batch[{index}]", value, "a numeric or bool array (dtype bool, int, uint or float)",
                           f"Its dtype is {value.dtype}: convert strings to ids and pad ragged sequences to one "
                           "length (e.g. np.stack of equal-length arrays) before the step.")
        if value.size == 0:
            raise bad_value(f"batch[{index}]", value, "a non-empty array",
                            f"Its shape {value.shape} has no elements: skip empty batches before calling the step.")
        return ms.Tensor(value)
    raise bad_type(
        f"batch[{index}]", value, "a mindspore.Tensor, a numpy array or a Python bool/int/float",
        "Pass tensors (e.g. from a `mindspore.dataset` iterator); put other settings into the "
        "forward function's closure, where they are fixed at compile time.")


def signature(tensors) -> tuple:
    return tuple((tuple(t.shape), str(t.dtype)) for t in tensors)


def _changes(old: tuple, new: tuple) -> list:
    """`(kind, what)` for each difference between two input signatures; kinds: count, rank, shape, dtype."""
    if len(old) != len(new):
        return [("count", f"the number of batch elements changed from {len(old)} to {len(new)}")]
    out = []
    for i, ((os_, od), (ns, nd)) in enumerate(zip(old, new)):
        if len(os_) != len(ns):
            out.append(("rank", f"batch[{i}] rank {len(ns)} (was {len(os_)}: shape {ns}, was {os_})"))
        elif os_ != ns:
            out.append(("shape", f"batch[{i}] shape {ns} (was {os_})"))
        if od != nd:
            out.append(("dtype", f"batch[{i}] dtype {nd} (was {od})"))
    return out


def describe_change(old: tuple, new: tuple) -> str:
    return ", ".join(what for _, what in _changes(old, new)) or "no visible change in shapes or dtypes"


# what to do about a recompile, by what changed in the batch
_ADVICE = {
    "count": "Call the step with the same batch elements every time.",
    "rank": "A dimension appeared or went away: check the data pipeline (a missing .batch(), a squeeze, an "
            "unbatched sample); each rank compiles its own graph.",
    "dtype": "Give each batch element one dtype every call (numpy's default float64 and Python floats are the "
             "usual cause: x.astype(np.float32)); each dtype compiles its own graph.",
    "shape": "Each distinct shape compiles once; pad or bucket batches to keep shapes fixed "
             "(dataset.batch(n, drop_remainder=True) drops a smaller last batch).",
}


def change_advice(old: tuple, new: tuple) -> str:
    """What to do about a recompile from input signature `old` to `new`, for each kind of change."""
    kinds = {kind for kind, _ in _changes(old, new)}
    return " ".join(_ADVICE[k] for k in ("count", "rank", "dtype", "shape") if k in kinds)


def _reason(error: BaseException) -> str:
    """MindSpore's own one-line reason: the first line of its message that is text, not a frame."""
    lines = [line.strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line and not line.startswith(("-", "#", "In file", "The Traceback",
                                                                     "mindspore/", "C++ Call Stack"))]
    if not lines:
        return type(error).__name__
    reason = lines[0] + (" " + lines[1] if lines[0].endswith(":") and len(lines) > 1 else "")
    return reason[:400]


def _shown(sig: tuple) -> str:
    return ", ".join(f"batch[{i}] {dtype} {shape}" for i, (shape, dtype) in enumerate(sig))


def _own(error: BaseException) -> str | None:
    """The message of one of mindstep's own checks that ran while MindSpore compiled the step (see
    `mindstep._graph.OWN_ERRORS`), or None for MindSpore's own errors."""
    from ._graph import OWN_ERRORS

    for line in str(error).splitlines():
        line = line.strip().strip("'\"")  # a graph compile quotes the message
        if line.startswith(OWN_ERRORS):
            return line
    return None


def step_failure(error: BaseException, compiled: list, tensors, who: str = "TrainStep") -> BaseException:
    """A TypeError/ValueError for a step that MindSpore could not compile or run on this batch: what
    it got, what it was compiled for, the one-line reason and the fix (no C++ trace). A reason from
    mindstep's own checks (what forward returned) is given as it is; MindSpore's is labelled so."""
    sig = signature(tensors)
    own = _own(error)
    if own is not None:
        text = f"{who}: {own} (batch: {_shown(sig)})"
    elif compiled and sig not in compiled:
        change = describe_change(compiled[0], sig)
        text = (f"{who}: the step first ran on {_shown(compiled[0])} and got {_shown(sig)} ({change}); "
                f"it cannot run on it. MindSpore: {_reason(error)} Pass batches like the first one; a new shape that "
                "forward accepts (a smaller last batch, another length) recompiles once.")
    else:
        text = (f"{who}: the step failed on {_shown(sig)}. MindSpore: {_reason(error)} Check that forward(*batch) "
                f"takes these inputs; {who}(..., jit=False) runs it eagerly and shows the Python line.")
    new = (TypeError if isinstance(error, TypeError) else ValueError)(text)
    new.mindspore_error = error  # the original, C++ trace included, for whoever needs it
    return new


def _compiled_phase(cell):
    """The phase MindSpore compiled `cell`'s last call under, or None where this MindSpore keeps it
    elsewhere (then every call takes `Cell.__call__`)."""
    phase = getattr(cell, "current_phase", None)
    if _CELL_EXECUTOR is None or not isinstance(phase, str) or not _CELL_EXECUTOR.has_compiled(phase):
        return None
    return phase


def _run_compiled(cell, phase: str, tensors):
    """Run the graph MindSpore already compiled for these inputs' signature, as `Cell.__call__`
    does after its compile-cache lookup, without the lookup.

    MindSpore 2.10's `Cell.__call__` under GRAPH_MODE looks its compiled graph up on every call:
    it binds and checks the arguments against `construct`'s signature (`inspect.signature`),
    re-keys them and sets the phase on every sub-Cell through `Cell.__setattr__`: a fifth of a small
    step's time (docs/design/measurements.md). The key depends only on the inputs'
    shapes and dtypes (the step passes every batch element as a tensor, `to_tensor`), which the
    runner records per compiled phase; a phase MindSpore no longer holds goes the slow way."""
    args = _CELL_EXECUTOR._graph_executor.get_args_for_run(
        cell, tensors, {}, list(getattr(cell, "_has_mutable_args_list", None) or []), [], False, False)
    _CELL_EXECUTOR._graph_executor.set_jit_config(getattr(cell, "jit_config_dict", None) or _DEFAULT_JIT_CONFIG)
    return _CELL_EXECUTOR._exec_pip(cell, *args, phase=phase)


class Runner:
    """Runs the step Cell and counts compiles; warns once per new input signature."""

    def __init__(self, cell: ms.nn.Cell, *, jit: bool, compiler: str, name: str, watch=(), guards: bool = True):
        self.cell = cell
        self.jit = jit
        self.compiler = compiler if jit else "eager"
        self.name = name
        self.compile_count = 0
        self.resyncs = 0
        self._signatures: list[tuple] = []
        self._fn = self._jit_function() if self.compiler == "function" else None
        # Only an `ms.jit` function keeps stale copies of host-written weights (the GRAPH_MODE cell
        # and PyNative read the live ones), so only that compiler needs the write guard.
        self._watch = list(watch) if (guards and self.compiler == "function") else []
        self._ptrs = None
        self._phases: dict[tuple, str] = {}  # "cell": the compiled phase of each input signature

    @property
    def signatures(self) -> list:
        """The input signatures this runner has run, in order."""
        return list(self._signatures)

    def _cache_size(self) -> int | None:
        if self.compiler == "cell":
            return len(self.cell.compile_cache)
        if self.compiler == "function" and _MS_COMPILE_CACHE is not None:
            return len(_MS_COMPILE_CACHE)
        return None

    def _jit_function(self):
        """A fresh `ms.jit` function around the step Cell.

        It wraps a new closure rather than `cell.construct`: MindSpore caches a compiled bound method
        under the Cell's identity, so re-wrapping `cell.construct` would reuse the stale graph, while a
        new function compiles anew and picks up the current weights.
        """
        cell = self.cell

        def step_graph(*tensors):
            return cell(*tensors)

        # MindSpore keys a jit function by its name, file and line, and warns "has been compiled again"
        # when a second function object of the same key compiles (every step with compiler="function"
        # after the first, an accumulating step's update graph, a re-sync): a name of its own each
        step_graph.__name__ = step_graph.__qualname__ = f"{self.name}_step_graph_{next(_JIT_FUNCTIONS)}"
        return ms.jit(step_graph)

    def _host_writes(self) -> list:
        """Parameters whose buffer was replaced from the host (set_data, load_param_into_net) since the last call."""
        if self._ptrs is None:
            return []
        return [p.name for p, ptr in zip(self._watch, self._ptrs) if p.data_ptr() != ptr]

    def __call__(self, *tensors):
        written = self._host_writes() if self._watch else []
        if written:
            shown = ", ".join(written[:5]) + (f" and {len(written) - 5} more" if len(written) > 5 else "")
            logger.warning("%s: weights were written from the host after the step was compiled (%s); an ms.jit "
                           "function would keep using its stale copy, so the step is re-synced (recompiled once).",
                           self.name, shown)
            self._fn = self._jit_function()
            self.resyncs += 1
        out, _ = self._counted(tensors, self._run, written=bool(written))
        if self._watch:
            self._ptrs = [p.data_ptr() for p in self._watch]
        return out

    def _run(self, tensors, sig):
        if self.compiler == "eager":
            return _eager(self.cell, tensors)
        if self.compiler == "function":
            return self._fn(*tensors)
        phase = self._phases.get(sig)
        if phase is not None and _CELL_EXECUTOR.has_compiled(phase):
            return _run_compiled(self.cell, phase, tensors)
        with graph_mode():
            out = self.cell(*tensors)
        phase = _compiled_phase(self.cell)
        if phase is not None:
            self._phases[sig] = phase
        return out

    def compile(self, *tensors) -> int:
        """Compile the step for these inputs without running it (`Cell.compile`; the GRAPH_MODE
        Cell compiler only, which `TrainStep.compile` checks): the next call with inputs of the same
        shapes and dtypes only executes. Returns how many graphs it compiled (0: compiled already)."""
        def build(tensors, _sig):
            with graph_mode():
                self.cell.compile(*tensors)

        return self._counted(tensors, build)[1]

    def _counted(self, tensors, run, written: bool = False):
        """`run(tensors)` with the compiles it made counted (and a recompile reported, unless the step
        was re-synced after a host write): (its result, the number of graphs compiled)."""
        sig = signature(tensors)
        new_sig = sig not in self._signatures
        before = self._cache_size()
        # a new signature compiles: MindSpore walks every object of the process with a full
        # `gc.collect()` before compiling a Cell's graph (~0.08 s with a small network built, more in
        # a process holding a dataset); frozen objects are left out of that walk
        with gc_frozen() if new_sig and self.jit else contextlib.nullcontext():
            out = run(tensors, sig)
        after = self._cache_size()
        compiled = (after - before) if before is not None else int(new_sig and self.jit)
        if new_sig:
            self._signatures.append(sig)
        self._report(sig, new_sig, 0 if written else compiled)
        self.compile_count += compiled
        return out, compiled

    def _report(self, sig: tuple, new_sig: bool, compiled: int) -> None:
        if not compiled or self.compile_count == 0:
            return
        if new_sig:
            old = self._signatures[-2]
            logger.warning("%s: recompiling the training step (compile #%d) for a new input signature: %s. %s",
                           self.name, self.compile_count + compiled, describe_change(old, sig),
                           change_advice(old, sig))
        else:
            logger.warning("%s: the training step recompiled (compile #%d) with an input signature it had "
                           "already compiled; a Python value captured by the step has probably changed.",
                           self.name, self.compile_count + compiled)
