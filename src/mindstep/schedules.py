"""Learning-rate schedules evaluated inside the compiled step from the applied-update counter.

A schedule is a small frozen value with two faces that compute the same closed form:

- `schedule(step)` on a MindSpore int32 scalar tensor, inside the graph (no host round-trip, no
  recompile: the counter is a Parameter, its value an input of the graph);
- `schedule.value(step)` on a Python int, on the host (for tests, plots and reports).

`step` is the number of *applied* updates before this one, so the first update uses
`schedule(0)` and a skipped (overflow) update does not advance the schedule.

Schedules compose: `warmup(steps, then)` runs a linear warmup into `then`, whose own step
counter starts after the warmup. The schedule gives the optimizer's LR; with parameter groups,
each group's LR is `schedule(step) * group_lr / default_lr` (the optimizer's own `learning_rate`
argument), so groups keep their LR ratios (e.g. a head at 10x) through the whole schedule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mindspore as ms
from mindspore import ops

from ._errors import bad_type, check_float, check_int


def _f(step):
    return step.astype(ms.float32)


class Schedule:
    """Base of the schedules: `__call__` (graph) and `value` (host) must agree."""

    @property
    def base_lr(self) -> float:
        """The LR the schedule is defined around (its `lr`); group LR ratios are kept relative to it."""
        return self.lr

    def __call__(self, step):  # pragma: no cover - abstract
        raise NotImplementedError

    def value(self, step: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class constant(Schedule):
    """The same LR at every update."""

    lr: float

    def __post_init__(self):
        check_float("lr", self.lr, low=0.0)

    def __call__(self, step):
        return ops.zeros((), ms.float32) + self.lr

    def value(self, step):
        return float(self.lr)


@dataclass(frozen=True)
class cosine_decay(Schedule):
    """Cosine from `lr` at step 0 to `eta_min` at `total_steps`, then constant `eta_min`."""

    lr: float
    total_steps: int
    eta_min: float = 0.0

    def __post_init__(self):
        check_float("lr", self.lr, low=0.0)
        check_int("total_steps", self.total_steps, minimum=1)
        check_float("eta_min", self.eta_min, low=0.0, high=self.lr)

    def __call__(self, step):
        t = ops.minimum(_f(step), float(self.total_steps)) / self.total_steps
        return self.eta_min + 0.5 * (self.lr - self.eta_min) * (1.0 + ops.cos(math.pi * t))

    def value(self, step):
        t = min(step, self.total_steps) / self.total_steps
        return self.eta_min + 0.5 * (self.lr - self.eta_min) * (1.0 + math.cos(math.pi * t))


@dataclass(frozen=True)
class step_decay(Schedule):
    """`lr * gamma ** (step // step_size)`."""

    lr: float
    step_size: int
    gamma: float = 0.1

    def __post_init__(self):
        check_float("lr", self.lr, low=0.0)
        check_int("step_size", self.step_size, minimum=1)
        check_float("gamma", self.gamma, low=0.0, high=1.0)

    def __call__(self, step):
        k = ops.floor_divide(step, self.step_size).astype(ms.float32)
        return self.lr * ops.pow(ops.zeros((), ms.float32) + self.gamma, k)

    def value(self, step):
        return self.lr * self.gamma ** (step // self.step_size)


@dataclass(frozen=True)
class sgdr(Schedule):
    """Cosine annealing with warm restarts (Loshchilov & Hutter): cycles of T_0, T_0*T_mult, ...

    Matches `mindspore.experimental.optim.lr_scheduler.CosineAnnealingWarmRestarts` stepped once
    per update: within a cycle of length T_i at position t, `eta_min + (lr - eta_min)(1 + cos(pi t/T_i))/2`.
    """

    lr: float
    T_0: int
    T_mult: int = 1
    eta_min: float = 0.0

    def __post_init__(self):
        check_float("lr", self.lr, low=0.0)
        check_int("T_0", self.T_0, minimum=1)
        check_int("T_mult", self.T_mult, minimum=1)
        check_float("eta_min", self.eta_min, low=0.0, high=self.lr)

    def _position(self, step: int) -> tuple[float, float]:
        if self.T_mult == 1:
            return step % self.T_0, self.T_0
        n = int(math.log(step / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
        start = self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
        return step - start, self.T_0 * self.T_mult ** n

    def value(self, step):
        t, period = self._position(step)
        return self.eta_min + 0.5 * (self.lr - self.eta_min) * (1.0 + math.cos(math.pi * t / period))

    def __call__(self, step):
        s = _f(step)
        if self.T_mult == 1:
            t = s - ops.floor(s / self.T_0) * self.T_0
            period = ops.zeros((), ms.float32) + float(self.T_0)
        else:
            m = float(self.T_mult)
            # the cycle index n = floor(log_m(s/T_0*(m-1)+1)); nudge by 1e-6 so exact cycle starts
            # do not fall one cycle short through float rounding of the logarithm
            n = ops.floor(ops.log(s / self.T_0 * (m - 1.0) + 1.0) / math.log(m) + 1e-6)
            mn = ops.pow(ops.zeros((), ms.float32) + m, n)
            start = self.T_0 * (mn - 1.0) / (m - 1.0)
            t = s - start
            period = self.T_0 * mn
        return self.eta_min + 0.5 * (self.lr - self.eta_min) * (1.0 + ops.cos(math.pi * t / period))


@dataclass(frozen=True)
class warmup(Schedule):
    """Linear warmup from `start_factor * then.base_lr` to `then.base_lr` over `steps`, then `then`
    (whose own counter starts at 0 when the warmup ends)."""

    steps: int
    then: Schedule
    start_factor: float = 0.0

    def __post_init__(self):
        check_int("steps", self.steps, minimum=1)
        if not isinstance(self.then, Schedule):
            raise bad_type("then", self.then, "a mindstep schedule", "Example: warmup(100, cosine_decay(1e-3, 10_000)).")
        check_float("start_factor", self.start_factor, low=0.0, high=1.0)

    @property
    def base_lr(self):
        return self.then.base_lr

    def value(self, step):
        if step < self.steps:
            frac = self.start_factor + (1.0 - self.start_factor) * step / self.steps
            return self.base_lr * frac
        return self.then.value(step - self.steps)

    def __call__(self, step):
        s = _f(step)
        frac = self.start_factor + (1.0 - self.start_factor) * s / self.steps
        after = self.then(ops.maximum(step - self.steps, 0))
        return ops.select(s < self.steps, self.base_lr * frac, after)


def linear_warmup(lr: float, steps: int, start_factor: float = 0.0) -> warmup:
    """Warm up linearly to `lr` over `steps`, then hold `lr`."""
    return warmup(steps, constant(lr), start_factor)


class NoSchedule(ms.nn.Cell):
    """No schedule: the optimizer's own LR, no `lr` metric (`step.scale_lr` writes the
    optimizer's LR Parameters themselves)."""

    metric_names = ()

    def values(self, step):
        return ()

    def assign(self, lrs):
        return True

    def metrics(self, lrs):
        return ()


class ScheduleStage(ms.nn.Cell):
    """Sets each optimizer group's LR Parameter to `schedule(step) * scale * factor` before the
    update. `factor` (the Parameter ``<prefix>.lr_factor``, 1.0 at the start) is what
    `step.scale_lr` multiplies from the host, so a plateau rule lowers the LR of a compiled step
    without recompiling it, and a checkpoint keeps it."""

    def __init__(self, schedule: Schedule, lr_params, scales, prefix: str = "mindstep"):
        super().__init__(auto_prefix=False)
        self.schedule = schedule
        self.lr_params = ms.ParameterTuple(lr_params)
        self.scales = tuple(scales)
        self.factor = ms.Parameter(ms.Tensor(1.0, ms.float32), name=f"{prefix}.lr_factor", requires_grad=False)
        self.metric_names = ("lr",) if len(set(self.scales)) == 1 else \
            ("lr",) + tuple(f"lr/group{i}" for i in range(len(self.scales)))

    def values(self, step):
        base = self.schedule(step).astype(ms.float32) * self.factor
        return tuple(base * s for s in self.scales)

    def assign(self, lrs):
        for param, value in zip(self.lr_params, lrs):
            ops.assign(param, value.astype(param.dtype))
        return True

    def metrics(self, lrs):
        if len(self.metric_names) == 1:
            return (lrs[0],)
        return (lrs[0] / self.scales[0] * 1.0,) + lrs
