"""Gradient clipping by value and by global norm, and the global norm itself.

Order: by value first, then by global norm, so the final global norm is <= the limit.
The reported `grad_norm` is the norm before any clipping.
Clipping by norm multiplies every gradient by `limit / max(norm, limit)`: exactly the limit when
the norm exceeds it, untouched otherwise, so clipping twice changes nothing.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from . import _map


def global_norm(grads):
    """The L2 norm of all gradients together, in float32."""
    return ops.sqrt(ops.addn(_map.MAP(_map.square_sum, grads)))


class Clip(nn.Cell):
    """Clip by value (`value`) and/or global norm (`norm`); either may be None."""

    def __init__(self, norm: float | None, value: float | None):
        super().__init__()
        self.norm_limit = norm
        self.value_limit = value
        self.metric_names = () if norm is None else ("grad_norm",)

    def norm(self, grads):
        if self.norm_limit is None:
            return ms.Tensor(float("nan"), ms.float32)
        return global_norm(grads)

    def construct(self, grads, norm, in_place=False):
        """`in_place`: `grads` are float32 Parameters (the accumulators), clipped where they are; the
        returned tuple is the same Parameters (MindSpore orders later reads after these writes)."""
        if self.value_limit is not None:
            if in_place:
                _map.MAP(ops.partial(_map.clamp_into, self.value_limit), grads)
            else:
                grads = _map.MAP(ops.partial(_map.clamp, self.value_limit), grads)
            if self.norm_limit is not None:
                norm = global_norm(grads)
        if self.norm_limit is not None:
            factor = self.norm_limit / ops.maximum(norm, self.norm_limit)
            if in_place:
                _map.MAP(ops.partial(_map.scale_into, factor), grads)
            else:
                grads = _map.MAP(ops.partial(_map.scale, factor), grads)
        return grads

    def metrics(self, norm):
        return () if self.norm_limit is None else (norm,)
