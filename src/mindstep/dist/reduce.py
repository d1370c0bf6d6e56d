"""Stage 7 of the step: the gradients reduced across data-parallel ranks, once per applied update.

It runs at the accumulation boundary only (the update graph, or the k = 1 graph), never in a
micro-step, and before unscale, the finite check and clipping, so every rank sees the same
gradients and makes the same skip decision (a NaN on one rank is a NaN in the sum). The reduction
is MindSpore's `nn.DistributedGradReducer` summing the gradients; what follows divides by the
window's weight, so the mean is a matter of which weight:
- ``"mean"``: the weights are summed too (micro-batches, or tokens with `normalize="count"`), so the
  update is the mean over every rank's data: two ranks on half batches equal one on the full batch,
  and unequal token counts per rank give the global token mean;
- ``"sum"``: the weight stays this rank's, so the update is the sum of the ranks' means.
"""
from __future__ import annotations

from mindspore import nn, ops

from .._errors import check_choice
from . import context

REDUCE = ("auto", "mean", "sum")


class NoReduce(nn.Cell):
    """One process, or `reduce=None`: the gradients stay this rank's."""

    active = False
    world = 1

    def construct(self, grads, weight):
        return grads, weight


class Reduce(nn.Cell):
    """Sum the gradients over the ranks (and, for ``"mean"``, the window's weight)."""

    active = True

    def __init__(self, params, mode: str, world: int):
        super().__init__()
        self.mode = mode
        self.world = world
        self.reducer = nn.DistributedGradReducer(params, mean=False, degree=world)
        self.all_reduce = ops.AllReduce()  # SUM: the only reduction mccl has on CPU

    def construct(self, grads, weight):
        grads = self.reducer(grads)
        if self.mode == "mean":
            weight = self.all_reduce(weight)
        return grads, weight


def resolve(reduce):
    """`reduce=` as (mode or None, world size), validated on the host."""
    if reduce is None:
        return None, 1
    check_choice("reduce", reduce, REDUCE,
                 "Use 'auto' (average across ranks when launched by msrun / mindstep launch), 'mean', 'sum' or None.")
    world = context.world_size()
    if world == 1:
        if reduce == "auto":
            return None, 1
        raise ValueError(f"`reduce` must be 'auto' or None in a single process, but got {reduce!r}: no "
                         "distributed job is initialised. Launch the script with `mindstep launch --nproc N -- "
                         "python train.py` and call `mindstep.init_distributed()` before building the step, or "
                         "pass reduce='auto'.")
    return ("mean" if reduce == "auto" else reduce), world


def stage(params, mode, world: int) -> nn.Cell:
    """The stage for a `resolve`d `(mode, world)`."""
    return NoReduce() if mode is None else Reduce(params, mode, world)
