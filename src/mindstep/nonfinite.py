"""The finite check: what a step does with an update whose gradient is not finite.

`TrainStep(on_nonfinite=...)`, after optax's `apply_if_finite`:

- ``"skip"`` (default): a non-finite gradient (NaN or Inf anywhere in the window's unscaled,
  accumulated gradient) skips the whole update exactly as a loss-scale overflow does: weights,
  optimizer state, EMA and the update counter stay bit-identical, the accumulators are cleared.
  The metrics `skipped` (updates skipped so far) and `skipped_in_row` count it; after
  `max_consecutive_skips` skipped updates in a row the step raises `NonFiniteError`.
- ``"raise"``: the same skip, then `NonFiniteError` at once (at the first call, micro-step or
  not, that brings a non-finite value into the window), naming where it appeared: the loss, or
  the parameters (and optimizer groups) whose gradient is not finite.
  With a loss scale, a non-finite gradient under a finite loss is an overflow that the scale
  handles (it shrinks and the update is skipped); only a non-finite loss raises.
- ``"apply"``: no check, the update is applied whatever it holds; only
  without a loss scale, which must always check.

Without a loss scale and with ``"apply"`` the stage compiles to nothing. Its counters are
Parameters (`<prefix>.skipped`, `<prefix>.skipped_in_row`), so they checkpoint with the step.

How the check runs: one mark per gradient (`_map.nonfinite_mark`, 0 exactly when the gradient is
finite): the sum of the gradient times 0 (a product of a finite value and 0 is 0, of inf or NaN
and 0 is NaN, so no sum can overflow); the update is finite when the marks sum to 0. That gives
`mindspore.amp.all_finite`'s answer (NaN or Inf in any element of any gradient) in fewer and
faster kernels than its three elementwise ones per tensor and a sum, summed over the first axis and
then the rest (`_map._total`); the same marks serve small networks too. The measurements: 
docs/design/measurements.md.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from . import _map
from ._errors import bad_value, check_choice, check_int

POLICIES = ("skip", "raise", "apply")
DEFAULT_MAX_CONSECUTIVE_SKIPS = 100
FLAGS = "_finite_params"  # raise mode: a per-parameter finite flag vector, popped by the host


class NonFiniteError(FloatingPointError):
    """A training step met a non-finite loss or gradient (see `TrainStep(on_nonfinite=...)`)."""


def check(policy, max_consecutive_skips, scaled: bool) -> tuple[str, int | None]:
    """Validate `on_nonfinite=` and `max_consecutive_skips=` on the host."""
    check_choice("on_nonfinite", policy, POLICIES,
                 "Use 'skip' (default: skip the update and count it), 'raise' or 'apply' (no check).")
    if policy == "apply" and scaled:
        raise bad_value("on_nonfinite", policy, "'skip' or 'raise' when a loss scale is set",
                        "A loss scale must skip overflowing updates; pass loss_scale=None to apply every update.")
    if max_consecutive_skips is not None:
        max_consecutive_skips = check_int("max_consecutive_skips", max_consecutive_skips, minimum=1,
                                          fix="Pass e.g. max_consecutive_skips=100, or None to never stop.")
    return policy, max_consecutive_skips


class NoCheck(nn.Cell):
    """``"apply"`` without a loss scale: every update is applied; no state, no metrics."""

    metric_names = ()

    def all_finite(self, grads):
        return True

    def flags(self, grads):
        return ()

    def record(self, finite):
        return finite

    def metrics(self, flags):
        return ()


class FiniteCheck(nn.Cell):
    """The finite check with its skip counters; in raise mode also a per-parameter flag vector."""

    def __init__(self, prefix: str, per_param: bool):
        super().__init__()
        self.skipped = ms.Parameter(ms.Tensor(0, ms.int32), name=f"{prefix}.skipped", requires_grad=False)
        self.in_row = ms.Parameter(ms.Tensor(0, ms.int32), name=f"{prefix}.skipped_in_row", requires_grad=False)
        self.per_param = per_param
        self.metric_names = ("skipped", "skipped_in_row") + ((FLAGS,) if per_param else ())

    def all_finite(self, grads):
        """One bool: every element of every gradient is finite (see the module docstring)."""
        return ops.equal(ops.addn(_map.MAP(_map.nonfinite_mark, grads)), 0.0)

    def flags(self, grads):
        """One bool per gradient (raise mode only): which parameters' gradients are finite."""
        if not self.per_param:
            return ()
        return (ops.stack(_map.MAP(_map.all_finite, grads)),)

    def record(self, finite):
        """Count a skipped update; returns `finite`, after the counters are written."""
        missed = ops.logical_not(finite).astype(ms.int32)
        done = ops.assign_add(self.skipped, missed)
        done = ops.depend(ops.assign(self.in_row, (self.in_row + missed) * missed), done)  # 0 after an update
        return ops.depend(finite, done)

    def metrics(self, flags):
        return (self.skipped + 0, self.in_row + 0) + tuple(flags)


def stage(policy: str, prefix: str) -> nn.Cell:
    """The check for `policy`."""
    if policy == "apply":
        return NoCheck()
    return FiniteCheck(prefix, per_param=policy == "raise")


def host_check(metrics: dict, *, policy: str, max_in_row: int | None, scaled: bool, names: list,
               groups: dict) -> None:
    """After a call: raise `NonFiniteError` as the policy says. Pops the internal flag vector."""
    flags = metrics.pop(FLAGS, None)
    if policy == "apply":
        return
    if policy == "raise":
        loss = float(metrics["loss"].asnumpy())
        if not np.isfinite(loss):
            raise NonFiniteError(
                f"on_nonfinite='raise': the loss is {loss} (not finite); this window's update is skipped. "
                "Check the batch for NaN/Inf values and the forward for log(0), division by 0 or sqrt of a "
                "negative; on_nonfinite='skip' skips such updates and counts them instead.")
        bad = [n for n, ok in zip(names, np.asarray(flags.asnumpy()).reshape(-1)) if not ok] if flags is not None else []
        if bad and not scaled:
            by_group = {}
            for n in bad:
                by_group.setdefault(groups.get(n, "all"), []).append(n)
            where = "; ".join(f"{g}: {', '.join(repr(n) for n in ns[:5])}" + (f" and {len(ns) - 5} more" if len(ns) > 5
                                                                                 else "") for g, ns in by_group.items())
            raise NonFiniteError(
                f"on_nonfinite='raise': the loss is finite ({loss:.6g}) but the gradient is not finite for "
                f"{len(bad)} parameter(s) ({where}); the update is skipped. Check the learning rate (too high), "
                "operations with unbounded gradients (sqrt or log near 0), or use loss_scale='dynamic' under fp16.")
    if max_in_row is not None and "skipped_in_row" in metrics:
        in_row = int(metrics["skipped_in_row"])
        if in_row >= max_in_row:
            raise NonFiniteError(
                f"{in_row} updates in a row were skipped because their gradient was not finite "
                f"(max_consecutive_skips={max_in_row}); the weights are those of the last finite update. Check "
                "the data for NaN/Inf, lower the learning rate, or with fp16 let the loss scale fall "
                "(loss_scale='dynamic'); raise max_consecutive_skips or pass None to go on regardless.")
