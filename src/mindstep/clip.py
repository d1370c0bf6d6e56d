"""Gradient clipping by value and by global norm, and the global norm itself.

Order: by value first, then by global norm, so the final global norm is <= the limit.
The reported `grad_norm` is the norm before any clipping.
Clipping by norm multiplies every gradient by `limit / max(norm, limit)`: exactly the limit when
the norm exceeds it, untouched otherwise, so clipping twice changes nothing.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops


def global_norm(grads):
    """The L2 norm of all gradients together, in float32."""
    total = ops.zeros((), ms.float32)
    for g in grads:
        total = total + ops.square(g.astype(ms.float32)).sum()
    return ops.sqrt(total)


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

    def construct(self, grads, norm):
        if self.value_limit is not None:
            grads = tuple(ops.clamp(g, -self.value_limit, self.value_limit) for g in grads)
            if self.norm_limit is not None:
                norm = global_norm(grads)
        if self.norm_limit is not None:
            factor = self.norm_limit / ops.maximum(norm, self.norm_limit)
            grads = tuple(g * factor.astype(g.dtype) for g in grads)
        return grads

    def metrics(self, norm):
        return () if self.norm_limit is None else (norm,)
