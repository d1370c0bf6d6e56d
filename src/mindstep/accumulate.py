"""Gradient accumulation: micro-steps only add; the update uses the window's sum / its weight.

Each call adds the gradients of the (scaled) objective and a weight: 1 per micro-batch for
`normalize="mean"`, or the micro-batch's token count for `normalize="count"`. At the boundary
(every k-th call) the optimizer sees `sum of gradients / sum of weights`, so k equal-size
micro-batches give exactly the big-batch mean, and unequal token counts give the big-batch
token mean. The accumulators are cleared at every boundary, also when the update is skipped.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from . import _map

NORMALIZE = ("mean", "count")


class NoAccumulate(nn.Cell):
    """k = 1: every call is a boundary; the gradients go straight to the update."""

    k = 1

    def reset(self):
        return True


class Accumulate(nn.Cell):
    """k > 1 micro-steps per update; owns `<prefix>.acc.<param>`, `<prefix>.acc_weight`, `<prefix>.micro`."""

    def __init__(self, params, k: int, prefix: str):
        super().__init__()
        self.k = k
        # zeros made on the host: `ops.zeros` runs an eager kernel whose output stays in MindSpore's
        # memory pool after the Parameter copied it (docs/design/measurements.md)
        self.acc = ms.ParameterTuple(
            ms.Parameter(ms.Tensor(np.zeros(p.shape, np.float32), p.dtype), name=f"{prefix}.acc.{p.name}",
                         requires_grad=False)
            for p in params)
        self.weight = ms.Parameter(ms.Tensor(0.0, ms.float32), name=f"{prefix}.acc_weight", requires_grad=False)
        self.micro = ms.Parameter(ms.Tensor(0, ms.int32), name=f"{prefix}.micro", requires_grad=False)

    def add(self, grads, weight):
        """Add to the accumulators and count the micro-step, in place (the micro-step graph)."""
        # one HyperMap, not a Python loop: an unrolled loop over ResNet-18's 62 tensors compiled ~5x
        # slower and held more memory (see mindstep/_map.py). In reverse parameter order, the order
        # the backward pass makes the gradients in: MindSpore chains the additions in the order
        # written, so in forward order the first addition waited for the last gradient and every
        # gradient stayed alive until the end of the backward pass (docs/design/measurements.md)
        done = _map.MAP(ops.assign_add, tuple(self.acc)[::-1], grads[::-1])
        ops.assign_add(self.weight, ops.depend(weight, done))
        ops.assign_add(self.micro, ms.Tensor(1, ms.int32))
        return True

    def totals(self):
        """The window's gradient sum and weight (for the update graph, which runs no forward)."""
        return tuple(self.acc), self.weight + 0

    def reset(self):
        done = _map.MAP(_map.zero, self.acc)
        ops.assign(self.weight, ops.depend(ms.Tensor(0.0, ms.float32), done))
        ops.assign(self.micro, ms.Tensor(0, ms.int32))
        return True


def stage(params, k: int, prefix: str) -> nn.Cell:
    return NoAccumulate() if k == 1 else Accumulate(params, k, prefix)
