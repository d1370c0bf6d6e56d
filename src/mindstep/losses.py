"""Multi-task losses: `forward` returns a dict of named losses; the step optimises a combination.

- `weighted({"sr": 1.0, "adv": 5e-3})`: fixed weights, `total = sum_i w_i * L_i`.
- `uncertainty(["sr", "adv"])`: learned homoscedastic-uncertainty weights (Kendall, Gal & Cipolla,
  2018) in the common log-variance form `total = sum_i exp(-s_i) * L_i + s_i`, with `s_i`
  trainable Parameters (start 0, i.e. weight 1). At the optimum `exp(-s_i) = 1 / L_i`: a task
  whose loss stays large is down-weighted, a task with a small loss up-weighted. Add its
  parameters to the optimizer: `nn.Adam(net.trainable_params() + weighting.trainable_params(), ...)`.

Both report every component as metric `loss/<name>` (and `weight/<name>`, the weight applied);
the step's `loss` metric is the combined total.
"""
from __future__ import annotations

import re

import mindspore as ms
from mindspore import nn, ops

from ._errors import bad_type, bad_value, check_float

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_names(arg: str, names) -> tuple:
    names = tuple(names)
    if not names:
        raise bad_value(arg, names, "at least one loss name", "Example: ('sr', 'adv').")
    for n in names:
        if not isinstance(n, str) or not _NAME.match(n):
            raise bad_value(arg, n, "identifier-like loss names", "Use names such as 'sr', 'adv', 'perceptual'.")
    if len(set(names)) != len(names):
        raise bad_value(arg, names, "distinct names", "List each loss once.")
    return names


class Weighted(nn.Cell):
    """Fixed weights; see `weighted`."""

    def __init__(self, weights: dict):
        super().__init__()
        if not isinstance(weights, dict):
            raise bad_type("weights", weights, "a dict {loss name: weight}", "Example: weighted({'sr': 1.0, 'adv': 5e-3}).")
        self.names = _check_names("weights", weights)
        self.weights = tuple(check_float(f"weights[{n!r}]", weights[n], low=0.0) for n in self.names)

    def construct(self, losses):
        total = ops.zeros((), ms.float32)
        parts = {}
        for name, w in zip(self.names, self.weights):
            value = losses[name].astype(ms.float32)
            total = total + value * w
            parts["loss/" + name] = value
        return total, parts


class Uncertainty(nn.Cell):
    """Learned weights; see `uncertainty`. Owns the Parameter `<name>.log_var` (one entry per loss)."""

    def __init__(self, names, name: str = "uncertainty"):
        super().__init__()
        self.names = _check_names("names", names)
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_value("name", name, "an identifier", "Example: name='uncertainty'.")
        self.log_var = ms.Parameter(ops.zeros(len(self.names), ms.float32), name=f"{name}.log_var")

    def construct(self, losses):
        total = ops.zeros((), ms.float32)
        parts = {}
        for i, name in enumerate(self.names):
            value = losses[name].astype(ms.float32)
            s = self.log_var[i]
            total = total + ops.exp(-s) * value + s
            parts["loss/" + name] = value
            parts["weight/" + name] = ops.exp(-s)
        return total, parts


def weighted(weights: dict) -> Weighted:
    """Combine named losses with fixed weights: `TrainStep(forward, opt, losses=weighted({...}))`."""
    return Weighted(weights)


def uncertainty(names, name: str = "uncertainty") -> Uncertainty:
    """Combine named losses with learned uncertainty weights (remember to optimise its parameters)."""
    return Uncertainty(names, name)
