"""`mindstep train`: a recipe's step trained end to end, with progress, metrics, evaluation,
checkpoints, resume and a summary.

The run's folder (`--out`) holds `config.yaml` (the resolved config), `metrics.jsonl` (one line
per logged step and per evaluation), `ckpt/batch-<N>.ckpt` (N = batches consumed, so a resume
continues from the next batch of the same data order), `curves.png` and, with `--json`, the
summary. The data order is a fixed permutation per epoch (`data.seed + epoch`), so a resumed run
sees exactly the batches an uninterrupted one would.
"""
from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import checkpoint as _checkpoint
from ..dist import context as _dist

_CKPT = re.compile(r"batch-(\d+)\.ckpt$")


def _optimizer(cfg, net):
    from mindspore import nn

    from ..groups import param_groups

    o = cfg.optim
    groups = param_groups(net, weight_decay=o.weight_decay, no_decay=tuple(o.no_decay),
                          lr=o.lr if o.lr_scale else None, lr_scale=o.lr_scale or None)
    if o.name == "momentum":
        return nn.Momentum(groups, o.lr, o.momentum)
    if o.name == "sgd":
        return nn.SGD(groups, o.lr)
    if o.name == "adam":
        return nn.Adam(groups, o.lr)
    return nn.AdamWeightDecay(groups, o.lr)


def _schedule(cfg):
    from .. import schedules

    s, lr = cfg.schedule, cfg.optim.lr
    updates = max((s.total_steps or cfg.train.steps) // cfg.step.accumulate - s.warmup_steps, 1)
    base = {"constant": lambda: schedules.constant(lr),
            "cosine": lambda: schedules.cosine_decay(lr, updates, s.eta_min),
            "step": lambda: schedules.step_decay(lr, s.step_size, s.gamma),
            "sgdr": lambda: schedules.sgdr(lr, s.T_0, s.T_mult, s.eta_min)}[s.name]()
    return schedules.warmup(s.warmup_steps, base) if s.warmup_steps else base


def apply_recompute(net, patterns) -> list:
    """`Cell.recompute()` on every sub-Cell whose name matches a pattern; returns the names."""
    from .config import ConfigError

    names = []
    for pattern in patterns:
        hits = [(n, c) for n, c in net.cells_and_names() if n and fnmatch.fnmatch(n, pattern)]
        if not hits:
            cells = ", ".join(n for n, _ in net.cells_and_names() if n and "." not in n)
            raise ConfigError(f"step.recompute: the pattern {pattern!r} matches no Cell; top-level Cells: {cells}")
        for name, cell in hits:
            cell.recompute()
            names.append(name)
    return names


def build_step(cfg, recipe):
    """The network, its `TrainStep` with every step: setting from the config, and the recompute list."""
    import mindspore as ms

    from .. import losses as _losses
    from ..step import TrainStep

    ms.set_seed(cfg.seed)
    net = recipe.build()
    recomputed = apply_recompute(net, cfg.step.recompute)
    s = cfg.step
    optimizer = _optimizer(cfg, net)
    make = getattr(recipe, "make_step", None)  # a recipe's own step (the esrgan recipe's GANStep)
    step = make(cfg, optimizer, dict(jit=s.jit, precision=s.precision, loss_scale=s.loss_scale,
                                     clip_grad_norm=s.clip_grad_norm, clip_grad_value=s.clip_grad_value, ema=s.ema,
                                     on_nonfinite=s.on_nonfinite, lr_schedule=_schedule(cfg),
                                     optimize=s.optimize)) if make else None
    if step is None:
        step = TrainStep(recipe.forward(), optimizer, jit=s.jit, precision=s.precision,
                         keep_fp32=list(s.keep_fp32), loss_scale=s.loss_scale, accumulate=s.accumulate,
                         normalize=s.normalize, clip_grad_norm=s.clip_grad_norm, clip_grad_value=s.clip_grad_value,
                         ema=s.ema, on_nonfinite=s.on_nonfinite, optimize=s.optimize, lr_schedule=_schedule(cfg),
                         losses=_losses.weighted(s.losses) if s.losses else None, nets=[net])
    return net, step, recomputed


class Batches:
    """The training batches in a fixed order per epoch, as a `mindspore.dataset` pipeline (parallel
    workers, prefetch), sharded across data-parallel ranks, from any batch index on. `arrays(epoch)`
    gives the epoch's columns (a recipe may re-mask or re-crop them per epoch, deterministically)."""

    def __init__(self, columns, arrays, batch_size: int, workers: int, seed: int, transform=None):
        self.columns, self.arrays, self.batch_size, self.workers, self.seed = columns, arrays, batch_size, workers, seed
        self.transform = transform  # (per-sample function, input columns, output columns), run by the workers
        n = len(arrays(0)[0])
        self.per_epoch = n // (batch_size * _dist.world_size())
        if self.per_epoch == 0:
            raise ValueError(f"data.batch_size={batch_size} x {_dist.world_size()} rank(s) is more than the "
                             f"{n} training samples; lower data.batch_size")

    @classmethod
    def of(cls, cfg, recipe) -> "Batches":
        """The recipe's training batches under `cfg.data`."""
        transform = recipe.transform() if hasattr(recipe, "transform") else None
        return cls(recipe.columns(), recipe.epoch, cfg.data.batch_size, cfg.data.workers, cfg.data.seed, transform)

    def _epoch(self, epoch: int, skip: int):
        import mindspore.dataset as ds

        arrays = self.arrays(epoch)
        order = np.random.default_rng(self.seed + epoch).permutation(len(arrays[0]))
        data = ds.NumpySlicesDataset({k: v[order] for k, v in zip(self.columns, arrays)}, shuffle=False,
                                     num_parallel_workers=self.workers, **_dist.shard_args())
        if self.transform is not None:
            fn, inputs, outputs = self.transform
            data = data.map(fn, input_columns=list(inputs), output_columns=list(outputs),
                            num_parallel_workers=self.workers)
        data = data.batch(self.batch_size, drop_remainder=True, num_parallel_workers=self.workers)
        if skip:
            data = data.skip(skip)
        return data.create_tuple_iterator(num_epochs=1)

    def from_batch(self, start: int):
        """Yield batches start, start + 1, ... forever (epoch after epoch)."""
        epoch, skip = divmod(start, self.per_epoch)
        while True:
            yield from self._epoch(epoch, skip)
            epoch, skip = epoch + 1, 0


def _latest(ckpt_dir: str):
    path = _checkpoint.latest(ckpt_dir) if os.path.isdir(ckpt_dir) else None
    if path is None:
        return None, 0
    match = _CKPT.search(str(path))
    if not match:
        raise ValueError(f"{path}: not a checkpoint of `mindstep train` (expected batch-<N>.ckpt)")
    return path, int(match.group(1))


def _evaluate(step, recipe, ema: bool) -> dict:
    if ema:
        with step.ema_weights():
            return recipe.evaluate()
    return recipe.evaluate()


def _plot(records, path, metric):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logs = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval" in r]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].plot([r["batch"] for r in logs], [r["loss"] for r in logs])
    ax[0].set(xlabel="batch", ylabel="training loss", yscale="log", title="loss")
    ax[1].plot([r["batch"] for r in evals], [r["eval"][metric] for r in evals], marker="o")
    ax[1].set(xlabel="batch", ylabel=metric, title=f"held-out {metric}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(cfg, out: str, *, resume: bool = False, json_path: str | None = None, progress: bool = True,
        phase: str | None = None) -> dict:
    """Train `cfg` into the folder `out`; returns the summary. A config with `phases:` runs each
    phase (or only `phase`) in order into `out/<phase>`, and the summary has one entry per phase."""
    from .config import phase as _phase

    if not cfg.phases:
        if phase is not None:
            raise ValueError(f"--phase {phase!r}: the {cfg.recipe} config has no phases; leave --phase out")
        return _run(cfg, out, resume=resume, json_path=json_path, progress=progress)
    names = [phase] if phase is not None else list(cfg.phases)
    # --resume over several phases: each phase with a checkpoint continues from it, a later phase
    # that has none yet starts (a finished phase resumes at its end and trains no further)
    started = [n for n in names if _latest(os.path.join(out, n, "ckpt"))[0] is not None]
    if resume and not started:
        raise ValueError(f"--resume: no complete checkpoint in {out}/<phase>/ckpt for the phases {', '.join(names)}; "
                         "run without --resume to start")
    summaries = {}
    for name in names:
        summaries[name] = _run(_phase(cfg, name), os.path.join(out, name), resume=resume and name in started,
                               progress=progress)
    summary = {**summaries[names[-1]], "phases": summaries}
    if json_path and _dist.is_main():
        with open(json_path, "w") as fh:
            json.dump(summary, fh, indent=1)
    return summary


def _run(cfg, out: str, *, resume: bool = False, json_path: str | None = None, progress: bool = True) -> dict:
    """Train one (phase's) config into `out`: set up (or resume), train, summarise."""
    run = _setup(cfg, out, resume)
    with open(run.metrics_path, "a") if run.main else contextlib.nullcontext() as log:
        trained = _train(cfg, run, log, progress)
    return _summarise(cfg, out, run, trained, resume, json_path)


@dataclass
class _Setup:
    """A run ready to train: its recipe and step, where it writes, and where it starts."""

    recipe: Any
    step: Any
    recomputed: list
    ckpt_dir: str
    metrics_path: str
    start: int
    records: list
    main: bool


def _setup(cfg, out: str, resume: bool) -> _Setup:
    """The recipe and the step; with `resume`, the newest complete checkpoint loaded and the metrics
    log cut back to it; on rank 0 the run's folder with its config and log."""
    from . import recipes
    from .config import dump

    main = _dist.is_main()
    recipe = recipes.build(cfg, out)
    _, step, recomputed = build_step(cfg, recipe)
    ckpt_dir = os.path.join(out, "ckpt")
    metrics_path = os.path.join(out, "metrics.jsonl")
    start, records = 0, []
    if resume:
        path, start = _latest(ckpt_dir)
        if path is None:
            raise ValueError(f"--resume: no complete checkpoint in {ckpt_dir}; run without --resume to start")
        step.load(path)
        if os.path.exists(metrics_path):
            with open(metrics_path) as fh:
                records = [r for r in map(json.loads, fh) if r.get("batch", 0) <= start]
    if main:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "config.yaml"), "w") as fh:
            fh.write(dump(cfg))
        with open(metrics_path, "w") as fh:  # rewritten: a resumed run drops what came after its checkpoint
            fh.writelines(json.dumps(r) + "\n" for r in records)
    return _Setup(recipe, step, recomputed, ckpt_dir, metrics_path, start, records, main)


def _train(cfg, run: _Setup, log, progress: bool) -> dict:
    """The batches from `run.start` to `train.steps`: logged, evaluated and saved as the config says.
    Returns the data-wait and step seconds, the last loss and the last checkpoint."""
    step, recipe = run.step, run.recipe
    ema = cfg.step.ema is not None

    def record(entry):
        run.records.append(entry)
        if log is not None:
            log.write(json.dumps(entry) + "\n")
            log.flush()

    def key(name):  # a GAN step's generator metrics stand for the run's
        return f"{name}/g" if hasattr(step, "objectives") else name

    if run.start == 0:
        record({"batch": 0, "eval": _evaluate(step, recipe, ema)})
    batches = Batches.of(cfg, recipe).from_batch(run.start)
    wait = busy = 0.0
    window_t, window_n, loss = time.perf_counter(), 0, float("nan")
    bar = _Progress(cfg.train.steps, run.start, enabled=progress and run.main)
    ckpt = None
    try:
        for i in range(run.start, cfg.train.steps):
            t0 = time.perf_counter()
            batch = next(batches)
            t1 = time.perf_counter()
            m = step(*batch)
            loss = float(m[key("loss")])  # synchronises: the step's time ends here
            t2 = time.perf_counter()
            wait, busy = wait + (t1 - t0), busy + (t2 - t1)
            window_n += 1
            done = i + 1
            if done % cfg.train.log_every == 0 or done == cfg.train.steps:
                now = time.perf_counter()
                rate = window_n * cfg.data.batch_size * _dist.world_size() / (now - window_t)
                entry = {"batch": done, "loss": loss, "lr": float(m[key("lr")]) if key("lr") in m else None,
                         "applied": bool(m.get(key("applied"), False)), "samples_per_s": rate,
                         "data_wait_share": wait / (wait + busy)}
                if "loss/d" in m:  # a GAN step: each objective's losses
                    entry.update({k: float(v) for k, v in m.items() if k.startswith("loss/")})
                    entry["applied/d"] = bool(m["applied/d"])
                record(entry)
                window_t, window_n = now, 0
            bar.update(done, loss, wait / max(wait + busy, 1e-9))
            if done % cfg.train.eval_every == 0 or done == cfg.train.steps:
                record({"batch": done, "eval": _evaluate(step, recipe, ema)})
            if done % cfg.train.save_every == 0 or done == cfg.train.steps:
                ckpt = step.save(os.path.join(run.ckpt_dir, f"batch-{done:07d}.ckpt"), keep=cfg.train.keep) or ckpt
    finally:
        bar.close()
    return {"wait": wait, "busy": busy, "loss": loss, "ckpt": ckpt}


def _summarise(cfg, out: str, run: _Setup, trained: dict, resume: bool, json_path: str | None) -> dict:
    """The run's summary (returned, and written to `json_path`) and, on rank 0, its curves."""
    logs = [r for r in run.records if "samples_per_s" in r]
    evals = [r for r in run.records if "eval" in r]
    wait, busy, metric = trained["wait"], trained["busy"], run.recipe.metric
    summary = {"recipe": cfg.recipe, "steps": cfg.train.steps, "resumed_from": run.start if resume else None,
               "samples_per_s": float(np.median([r["samples_per_s"] for r in logs])) if logs else None,
               "data_wait_share": wait / (wait + busy) if wait + busy else None, "final_loss": trained["loss"],
               "checkpoint": str(trained["ckpt"]) if trained["ckpt"] else None, "recompute": run.recomputed,
               "notes": list(getattr(run.recipe, "notes", [])),
               "eval": {f"{metric}_initial": evals[0]["eval"][metric], **evals[-1]["eval"]}}
    if run.main:
        _plot(run.records, os.path.join(out, "curves.png"), metric)
        if json_path:
            with open(json_path, "w") as fh:
                json.dump(summary, fh, indent=1)
    return summary


class _Progress:
    """A rich progress bar with loss, data-wait share and ETA, on rank 0 only."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.bar = None
        if not enabled:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TextColumn("loss {task.fields[loss]}"), TextColumn("data wait {task.fields[wait]}"),
                            TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=total, completed=start, loss="-", wait="-")
        self.bar.start()

    def update(self, done, loss, wait_share):
        if self.bar is not None:
            self.bar.update(self.task, completed=done, loss=f"{loss:.4f}", wait=f"{wait_share:.0%}")

    def close(self):
        if self.bar is not None:
            self.bar.stop()
