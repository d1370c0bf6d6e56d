"""MindSpore's execution context around a call: the mode it runs in, PyNative's queue and grad
state, and Python's collector around compiles.

The base that the step (`_compile`, `_graph`, `_debug`) and the operators (`optimize`, `_probe`)
both use; it imports nothing of mindstep.
"""
from __future__ import annotations

import contextlib
import gc

import mindspore as ms

try:  # private, ~30x cheaper than get_context("mode"), which every mode switch reads
    from mindspore.context import _get_mode as _current_mode
except ImportError:  # pragma: no cover - depends on the MindSpore version
    def _current_mode():
        return ms.get_context("mode")

try:  # private; see `reset_pynative_grad`, `sync_pynative`
    from mindspore.graph.api import _pynative_executor as _PYNATIVE
except ImportError:  # pragma: no cover - depends on the MindSpore version
    _PYNATIVE = None


def reset_pynative_grad() -> None:
    """Clear PyNative's grad state if a differentiated eager call left it set.

    Measured with MindSpore 2.10: when a function under `value_and_grad` raises in PyNative, the
    executor's grad flag stays set, and later optimizer calls in the same process silently do
    nothing (an `nn.AdamWeightDecay` step left every weight unchanged). `clear_res()` restores it.
    """
    if _PYNATIVE is not None and _PYNATIVE.grad_flag():
        _PYNATIVE.clear_res()


def sync_pynative() -> None:
    """Wait for every PyNative op queued so far; an op that failed raises here.

    MindSpore 2.10 runs PyNative ops asynchronously: a failing op (a reshape to a size its input
    does not have) can raise at a later op instead, even in the next, unrelated call (a probe of a
    forward that fails at batch 1, caught, then a good call at the whole batch raised the batch-1
    error in 61 of 200 tries). Callers that catch a failed call sync inside their `try`."""
    if _PYNATIVE is not None:
        _PYNATIVE.sync()


def drain_pynative() -> None:
    """After a failed PyNative call: wait for the ops still queued behind it and drop their errors
    (they belong to the call that failed), so the next call starts clean."""
    try:
        sync_pynative()
    except Exception:  # noqa: BLE001 - the failed call's own errors, already reported by its raise
        pass


@contextlib.contextmanager
def _in_mode(mode):
    previous = _current_mode()
    if previous == mode:
        yield
        return
    ms.set_context(mode=mode)
    try:
        yield
    finally:
        ms.set_context(mode=previous)


@contextlib.contextmanager
def gc_frozen():
    """Run the body with the objects that exist now moved out of Python's cycle collector
    (`gc.freeze`), restored after (`gc.unfreeze`), also on error; objects created inside are
    collected as usual.

    MindSpore 2.10 runs a full `gc.collect()` before compiling every Cell graph, which walks every
    object of the process, and the composed-operator pass compiles a probe graph per layer form
    (docs/design/measurements.md).
    A caller that has frozen objects itself (`gc.get_freeze_count() > 0`) is left as it is: an
    unfreeze would undo its own freeze too."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def graph_mode():
    """Run the body with `mode=GRAPH_MODE`, restoring the caller's mode after, also on error."""
    return _in_mode(ms.GRAPH_MODE)


def pynative_mode():
    """Run the body with `mode=PYNATIVE_MODE`, restoring the caller's mode after, also on error
    (forward hooks, which the shape probes use, fire only in PyNative)."""
    return _in_mode(ms.PYNATIVE_MODE)
