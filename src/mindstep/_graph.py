"""The step graph: one MindSpore Cell whose `construct` is the whole training step.

Canonical stage order (STYLE.md principle 1). Every call runs, in this order:

1. **inputs**: batch elements arrive as tensors (host side converts Python scalars to tensors).
2. **precision**: floating inputs are cast to the compute dtype; integer labels and masks never.
3. **forward**: the user's `forward(*batch)` gives the loss (or `(loss, aux)`).
4. **scale**: the loss is multiplied by the current loss scale.
5. **grads**: `value_and_grad` of the scaled loss over `optimizer.parameters`.
6. **accumulate**: on a micro-step the gradients are only added to accumulators.
   At the accumulation boundary (every k-th call) the remaining stages run once:
7. **all-reduce**: gradients are averaged across data-parallel ranks.
8. **unscale**: gradients are divided by the loss scale (and by k, or by the token count).
9. **finite check**: if any gradient is inf/NaN the whole update is skipped: optimizer, EMA,
   update counter and LR schedule position stay as they were; the loss scale shrinks.
10. **clip**: by global norm and/or by value, on the unscaled, accumulated gradient.
11. **optimizer**: the user's MindSpore optimizer applies the update.
12. **EMA**: shadow weights follow the new weights.
13. **counters**: the applied-update counter advances (it drives the LR schedules).

The stages are small Cells composed here; a stage that is switched off is an identity that
compiles to nothing, so the order is written once, not re-branched per feature. Each stage's
changing state lives in `Parameter`s named ``<prefix>.<stage>.*``, created before compiling.
Metrics leave the graph as a flat tuple whose names `StepGraph.metric_names` lists, plus the
user's aux dict; the host zips them into the metrics dict.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops


def _loss_and_aux(forward):
    """Wrap `forward` so it always returns `(loss, aux_dict)` and check the loss is a scalar."""

    def loss_and_aux(*batch):
        out = forward(*batch)
        if isinstance(out, tuple):
            if len(out) != 2:
                raise ValueError("forward must return `loss` or `(loss, aux)` where aux is a dict of tensors; "
                                 "it returned a tuple whose length is not 2.")
            loss, aux = out[0], out[1]
        else:
            loss, aux = out, {}
        if loss.ndim != 0:
            raise ValueError("forward must return a scalar loss (a 0-d tensor); reduce it with `.mean()` "
                             "or `.sum()` inside forward.")
        return loss, aux

    return loss_and_aux


class Counter(nn.Cell):
    """An int32 Parameter counting applied updates: the position LR schedules read."""

    def __init__(self, name: str):
        super().__init__()
        self.value = ms.Parameter(ms.Tensor(0, ms.int32), name=name, requires_grad=False)

    def construct(self):
        ops.assign_add(self.value, ms.Tensor(1, ms.int32))
        return self.value + 0


class StepGraph(nn.Cell):
    """forward -> grads -> optimizer -> counter, as one graph (see the module docstring)."""

    metric_names = ("loss", "step")

    def __init__(self, forward, optimizer, *, prefix: str):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        self.grad_fn = ms.value_and_grad(_loss_and_aux(forward), None, optimizer.parameters, has_aux=True)
        self.counter = Counter(f"{prefix}.step")

    def construct(self, *batch):
        (loss, aux), grads = self.grad_fn(*batch)
        loss = ops.depend(loss, self.optimizer(grads))
        step = self.counter()
        return (loss, step), aux
