"""What `TrainStep` and `GANStep` share: the settings of one update, validated once on the host; the
checks both steps make of their functions, name and precision; the update stages built from those
settings; and the step methods that only read them (checkpoints, EMA, the fusion block).

A step's settings are frozen values (`Update`, and the step's own fields): validated when the step is
built, read by the stages, by `settings()` for the checkpoint manifest, and never changed after.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import mindspore as ms
from mindspore import ops

from . import checkpoint as _checkpoint
from . import clip as _clip
from . import ema as _ema
from . import groups as _groups
from . import loss_scale as _loss_scale
from . import losses as _losses
from . import nonfinite as _nonfinite
from . import precision as _precision
from . import schedules as _schedules
from ._errors import bad_type, bad_value, check_float
from ._graph import Counter
from .dist import reduce as _reduce
from .optimize import fusion as _fusion

#: the settings of one update, as `TrainStep` takes them and `GANStep`'s `d_options`/`g_options` hold them
UPDATE_KEYS = ("loss_scale", "clip_grad_norm", "clip_grad_value", "ema", "lr_schedule", "losses", "on_nonfinite",
               "max_consecutive_skips")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Update:
    """The settings of one objective's update (stages 7-13), validated: `loss_scale` is a resolved
    `mindspore.amp` scaler or None."""

    loss_scale: Any = None
    clip_grad_norm: float | None = None
    clip_grad_value: float | None = None
    ema: float | None = None
    lr_schedule: Any = None
    losses: Any = None
    on_nonfinite: str = "skip"
    max_consecutive_skips: int | None = _nonfinite.DEFAULT_MAX_CONSECUTIVE_SKIPS

    @classmethod
    def check(cls, arg: Callable[[str], str] = str, *, learned_losses: bool = True, **values) -> "Update":
        """Validate the `UPDATE_KEYS` in `values` (missing ones take their defaults); `arg(key)` is
        how an error names the argument (``"ema"`` for `TrainStep`, ``"g_options['ema']"`` for a
        `GANStep` objective); `learned_losses`: `mindstep.losses.uncertainty` is accepted too."""
        out = dict(values)
        out["loss_scale"] = _loss_scale.resolve(values.get("loss_scale"))
        for key in ("clip_grad_norm", "clip_grad_value"):
            if values.get(key) is not None:
                out[key] = check_float(arg(key), values[key], low=0.0, low_open=True)
        if values.get("ema") is not None:
            out["ema"] = check_float(arg("ema"), values["ema"], low=0.0, high=1.0, low_open=True, high_open=True,
                                     fix=f"Pass a decay such as {arg('ema')}=0.999 (closer to 1 = slower average).")
        schedule = values.get("lr_schedule")
        if schedule is not None and not isinstance(schedule, _schedules.Schedule):
            raise bad_type(arg("lr_schedule"), schedule, "a mindstep.schedules schedule or None",
                           "Example: mindstep.schedules.warmup(100, mindstep.schedules.cosine_decay(1e-3, 10_000)).")
        kinds = (_losses.Weighted, _losses.Uncertainty) if learned_losses else (_losses.Weighted,)
        losses = values.get("losses")
        if losses is not None and not isinstance(losses, kinds):
            raise bad_type(arg("losses"), losses, "mindstep.losses.weighted({...})"
                           + (", mindstep.losses.uncertainty([...])" if learned_losses else "") + " or None",
                           "Example: mindstep.losses.weighted({'sr': 1.0, 'adv': 5e-3}).")
        out["on_nonfinite"], out["max_consecutive_skips"] = _nonfinite.check(
            values.get("on_nonfinite", "skip"),
            values.get("max_consecutive_skips", _nonfinite.DEFAULT_MAX_CONSECUTIVE_SKIPS),
            scaled=out["loss_scale"] is not None)
        return cls(**out)

    def check_trained_by(self, optimizer, arg: str = "losses") -> None:
        """Learned loss weights must be among the optimizer's parameters, or they never train."""
        if isinstance(self.losses, _losses.Uncertainty) and \
                id(self.losses.log_var) not in {id(p) for p in optimizer.parameters}:
            raise bad_value(arg, self.losses.log_var.name, "learned weights that the optimizer trains",
                            "Add them: nn.Adam(net.trainable_params() + weighting.trainable_params(), ...).")

    def manifest(self) -> dict:
        """The settings as JSON values (repr for objects), as checkpoint manifests record them."""
        return {"loss_scale": scale_manifest(self.loss_scale), "clip_grad_norm": self.clip_grad_norm,
                "clip_grad_value": self.clip_grad_value, "ema": self.ema, "lr_schedule": repr(self.lr_schedule),
                "losses": repr(self.losses), "on_nonfinite": self.on_nonfinite,
                "max_consecutive_skips": self.max_consecutive_skips}


def scale_manifest(scaler) -> dict | None:
    """A loss scaler as JSON: its kind and what sets it."""
    if scaler is None:
        return None
    if hasattr(scaler, "scale_factor"):
        return {"kind": "dynamic", "factor": float(scaler.scale_factor), "period": int(scaler.scale_window)}
    return {"kind": "static", "value": float(scaler.scale_value.asnumpy())}


def update_stages(optimizer, update: Update, prefix: str, reduce_mode, world: int) -> dict:
    """The stage Cells of one update (`mindstep._graph.Stages`' attributes, the accumulation aside),
    their Parameters named ``<prefix>.*``."""
    params = list(optimizer.parameters)
    lr = _schedules.NoSchedule()
    if update.lr_schedule is not None:
        lr_params = _groups.lr_parameters(optimizer)
        lr = _schedules.ScheduleStage(update.lr_schedule, lr_params, _groups.lr_scales(optimizer, lr_params), prefix)
    return dict(counter=Counter(f"{prefix}.step"), scale=_loss_scale.stage(update.loss_scale, prefix),
                clip=_clip.Clip(update.clip_grad_norm, update.clip_grad_value), ema=_ema.stage(params, update.ema, prefix),
                lr=lr, finite=_nonfinite.stage(update.on_nonfinite, prefix),
                reduce=_reduce.stage(params, reduce_mode, world), combine=update.losses)


def check_function(arg: str, fn, signature: str, fix: str) -> None:
    """A function the step compiles: callable, and a `def` (MindSpore cannot compile lambdas)."""
    if not callable(fn):
        raise bad_type(arg, fn, f"a function `{signature}`", fix)
    if getattr(fn, "__name__", "") == "<lambda>":
        raise bad_value(arg, fn, "a function defined with `def`",
                        "MindSpore cannot compile lambdas (`Parse Lambda Function Fail`); write it with `def`.")


def check_name(name, example: str, optimizers) -> str:
    """The prefix of the step's Parameters: an ASCII identifier that none of the optimizers'
    parameters (the networks' and the optimizers' own state) starts with."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise bad_value("name", name, f"a Python identifier such as {example!r}",
                        "Pick a short prefix made of letters, digits and underscores.")
    taken = {p.name.split(".")[0] for optimizer in optimizers for p in optimizer.parameters}
    taken |= {p.name.split(".")[0] for optimizer in optimizers for p in optimizer.get_parameters()}
    if name in taken:
        raise bad_value("name", name, f"a prefix that none of the optimizers' parameters use ({sorted(taken)})",
                        f"Pass another `name=`, e.g. name={name + '_step'!r}.")
    return name


def check_precision(precision, keep_fp32) -> _precision.Plan:
    """`precision=` and `keep_fp32=` resolved to a plan that this device can run."""
    plan = _precision.plan(precision, keep_fp32)
    _precision.check_device(plan, ms.get_context("device_target"))
    return plan


def precision_manifest(plan: _precision.Plan) -> str:
    """A level as its name, a custom policy as the policy itself."""
    return str(plan.level if plan.level != "custom" else plan.policy)


def watched(graph, cells) -> list:
    """The Parameters whose buffers the step watches for writes from the host: its own and the
    networks'."""
    watch = {id(p): p for p in graph.get_parameters()}
    for cell in cells:
        watch.update((id(p), p) for p in cell.get_parameters())
    return list(watch.values())


class StepMethods:
    """The step methods `TrainStep` and `GANStep` share. A step sets `name`, `graph` (the Cell that
    holds every stage Parameter), `optimize` (the pass's settings or None) and defines `settings()`
    `resync()` and `_lr_stages()` (each update's LR stage with its optimizer)."""

    def state_parameters(self) -> list:
        """The Parameters this step created (counters, accumulators, ...), for checkpoints."""
        prefix = self.name + "."
        return [p for p in self.graph.get_parameters() if p.name.startswith(prefix)]

    def scale_lr(self, factor: float) -> float:
        """Multiply the learning rate by `factor` from the next update on, in place: the compiled
        step is not recompiled. With an `lr_schedule` the schedule's output is multiplied (the
        Parameter ``<name>.lr_factor``); without one, the optimizer's LR Parameters are. Both are
        in the checkpoint, so a resumed run keeps the lowered LR. Returns the factor applied so
        far (the product of every call). What `mindstep.loop.ReduceLROnPlateau` calls.

        Example:
            `step.scale_lr(0.5)` halves the LR of every parameter group.
        """
        factor = check_float("factor", factor, low=0.0, low_open=True,
                             fix="Pass a positive multiplier, e.g. step.scale_lr(0.1) to divide the LR by 10.")
        for stage, optimizer in self._lr_stages():
            if isinstance(stage, _schedules.ScheduleStage):
                targets = [stage.factor]
            else:
                try:
                    targets = _groups.lr_parameters(optimizer)
                except ValueError:
                    raise bad_value("the optimizer's learning_rate", optimizer.learning_rate, "a float",
                                    "scale_lr cannot scale a MindSpore LR list or LearningRateSchedule; build the "
                                    "optimizer with a float LR and pass the schedule as lr_schedule=") from None
            for param in targets:
                ops.assign(param, param * ms.Tensor(factor, param.dtype))
        self._lr_factor = self.lr_factor * factor
        return self._lr_factor

    @property
    def lr_factor(self) -> float:
        """The product of every `scale_lr` factor (1.0 when none). With an `lr_schedule` it is read
        from the step's Parameter, so it survives a checkpoint load; without one it counts this
        process's calls (the lowered LR itself is in the optimizer's checkpointed Parameters)."""
        stages = [s for s, _ in self._lr_stages() if isinstance(s, _schedules.ScheduleStage)]
        if stages:
            return float(stages[0].factor.asnumpy())
        return getattr(self, "_lr_factor", 1.0)

    def save(self, path, *, format: str = "ckpt", keep: int | None = None, extra: dict | None = None):
        """Save the complete training state atomically (`mindstep.checkpoint.save`); returns the path.
        In a data-parallel job only rank 0 writes (every rank holds the same state) and the other
        ranks return None.

        Example:
            `step.save("runs/ckpt/step-000100.ckpt", keep=3)`.
        """
        return _checkpoint.save(self, path, format=format, keep=keep, extra=extra)

    def load(self, path, *, strict: bool = True, elastic: bool = False) -> dict:
        """Load a checkpoint into this step in place (`mindstep.checkpoint.load`); returns its manifest.

        Example:
            `step.load(mindstep.checkpoint.latest("runs/ckpt"))`.
        """
        return _checkpoint.load(self, path, strict=strict, elastic=elastic)

    def _fusion(self):
        """The block the pass, the compiles and the calls run in (`mindstep.optimize.fusion`)."""
        return _fusion.for_settings(self.optimize)

    def _optimize_manifest(self):
        return None if self.optimize is None else {k: v for k, v in self.optimize.items() if k != "force"}
