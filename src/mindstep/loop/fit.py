"""`mindstep.fit`: the training loop `mindstep train` runs, as a function over your own step and data."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from .. import checkpoint as _checkpoint
from .._errors import bad_type, bad_value, check_int
from ..dist import context as _dist
from . import callbacks as _callbacks
from . import data as _data
from . import evaluate as _evaluate
from . import faults as _faults
from . import loggers as _loggers
from .progress import Progress

RESUME = (False, True, "auto")


class Loop:
    """The running loop, as callbacks see it (`mindstep.loop.callbacks`)."""

    def __init__(self, step, out, on_save_error: str = "raise"):
        self.step, self.out = step, None if out is None else str(out)
        self.done = 0          # step calls so far
        self.epoch = 0         # the epoch of the next batch
        self.index = 0         # the index of the next batch inside its epoch (this rank's count)
        self.history: list = []
        self.stopped: str | None = None
        self.initial: dict | None = None
        self.on_save_error = on_save_error

    def request_stop(self, reason: str = "a callback asked to stop") -> None:
        """End the run after the current event (it still saves, evaluates and summarises)."""
        self.stopped = self.stopped or str(reason)

    def position(self) -> dict:
        """Where the next batch is, as a checkpoint records it."""
        return {"done": self.done, "epoch": self.epoch, "index": self.index}


def fit(step, train_data, *, steps: int | None = None, epochs: int | None = None, eval_data=None, eval_fn=None,
        eval_every: int | None = None, out=None, save_every: int | None = None, keep: int = 3, resume=False,
        callbacks=(), loggers=(), log_every: int = 20, progress: bool = True, config: dict | None = None,
        stop_signals=_faults.DEFAULT_SIGNALS, on_signal: str = "exit", on_save_error: str = "raise") -> dict:
    """Train `step` on `train_data`: log, evaluate, checkpoint, resume, call back, summarise.

    Args:
        step: a `mindstep.TrainStep` or `mindstep.GANStep`.
        train_data: a `mindspore.dataset` pipeline, a re-iterable of batches (tuples of arrays or
            Tensors, the step's inputs), or a callable `epoch -> batches`; see `mindstep.loop.data`
            for how each is sharded under data parallel and resumed at the exact batch.
        steps: train this many step calls (batches), epoch after epoch; or
        epochs: train this many passes over `train_data` (exactly one of the two).
        eval_data: what `eval_fn` evaluates on (any kind `train_data` takes; sharded the same way).
        eval_fn: `eval_fn(step, eval_data) -> {name: value}` (e.g.
            `mindstep.loop.classification()`), run before the first update (reported as
            ``<name>_initial``), every `eval_every` step calls, and at the end; with the EMA weights
            when the step keeps them; merged over the ranks (`mindstep.loop.Mean`).
        eval_every: evaluate every this many step calls (None: before and at the end only).
        out: the run's folder: ``ckpt/batch-<N>.ckpt`` (N = step calls done), ``metrics.jsonl``,
            ``metrics.csv`` and what the loggers write. None: no files (and no resume).
        save_every: checkpoint every this many step calls (and at the end); None: at the end only.
            Needs `out`. Each checkpoint records the data position and the callbacks' state.
        keep: periodic checkpoints kept (the newest).
        resume: True continues from the newest complete checkpoint in ``out/ckpt`` (an error when
            there is none), ``"auto"`` when there is one, False starts over (and overwrites);
            `MINDSTEP_RESUME=1` in the environment (set by the restarts) makes False "auto".
        callbacks: `mindstep.loop.Callback` instances or functions `fn(event, loop, value)`.
        loggers: trackers beyond the JSONL and CSV files: `mindstep.loop.TensorBoardLogger()`,
            `MLflowLogger()` or their names ``"tensorboard"``, ``"mlflow"``; rank 0 only.
        log_every: log (and update the bar) every this many step calls: the loss is read from the
            device only then, so the loop does not wait for each step.
        progress: a progress bar on rank 0.
        config: what the loggers record as the run's config (default: the step's settings).
        stop_signals: the signals that stop the run cleanly after the current step, with a
            checkpoint (`mindstep.loop.faults`); add e.g. `signal.SIGUSR1`; () handles none.
        on_signal: ``"exit"`` (after the save: exit 75 for SIGTERM and added signals, the launcher's
            restarts continue the job; 130 for SIGINT) or ``"return"`` (return the summary, whose
            ``stopped`` names the signal).
        on_save_error: ``"raise"`` (a failed save raises `CheckpointError` naming the path; the
            previous checkpoint stays the newest) or ``"warn"`` (warn, keep training, try again at
            the next save).

    Returns:
        The summary: ``steps`` done, ``epochs`` begun, ``resumed_from``, ``samples_per_s`` (median
        of the logs), ``data_wait_share``, ``final_loss``, ``checkpoint`` (the last one),
        ``stopped`` (why a callback stopped the run, or None) and ``eval`` (the initial and last
        evaluation).

    Example:
        >>> import numpy as np, mindstep
        >>> from mindspore import nn
        >>> net = nn.Dense(4, 2)
        >>> step = mindstep.TrainStep.from_net(net, nn.CrossEntropyLoss(), nn.SGD(net.trainable_params(), 0.1))
        >>> data = [(np.ones((8, 4), np.float32), np.zeros(8, np.int32))] * 5
        >>> fit(step, data, epochs=2, progress=False)["steps"]
        10
    """
    resume = _faults.resume_mode(resume)
    _check(step, train_data, steps, epochs, eval_data, eval_fn, eval_every, out, save_every, keep, resume, log_every,
           on_signal, on_save_error)
    world = _dist.world_size()
    source = _data.Source(train_data, rank=_dist.rank(), world=world)
    cbs = _callbacks.as_callbacks(callbacks)
    loop = Loop(step, out, on_save_error)
    resumed = _resume(loop, cbs, resume, source)
    logs = _open_loggers(loop, loggers, resumed, config, _dist.is_main())
    with _faults.StopSignals(stop_signals) as signals:
        summary = _run(loop, source, cbs, logs, _evaluator(step, eval_fn, eval_data, world), signals, resumed,
                       dict(steps=steps, epochs=epochs, eval_every=eval_every, save_every=save_every, keep=keep,
                            log_every=log_every, progress=progress and _dist.is_main()))
    if signals.agreed is not None:
        _faults.StopSignals.barrier(world)  # no rank leaves before rank 0's checkpoint is complete
        if on_signal == "exit":
            raise SystemExit(_faults.exit_code(signals.agreed))
    return summary


def _run(loop, source, cbs, logs, evaluate, signals, resumed, settings) -> dict:
    """Train, summarise, tell the callbacks and loggers; the data and the loggers closed whatever happens."""
    try:
        trained = _train(loop, source, cbs, logs, evaluate, signals, **settings)
        summary = _summary(loop, trained, resumed)
        for cb in cbs:
            cb.on_end(loop, summary)
        for lg in logs:
            lg.log_summary(summary)
        return summary
    finally:
        source.close()
        for lg in logs:
            lg.close()


def _check(step, train_data, steps, epochs, eval_data, eval_fn, eval_every, out, save_every, keep, resume, log_every,
           on_signal, on_save_error):
    """Every argument, on the host, before anything runs."""
    for name, value, valid in (("on_signal", on_signal, ("exit", "return")),
                               ("on_save_error", on_save_error, ("raise", "warn"))):
        if value not in valid:
            raise bad_value(name, value, " or ".join(repr(v) for v in valid), f"Pass {name}={valid[0]!r}.")
    if not (callable(step) and hasattr(step, "save") and hasattr(step, "graph")):
        raise bad_type("step", step, "a mindstep.TrainStep or mindstep.GANStep",
                       "Build one, e.g. step = mindstep.TrainStep.from_net(net, loss_fn, optimizer).")
    if (steps is None) == (epochs is None):
        raise bad_value("steps/epochs", (steps, epochs), "exactly one of the two",
                        "Pass steps=N (step calls, epoch after epoch) or epochs=N (passes over train_data).")
    for name, value in (("steps", steps), ("epochs", epochs), ("eval_every", eval_every), ("save_every", save_every)):
        if value is not None:
            check_int(name, value, minimum=1, fix=f"Pass a positive number, or leave {name} out.")
    check_int("keep", keep, minimum=1, fix="Pass how many checkpoints to keep, e.g. keep=3.")
    check_int("log_every", log_every, minimum=1, fix="Pass e.g. log_every=20.")
    if eval_fn is not None and not callable(eval_fn):
        raise bad_type("eval_fn", eval_fn, "a function eval_fn(step, eval_data) -> {name: value}",
                       "Example: eval_fn=mindstep.loop.classification().")
    if eval_data is not None and eval_fn is None:
        raise bad_value("eval_fn", None, "a function when eval_data is given",
                        "Pass eval_fn=mindstep.loop.classification() (or loss()), or your own eval_fn(step, eval_data).")
    if eval_every is not None and eval_fn is None:
        raise bad_value("eval_fn", None, "a function when eval_every is given", "Pass eval_fn= or leave eval_every out.")
    if resume not in RESUME or not isinstance(resume, (bool, str)):
        raise bad_value("resume", resume, "False, True or 'auto'",
                        "True resumes from out/ckpt (an error when empty), 'auto' when a checkpoint exists.")
    if out is None and (save_every is not None or resume):
        raise bad_value("out", None, "a folder when save_every or resume is set",
                        "Pass out='runs/my-run': the checkpoints and logs go there.")
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise bad_type("out", out, "a folder path", "Example: out='runs/my-run'.")


def _ckpt_dir(loop) -> Path:
    return Path(loop.out) / "ckpt"


def _resume(loop, cbs, resume, source) -> int | None:
    """Load the newest complete checkpoint (resume True or "auto" with one); returns the step calls
    it had done, or None when the run starts over."""
    if not resume:
        return None
    path = _checkpoint.latest(_ckpt_dir(loop))
    if path is None:
        if resume == "auto":
            return None
        raise ValueError(f"resume=True: no complete checkpoint in {_ckpt_dir(loop)}; pass resume='auto' to start "
                         "when there is none, or resume=False")
    saved = (_checkpoint.read_manifest(path, verify=False).get("extra") or {}).get("loop")  # latest() verified it
    if saved is None:
        raise ValueError(f"{path} was not written by mindstep.fit (its manifest has no loop position); resume from a "
                         "checkpoint of fit's out/ckpt, or load it with step.load() and start fit without resume")
    world = _dist.world_size()
    if int(saved.get("world", 1)) != world:
        _elastic_position(loop, saved, path, source, world)
    else:
        loop.step.load(path)
        loop.done, loop.epoch, loop.index = int(saved["done"]), int(saved["epoch"]), int(saved["index"])
    loop.initial = saved.get("initial")
    states = saved.get("callbacks", [])
    if len(states) != len(cbs) or any(s["type"] != type(cb).__name__ for s, cb in zip(states, cbs)):
        raise ValueError(f"{path} was saved with the callbacks {[s['type'] for s in states]}, but this run has "
                         f"{[type(cb).__name__ for cb in cbs]}; pass the same callbacks to resume")
    for state, cb in zip(states, cbs):
        cb.load_state_dict(state["state"])
    if _dist.is_main():
        print(f"mindstep.fit: resuming from {path}: {loop.done} batches done (epoch {loop.epoch}, "
              f"batch {loop.index} of it)", flush=True)
    return loop.done


def _elastic_position(loop, saved: dict, path, source, world: int) -> None:
    """Resume a checkpoint written by another number of ranks: the same global batch per update
    (ranks x accumulate), and the next batch the same one, with the batches dealt rank r = batch r
    of every W (what fit does with every kind but a sharded Dataset, whose sample order depends on
    the number of shards)."""
    old_world, old_acc = int(saved.get("world", 1)), int(saved.get("accumulate", 1))
    acc = int(getattr(loop.step, "accumulate", 1))
    if old_world * old_acc != world * acc:
        fix = (f"build the step with accumulate={old_world * old_acc // world}" if old_world * old_acc % world == 0
               else f"use a number of ranks that divides {old_world * old_acc}")
        raise ValueError(f"{path} was written by {old_world} rank(s) with accumulate={old_acc}: {old_world * old_acc} "
                         f"batches per update. On {world} rank(s) with accumulate={acc} an update would take "
                         f"{world * acc}: {fix} to keep the global batch")
    kind = source.kind
    if kind == "callable" and _data.is_dataset(source.data(int(saved["epoch"]))):
        kind = "dataset"
    if kind == "dataset":
        raise ValueError(f"{path} was written by {old_world} rank(s) and this job has {world}: a sharded "
                         "mindspore Dataset orders its samples by the number of shards, so its position cannot be "
                         "carried over; resume on the same number of ranks, or give fit a sequence or a callable "
                         "returning batches, which it deals to the ranks itself")
    consumed = int(saved["index"]) * old_world  # batches of the epoch that all ranks have taken
    if consumed % world or int(saved["done"]) * old_world % world:
        raise ValueError(f"{path}: {consumed} batches of epoch {saved['epoch']} cannot be split over {world} ranks; "
                         "resume from a checkpoint at a multiple of the ranks")
    loop.step.load(path, elastic=True)
    loop.done, loop.epoch, loop.index = int(saved["done"]) * old_world // world, int(saved["epoch"]), consumed // world
    if _dist.is_main():
        print(f"mindstep.fit: {path} was written by {old_world} rank(s) with accumulate={old_acc}; this job has "
              f"{world} with accumulate={acc}: the same {world * acc} batches per update, continuing at batch "
              f"{consumed} of epoch {loop.epoch}", flush=True)


def _open_loggers(loop, loggers, resumed, config, main) -> list:
    """The JSONL and CSV files (with `out`) and the user's trackers, on rank 0."""
    extra = _loggers.as_loggers(loggers)
    if not main:
        return []
    logs = ([_loggers.JSONLLogger(), _loggers.CSVLogger()] if loop.out is not None else []) + extra
    if loop.out is not None:
        os.makedirs(loop.out, exist_ok=True)
    for lg in logs:
        lg.open(loop.out, resumed)
        lg.log_config(config if config is not None else loop.step.settings())
    return logs


def _evaluator(step, eval_fn, eval_data, world):
    if eval_fn is None:
        return None
    settings = step.settings()
    ema = settings.get("ema") is not None or settings.get("g_ema") is not None

    def evaluate():
        return _evaluate.run(step, eval_fn, eval_data, world=world, ema=ema)

    return evaluate


def _record(loop, logs, kind, values) -> None:
    loop.history.append({"batch": loop.done, kind: values} if kind == "eval" else {"batch": loop.done, **values})
    for lg in logs:
        lg.log(kind, loop.done, values)


def _run_eval(loop, cbs, logs, evaluate) -> dict:
    metrics = evaluate()
    if loop.done == 0:
        loop.initial = metrics
    _record(loop, logs, "eval", metrics)
    for cb in cbs:
        cb.on_eval(loop, metrics)
    return metrics


def _save(loop, cbs, keep) -> str | None:
    extra = {"loop": {**loop.position(), "initial": loop.initial, "world": _dist.world_size(),
                      "accumulate": int(getattr(loop.step, "accumulate", 1)),
                      "callbacks": [{"type": type(cb).__name__, "state": cb.state_dict()} for cb in cbs]}}
    try:
        path = loop.step.save(_ckpt_dir(loop) / f"batch-{loop.done:07d}.ckpt", keep=keep, extra=extra)
    except _checkpoint.CheckpointError as err:
        if loop.on_save_error == "raise":
            raise
        import warnings

        warnings.warn(f"{err} Training goes on (on_save_error='warn').", _checkpoint.CheckpointWarning, stacklevel=3)
        return None
    for cb in cbs:
        cb.on_save(loop, path)
    return None if path is None else str(path)


def _log_values(metrics, window_n, window_s, rows, world, wait, busy) -> dict:
    values = {}
    for k, v in metrics.items():
        try:
            arr = np.asarray(v.asnumpy() if hasattr(v, "asnumpy") else v)
        except Exception:  # noqa: BLE001 - a metric that is not a number is not logged
            continue
        if arr.size == 1:
            values[k] = bool(arr) if k.startswith("applied") else float(arr)
    values["samples_per_s"] = window_n * rows * world / window_s if window_s > 0 and rows else None
    values["data_wait_share"] = wait / (wait + busy) if wait + busy else None
    return values


def _rows(args) -> int:
    shape = getattr(args[0], "shape", None) if args else None
    return int(shape[0]) if shape else 0


def _train(loop, source, cbs, logs, evaluate, signals, *, steps, epochs, eval_every, save_every, keep, log_every,
           progress) -> dict:
    """The batches from the loop's position on: stepped, logged, evaluated and saved."""
    world = _dist.world_size()
    for cb in cbs:
        cb.on_start(loop)
    if evaluate is not None and loop.done == 0:
        _run_eval(loop, cbs, logs, evaluate)
    wait = busy = 0.0
    window_t, window_n, loss, metrics = time.perf_counter(), 0, float("nan"), None
    last_eval = last_save = last_log = loop.done if loop.done else -1
    ckpt, rows = None, 0
    loss_key = None
    bar = Progress(steps, loop.done, enabled=progress)
    batches = source.epochs(loop.epoch, loop.index, epochs)
    try:
        while not loop.stopped and (steps is None or loop.done < steps):
            t0 = time.perf_counter()
            try:
                epoch, index, batch = next(batches)
            except StopIteration:
                break
            args = _data.as_args(batch)
            t1 = time.perf_counter()
            metrics = loop.step(*args)
            if loss_key is None:
                loss_key = "loss" if "loss" in metrics else "loss/g"
                rows = _rows(args)
            loop.done, loop.epoch, loop.index = loop.done + 1, epoch, index + 1
            window_n += 1
            for cb in cbs:
                cb.on_step_end(loop, metrics)
            if loop.done % log_every == 0:
                loss = float(metrics[loss_key])  # waits for the step: its time ends here
                t2 = time.perf_counter()
                wait, busy = wait + (t1 - t0), busy + (t2 - t1)
                values = _log_values(metrics, window_n, t2 - window_t, rows, world, wait, busy)
                _record(loop, logs, "train", values)
                for cb in cbs:
                    cb.on_log(loop, values)
                bar.update(loop.done, loss, wait / max(wait + busy, 1e-9))
                window_t, window_n, last_log = time.perf_counter(), 0, loop.done
            else:
                wait, busy = wait + (t1 - t0), busy + (time.perf_counter() - t1)
            if evaluate is not None and eval_every and loop.done % eval_every == 0:
                _run_eval(loop, cbs, logs, evaluate)
                last_eval = loop.done
            if loop.out is not None and save_every and loop.done % save_every == 0:
                ckpt, last_save = _save(loop, cbs, keep) or ckpt, loop.done
            if signals.should_stop(loop.done, world, log_every):
                loop.request_stop(f"signal {_signal_name(signals.agreed)}")
                last_eval = loop.done  # no evaluation on the way out: a preempted job has seconds
    finally:
        bar.close()
    if metrics is not None:
        loss = float(metrics[loss_key])
        if last_log != loop.done:
            now = time.perf_counter()
            _record(loop, logs, "train", _log_values(metrics, window_n, now - window_t, rows, world, wait, busy))
    if evaluate is not None and last_eval != loop.done:
        _run_eval(loop, cbs, logs, evaluate)
    if loop.out is not None and last_save != loop.done:
        ckpt = _save(loop, cbs, keep) or ckpt
    elif loop.out is not None and ckpt is None:
        latest = _checkpoint.latest(_ckpt_dir(loop))
        ckpt = None if latest is None else str(latest)
    return {"wait": wait, "busy": busy, "loss": loss, "ckpt": ckpt}


def _signal_name(signum) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def _summary(loop, trained, resumed) -> dict:
    logs = [r for r in loop.history if r.get("samples_per_s")]
    evals = [r["eval"] for r in loop.history if "eval" in r]
    wait, busy = trained["wait"], trained["busy"]
    summary = {"steps": loop.done, "epochs": loop.epoch + (1 if loop.index else 0), "resumed_from": resumed,
               "samples_per_s": float(np.median([r["samples_per_s"] for r in logs])) if logs else None,
               "data_wait_share": wait / (wait + busy) if wait + busy else None, "final_loss": trained["loss"],
               "checkpoint": trained["ckpt"], "stopped": loop.stopped, "eval": None}
    if evals or loop.initial:
        initial = {f"{k}_initial": v for k, v in (loop.initial or {}).items()}
        summary["eval"] = {**initial, **(evals[-1] if evals else {})}
    return summary
