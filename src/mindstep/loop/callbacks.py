"""What `fit` calls while it trains, and the built-in callbacks.

The events, in the order they come (each a method of `Callback`; define the ones you need):

- ``on_start(loop)``: once, after a resume has loaded its checkpoint, before the first batch;
- ``on_step_end(loop, metrics)``: after every step call, with the step's metrics (Tensors: reading
  one with `float()` waits for the step, so read them only when you need them);
- ``on_log(loop, record)``: every `log_every` step calls, with the logged record (numbers);
- ``on_eval(loop, metrics)``: after each evaluation, with its metrics merged over the ranks (the
  one before training too, at `loop.done == 0`);
- ``on_save(loop, path)``: after each periodic checkpoint is complete;
- ``on_end(loop, summary)``: once, with the run's summary.

`loop` is the running `mindstep.loop.Loop`: `loop.step`, `loop.done` (step calls so far),
`loop.epoch`, `loop.out`, `loop.history` (every logged and evaluation record), and
`loop.request_stop(reason)`, which ends the run after the current event (it saves a final
checkpoint, evaluates and summarises as at a normal end; the summary's ``stopped`` says why).
A callback that keeps state across a resume returns it from `state_dict()` (JSON values) and takes
it back in `load_state_dict()`: `fit` stores it in each checkpoint's manifest.

A plain function `fn(event, loop, value)` is a callback too: it is called for every event with
its name (``"step_end"``, ``"log"``, ``"eval"``, ...) and the event's value (None for ``start``).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from .._errors import bad_type, check_choice, check_float, check_int


class Callback:
    """Base class: every event does nothing; override the ones you need."""

    def on_start(self, loop) -> None: ...

    def on_step_end(self, loop, metrics) -> None: ...

    def on_log(self, loop, record: dict) -> None: ...

    def on_eval(self, loop, metrics: dict) -> None: ...

    def on_save(self, loop, path) -> None: ...

    def on_end(self, loop, summary: dict) -> None: ...

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class FunctionCallback(Callback):
    """A function `fn(event, loop, value)` called for every event."""

    def __init__(self, fn):
        self.fn = fn

    def on_start(self, loop):
        self.fn("start", loop, None)

    def on_step_end(self, loop, metrics):
        self.fn("step_end", loop, metrics)

    def on_log(self, loop, record):
        self.fn("log", loop, record)

    def on_eval(self, loop, metrics):
        self.fn("eval", loop, metrics)

    def on_save(self, loop, path):
        self.fn("save", loop, path)

    def on_end(self, loop, summary):
        self.fn("end", loop, summary)


def as_callbacks(callbacks) -> list:
    if isinstance(callbacks, Callback) or callable(callbacks) and not isinstance(callbacks, (list, tuple)):
        callbacks = [callbacks]
    out = []
    for i, cb in enumerate(callbacks):
        if isinstance(cb, Callback):
            out.append(cb)
        elif callable(cb) and not isinstance(cb, type):
            out.append(FunctionCallback(cb))
        else:
            raise bad_type(f"callbacks[{i}]", cb, "a mindstep.loop.Callback instance or a function fn(event, loop, value)",
                           "Pass an instance, e.g. callbacks=[EarlyStopping('loss', patience=3)].")
    return out


class _Monitor(Callback):
    """Watches one evaluation metric for improvement (`mode` "min" or "max", by more than `min_delta`)."""

    def __init__(self, monitor: str, mode: str, min_delta: float):
        if not isinstance(monitor, str) or not monitor:
            raise bad_type("monitor", monitor, "the name of an evaluation metric, e.g. 'accuracy' or 'loss'",
                           "Pass the key your eval_fn returns.")
        self.monitor = monitor
        self.mode = check_choice("mode", mode, ("min", "max"), "Use 'min' for a loss, 'max' for an accuracy.")
        self.min_delta = check_float("min_delta", min_delta, low=0.0, fix="Pass a non-negative margin, e.g. 0.0.")
        self.best = None
        self.wait = 0

    def value(self, metrics: dict) -> float:
        if self.monitor not in metrics:
            raise ValueError(f"{type(self).__name__} monitors {self.monitor!r}, but the evaluation returned only "
                             f"{sorted(metrics)}; pass monitor= one of those")
        return float(metrics[self.monitor])

    def improved(self, value: float) -> bool:
        """Whether `value` beats the best so far (and record it); NaN never does."""
        if math.isnan(value):
            better = False
        elif self.best is None:
            better = True
        else:
            better = value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        if better:
            self.best, self.wait = value, 0
        else:
            self.wait += 1
        return better

    def state_dict(self) -> dict:
        return {"best": self.best, "wait": self.wait}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.wait = state.get("best"), int(state.get("wait", 0))


class EarlyStopping(_Monitor):
    """Stop when `monitor` has not improved (by more than `min_delta`) for `patience` evaluations
    in a row; the evaluation before training sets the first best.

    Example:
        `EarlyStopping("accuracy", patience=3, mode="max")`.
    """

    def __init__(self, monitor: str, patience: int = 3, mode: str = "min", min_delta: float = 0.0):
        super().__init__(monitor, mode, min_delta)
        self.patience = check_int("patience", patience, minimum=1, fix="Pass how many evaluations to wait, e.g. 3.")

    def on_eval(self, loop, metrics):
        if not self.improved(self.value(metrics)) and self.wait >= self.patience:
            loop.request_stop(f"EarlyStopping: {self.monitor} did not improve on {self.best:.6g} (mode {self.mode}, "
                              f"min_delta {self.min_delta}) for {self.wait} evaluations")


class ReduceLROnPlateau(_Monitor):
    """Multiply the learning rate by `factor` when `monitor` has not improved for `patience`
    evaluations, then wait `cooldown` evaluations; never below `min_factor` times the starting LR.
    It calls `step.scale_lr`, which writes the step's LR in place: no recompile.

    Example:
        `ReduceLROnPlateau("loss", factor=0.5, patience=2)`.
    """

    def __init__(self, monitor: str, factor: float = 0.1, patience: int = 2, mode: str = "min",
                 min_delta: float = 0.0, cooldown: int = 0, min_factor: float = 0.0):
        super().__init__(monitor, mode, min_delta)
        self.factor = check_float("factor", factor, low=0.0, high=1.0, low_open=True, high_open=True,
                                  fix="Pass a multiplier below 1, e.g. factor=0.1.")
        self.patience = check_int("patience", patience, minimum=1, fix="Pass how many evaluations to wait, e.g. 2.")
        self.cooldown = check_int("cooldown", cooldown, minimum=0, fix="Pass 0 or more evaluations.")
        self.min_factor = check_float("min_factor", min_factor, low=0.0, fix="Pass e.g. 1e-3 (or 0 for no floor).")
        self.cooling = 0
        self.total = 1.0  # the product of the factors applied so far
        self.reductions: list = []

    def on_eval(self, loop, metrics):
        improved = self.improved(self.value(metrics))
        if self.cooling:
            self.cooling -= 1
            self.wait = 0
            return
        if improved or self.wait < self.patience:
            return
        factor = max(self.factor, self.min_factor / self.total) if self.total > 0 else self.factor
        if factor >= 1.0 or self.total * factor < self.min_factor * (1 - 1e-9):
            return  # at the floor already
        loop.step.scale_lr(factor)
        self.total *= factor
        self.reductions.append({"batch": loop.done, "factor": self.total})
        self.wait, self.cooling = 0, self.cooldown

    def state_dict(self) -> dict:
        return {**super().state_dict(), "cooling": self.cooling, "total": self.total, "reductions": self.reductions}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.cooling, self.total = int(state.get("cooling", 0)), float(state.get("total", 1.0))
        self.reductions = list(state.get("reductions", []))


class BestCheckpoint(_Monitor):
    """Keep the `k` best checkpoints by `monitor` in `<out>/<folder>` (default ``best``), beside
    the periodic ones: each evaluation after training has started that ranks among the best `k` is
    saved (atomically, `mindstep.checkpoint.save`, its metric in the manifest's ``extra``), and the
    one it pushes out is removed after the new one is complete. `best_path()` is the best one's path.

    Example:
        `BestCheckpoint("accuracy", k=2, mode="max")`; then `step.load(cb.best_path())`.
    """

    def __init__(self, monitor: str, k: int = 1, mode: str = "min", folder: str = "best"):
        super().__init__(monitor, mode, 0.0)
        self.k = check_int("k", k, minimum=1, fix="Pass how many best checkpoints to keep, e.g. k=3.")
        if not isinstance(folder, str) or not folder:
            raise bad_type("folder", folder, "a folder name inside fit's out", "Pass e.g. folder='best'.")
        self.folder = folder
        self.kept: list = []  # [(value, path)], best first

    def _dir(self, loop) -> Path:
        if loop.out is None:
            raise ValueError("BestCheckpoint needs fit(..., out=FOLDER) to write its checkpoints in; pass out=")
        return Path(loop.out) / self.folder

    def on_eval(self, loop, metrics):
        value = self.value(metrics)
        if loop.done == 0 or math.isnan(value):
            return
        if (value, None) not in self._ranked([(value, None)])[:self.k]:
            return
        path = self._dir(loop) / f"batch-{loop.done:07d}.ckpt"
        loop.step.save(path, extra={**loop.position(), "monitor": self.monitor, "value": value})  # rank 0 writes
        self.kept = self._ranked([(value, str(path))])
        from .. import checkpoint
        from ..dist import context

        if context.is_main():
            for _, old in self.kept[self.k:]:
                checkpoint.remove(old)
        self.kept = self.kept[:self.k]

    def _ranked(self, new: list) -> list:
        """The kept checkpoints and `new` [(value, path)], best first."""
        return sorted(self.kept + new, key=lambda vp: vp[0], reverse=self.mode == "max")

    def on_start(self, loop):
        """A resumed run drops the best checkpoints saved after the one it resumes from (their
        evaluations are trained again)."""
        from ..dist import context

        folder = Path(loop.out) / self.folder if loop.out is not None else None
        if folder is None or not folder.is_dir() or not context.is_main():
            return
        from .. import checkpoint

        kept = {os.path.basename(p) for _, p in self.kept}
        for manifest in folder.glob("batch-*.ckpt" + checkpoint.MANIFEST_SUFFIX):
            payload = manifest.with_name(manifest.name[:-len(checkpoint.MANIFEST_SUFFIX)])
            if payload.name not in kept:
                checkpoint.remove(payload)

    def best_path(self):
        """The path of the best checkpoint kept, or None."""
        return self.kept[0][1] if self.kept else None

    def state_dict(self) -> dict:
        return {"kept": [list(vp) for vp in self.kept]}

    def load_state_dict(self, state: dict) -> None:
        self.kept = [(float(v), p) for v, p in state.get("kept", []) if os.path.exists(p)]
