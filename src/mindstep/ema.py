"""Exponential moving average of the weights (shadow weights for evaluation).

After every *applied* update: `shadow <- decay * shadow + (1 - decay) * weight`. The shadows start
equal to the weights at build time and are Parameters `<prefix>.ema.<param>`, so they checkpoint
with the rest of the step state. A skipped (overflow) update leaves them untouched.
"""
from __future__ import annotations

import contextlib

import mindspore as ms
from mindspore import nn, ops

from . import _map


class NoEMA(nn.Cell):
    def update(self):
        return True


class EMA(nn.Cell):
    def __init__(self, params, decay: float, prefix: str):
        super().__init__()
        self.decay = decay
        self.params = ms.ParameterTuple(params)
        self.shadow = ms.ParameterTuple(
            ms.Parameter(ms.Tensor(p.asnumpy().copy()), name=f"{prefix}.ema.{p.name}", requires_grad=False) for p in params)

    def update(self):
        done = _map.MAP(ops.partial(_map.follow, self.decay), self.shadow, self.params)
        return ops.depend(ms.Tensor(True), done)

    @contextlib.contextmanager
    def swapped(self):
        """Swap the shadow weights into the live Parameters; restore the live ones after, also on error."""
        live = [p.asnumpy().copy() for p in self.params]
        try:
            for p, s in zip(self.params, self.shadow):
                p.set_data(ms.Tensor(s.asnumpy().copy()))
            yield
        finally:
            for p, value in zip(self.params, live):
                p.set_data(ms.Tensor(value))


def stage(params, decay: float | None, prefix: str) -> nn.Cell:
    return NoEMA() if decay is None else EMA(params, decay, prefix)



