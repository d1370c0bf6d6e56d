"""`mindstep train`: a recipe's config built into a step and its data, trained by `mindstep.fit`.

The run's folder (`--out`) holds `config.yaml` (the resolved config), what `fit` writes
(`metrics.jsonl`, `metrics.csv`, `ckpt/batch-<N>.ckpt`, N = batches consumed, each recording the
data position), `curves.png` and, with `--json`, the summary. The data order is a fixed
permutation per epoch (`data.seed + epoch`), so a resumed run sees exactly the batches an
uninterrupted one would.
"""
from __future__ import annotations

import fnmatch
import json
import os

import numpy as np

from .. import checkpoint as _checkpoint
from ..dist import context as _dist



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

    def __call__(self, epoch: int):
        """Epoch `epoch`'s batches as a `mindspore.dataset` pipeline (what `fit` reads; it seeks a
        resumed epoch with `.skip`)."""
        import mindspore.dataset as ds

        arrays = self.arrays(epoch)
        order = np.random.default_rng(self.seed + epoch).permutation(len(arrays[0]))
        data = ds.NumpySlicesDataset({k: v[order] for k, v in zip(self.columns, arrays)}, shuffle=False,
                                     num_parallel_workers=self.workers, **_dist.shard_args())
        if self.transform is not None:
            fn, inputs, outputs = self.transform
            data = data.map(fn, input_columns=list(inputs), output_columns=list(outputs),
                            num_parallel_workers=self.workers)
        return data.batch(self.batch_size, drop_remainder=True, num_parallel_workers=self.workers)

    def from_batch(self, start: int):
        """Yield batches start, start + 1, ... forever (epoch after epoch)."""
        epoch, skip = divmod(start, self.per_epoch)
        while True:
            data = self(epoch)
            yield from (data.skip(skip) if skip else data).create_tuple_iterator(num_epochs=1)
            epoch, skip = epoch + 1, 0


def _callbacks(t) -> list:
    """The callbacks `train:` configures."""
    from .. import loop

    out = []
    if t.early_stopping is not None:
        out.append(loop.EarlyStopping(**t.early_stopping.model_dump()))
    if t.reduce_lr_on_plateau is not None:
        out.append(loop.ReduceLROnPlateau(**t.reduce_lr_on_plateau.model_dump()))
    if t.best_checkpoint is not None:
        out.append(loop.BestCheckpoint(**t.best_checkpoint.model_dump()))
    return out


def _has_checkpoint(out: str) -> bool:
    ckpt_dir = os.path.join(out, "ckpt")
    return os.path.isdir(ckpt_dir) and _checkpoint.latest(ckpt_dir) is not None


def _plot(records, path, metric):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "loss" if any("loss" in r for r in records) else "loss/g"  # a GAN step: the generator's
    logs = [r for r in records if key in r]
    evals = [r for r in records if "eval" in r]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].plot([r["batch"] for r in logs], [r[key] for r in logs])
    ax[0].set(xlabel="batch", ylabel="training loss", yscale="log", title="loss")
    ax[1].plot([r["batch"] for r in evals], [r["eval"][metric] for r in evals], marker="o")
    ax[1].set(xlabel="batch", ylabel=metric, title=f"held-out {metric}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(cfg, out: str, *, resume: bool = False, json_path: str | None = None, progress: bool = True,
        phase: str | None = None, callbacks=(), loggers=()) -> dict:
    """Train `cfg` into the folder `out` with `mindstep.fit`; returns the summary. A config with
    `phases:` runs each phase (or only `phase`) in order into `out/<phase>`, and the summary has one
    entry per phase."""
    from .config import phase as _phase

    if not cfg.phases:
        if phase is not None:
            raise ValueError(f"--phase {phase!r}: the {cfg.recipe} config has no phases; leave --phase out")
        return _run(cfg, out, resume=resume, json_path=json_path, progress=progress, callbacks=callbacks,
                    loggers=loggers)
    names = [phase] if phase is not None else list(cfg.phases)
    # --resume over several phases: each phase with a checkpoint continues from it, a later phase
    # that has none yet starts (a finished phase resumes at its end and trains no further)
    started = [n for n in names if _has_checkpoint(os.path.join(out, n))]
    if resume and not started:
        raise ValueError(f"--resume: no complete checkpoint in {out}/<phase>/ckpt for the phases {', '.join(names)}; "
                         "run without --resume to start")
    summaries = {}
    for name in names:
        summaries[name] = _run(_phase(cfg, name), os.path.join(out, name), resume=resume and name in started,
                               progress=progress, callbacks=callbacks, loggers=loggers)
    summary = {**summaries[names[-1]], "phases": summaries}
    if json_path and _dist.is_main():
        with open(json_path, "w") as fh:
            json.dump(summary, fh, indent=1)
    return summary


def _run(cfg, out: str, *, resume: bool = False, json_path: str | None = None, progress: bool = True,
         callbacks=(), loggers=()) -> dict:
    """Train one (phase's) config into `out` with `mindstep.fit`, then summarise."""
    from ..loop import fit
    from . import recipes
    from .config import dump

    if resume and not _has_checkpoint(out):
        raise ValueError(f"--resume: no complete checkpoint in {os.path.join(out, 'ckpt')}; run without --resume to start")
    recipe = recipes.build(cfg, out)
    _, step, recomputed = build_step(cfg, recipe)
    if _dist.is_main():
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "config.yaml"), "w") as fh:
            fh.write(dump(cfg))
    t = cfg.train
    callbacks = list(callbacks) + _callbacks(t)
    loggers = list(loggers) + list(t.loggers)
    done = fit(step, Batches.of(cfg, recipe), steps=t.steps, eval_fn=lambda _step, _data: recipe.evaluate(),
               eval_every=t.eval_every, out=out, save_every=t.save_every, keep=t.keep, resume=resume,
               callbacks=callbacks, loggers=loggers, log_every=t.log_every, progress=progress,
               config=cfg.model_dump())
    summary = {"recipe": cfg.recipe, **done, "recompute": recomputed, "notes": list(getattr(recipe, "notes", []))}
    if _dist.is_main():
        with open(os.path.join(out, "metrics.jsonl")) as fh:
            records = [json.loads(line) for line in fh]
        _plot(records, os.path.join(out, "curves.png"), recipe.metric)
        if json_path:
            with open(json_path, "w") as fh:
                json.dump(summary, fh, indent=1)
    return summary
