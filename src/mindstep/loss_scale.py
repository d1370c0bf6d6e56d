"""Loss scaling: none, static or dynamic, built on `mindspore.amp`'s loss scalers.

The dynamic algorithm (`mindspore.amp.DynamicLossScaler`, checked by our tests):
start at `init` (2**16 by default); after a non-finite gradient, divide the scale by `factor`
(never below 1) and restart the count; after `period` consecutive finite updates, multiply it
by `factor`. The finite check is `mindstep.nonfinite`'s (the answer of `mindspore.amp.all_finite` in
fewer kernels), which runs on every device; it does not use the NPU float-status ops that make
`nn.TrainOneStepWithLossScaleCell` fail on CPU.
"""
from __future__ import annotations

import numbers

from mindspore import amp, nn, ops

from ._errors import bad_type, check_float, check_int

DEFAULT_INIT = 2.0 ** 16
DEFAULT_PERIOD = 2000


def dynamic(init: float = DEFAULT_INIT, factor: int = 2, period: int = DEFAULT_PERIOD) -> amp.DynamicLossScaler:
    """A dynamic loss scale (validated), for `TrainStep(loss_scale=...)`."""
    init = check_float("loss_scale init", init, low=1.0)
    factor = check_int("loss_scale factor", factor, minimum=2)
    period = check_int("loss_scale period", period, minimum=1)
    return amp.DynamicLossScaler(init, factor, period)


def resolve(loss_scale) -> amp.LossScaler | None:
    """Turn the user's `loss_scale=` argument into a MindSpore loss scaler, or None."""
    if loss_scale is None:
        return None
    if isinstance(loss_scale, amp.LossScaler):
        return loss_scale
    if isinstance(loss_scale, str):
        if loss_scale != "dynamic":
            raise ValueError(f"`loss_scale` must be None, 'dynamic', a float >= 1 or a mindspore.amp loss scaler, "
                             f"but got {loss_scale!r}. Use loss_scale='dynamic' or mindstep.loss_scale.dynamic(...).")
        return dynamic()
    if isinstance(loss_scale, numbers.Real) and not isinstance(loss_scale, bool):
        return amp.StaticLossScaler(check_float("loss_scale", loss_scale, low=1.0))
    raise bad_type("loss_scale", loss_scale, "None, 'dynamic', a float >= 1 or a mindspore.amp loss scaler",
                   "For dynamic scaling pass loss_scale='dynamic' or mindstep.loss_scale.dynamic(init, factor, period).")


class NoScale(nn.Cell):
    """No loss scaling: scale 1, no metrics (compiles to nothing)."""

    metric_names = ()

    def scale(self, loss):
        return loss

    def unscale_factor(self):
        return 1.0

    def adjust(self, finite):
        return finite

    def metrics(self, finite):
        return ()


class ScaleStage(nn.Cell):
    """Static or dynamic loss scaling; owns `<prefix>.loss_scale[_good]`. The finite check it adjusts
    to is the `mindstep.nonfinite` stage's."""

    metric_names = ("overflow", "loss_scale")

    def __init__(self, scaler: amp.LossScaler, prefix: str):
        super().__init__()
        self.scaler = scaler
        scaler.scale_value.name = f"{prefix}.loss_scale"
        self.value = scaler.scale_value
        if hasattr(scaler, "counter"):
            scaler.counter.name = f"{prefix}.loss_scale_good"
            self.good = scaler.counter

    def scale(self, loss):
        return loss * self.value

    def unscale_factor(self):
        return 1.0 / self.value

    def adjust(self, finite):
        """Adjust the scale to `finite`; returns `finite`, after the scale is written (the step
        threads it on, as it does the finite check's `record`)."""
        return ops.depend(finite, self.scaler.adjust(finite))

    def metrics(self, finite):
        return (ops.logical_not(finite), self.value + 0)


def stage(scaler: amp.LossScaler | None, prefix: str) -> nn.Cell:
    return NoScale() if scaler is None else ScaleStage(scaler, prefix)
