"""The step graph: one MindSpore Cell whose `construct` is the whole training step.

Canonical stage order. Every call runs, in this order:

1. **inputs**: batch elements arrive as tensors (host side converts Python scalars to tensors).
2. **precision**: the networks run their Cells in the compute dtype (set on the host with
   `Cell.to_float` before compiling); only floating inputs are cast, never labels or masks.
3. **forward**: the user's `forward(*batch)` gives the loss (or `(loss, aux)`); with
   `losses=` (mindstep.losses) a dict of named losses is combined into one.
4. **scale**: the loss is multiplied by the current loss scale.
5. **grads**: `value_and_grad` of the scaled loss over `optimizer.parameters`.
6. **accumulate**: on a micro-step the gradients are only added to accumulators.
   At the accumulation boundary (every k-th call) the remaining stages run once:
7. **all-reduce**: with data parallel (`mindstep.dist.reduce`), gradients (and, for the mean, the
   window's weight) are summed across ranks, once per update: micro-steps never communicate.
8. **unscale**: gradients are divided by the loss scale (and by k, or by the token count).
9. **finite check**: if any gradient is inf/NaN the whole update is skipped: optimizer, EMA,
   update counter and LR schedule position stay as they were; the loss scale shrinks; the skip
   is counted (`mindstep.nonfinite`: skip, raise, or with ``on_nonfinite="apply"`` no check).
10. **clip**: by global norm and/or by value, on the unscaled, accumulated gradient.
11. **optimizer**: the LR schedule sets each group's LR from the update counter, then the
    user's MindSpore optimizer applies the update.
12. **EMA**: shadow weights follow the new weights.
13. **counters**: the applied-update counter advances (it drives the LR schedules).

The stages are small Cells composed here; a stage that is switched off is an identity that
compiles to nothing, so the order is written once, not re-branched per feature. An accumulating
step (k > 1) is two compiled graphs over the same stages and Parameters: the micro-step graph
(stages 1-6), run at every call, and the update graph (stages 7-13 on the accumulators, no
forward), run after it at every k-th call; the host counts the calls. A tensor `if boundary:` in
one graph cost compile time and memory, and MindSpore 2.10 leaked ~5 KB of host memory per call
with it nested around the finite check (measured: RSS 518 -> 538 MB over 5,000 calls of a small
MLP step; flat with two graphs). An update graph without the forward compiles in a fraction of the
forward's time, where a second forward-and-backward graph for the boundary doubled it. Each stage's
changing state lives in `Parameter`s named ``<prefix>.<stage>.*``, created before compiling.
Metrics leave the graph as a flat tuple whose names `StepGraph.metric_names` lists, plus the
user's aux values and keys as two tuples; the host zips them into the metrics dict.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from . import _map
from ._context import pynative_mode


# A forward's positional aux outputs, `(loss, logits, ...)` as MindSpore's tutorials return them with
# `value_and_grad(..., has_aux=True)`, are named by their place in the returned tuple.
AUX_NAMES = tuple(f"aux{i}" for i in range(1, 65))
# The first words of the errors mindstep's own checks raise while MindSpore compiles the step (they
# reach the user through MindSpore's exception, see `mindstep._compile.step_failure`).
OWN_ERRORS = ("forward returned", "forward must")


def aux_items(aux):
    """(values, names) of a forward's aux outputs: a dict's, or a tuple's named by position."""
    if isinstance(aux, dict):
        return tuple(aux.values()), tuple(aux.keys())
    for item in aux:
        if not isinstance(item, ms.Tensor):
            raise ValueError("forward returned a tuple whose items after the loss are not all tensors; return "
                             "`loss`, `(loss, tensor, ...)` or `(loss, {'name': tensor, ...})`.")
    if len(aux) > len(AUX_NAMES):
        raise ValueError(f"forward returned more than {len(AUX_NAMES)} outputs after the loss; return them as a "
                         "dict: `(loss, {'name': tensor, ...})`.")
    return aux, AUX_NAMES[:len(aux)]


def _objective(forward, scale, normalize: str, combine):
    """Wrap `forward` as `objective(*batch) -> (scaled objective, (loss, weight, aux, parts))`.

    `forward`'s output: a tuple's first element is the value and the rest are aux outputs, either
    one dict of named tensors or tensors named by position (`AUX_NAMES`). The value:
    `normalize="mean"`: a loss; the objective is the loss and the weight 1. `normalize="count"`:
    `(sum, count)`; the objective is the sum, the weight the count, and the reported loss
    `sum / count` (aux outputs follow the pair: `((sum, count), ...)`). With a multi-task `combine`
    (mindstep.losses): a dict of named losses; the objective is their combination and `parts` holds
    each component.

    Written out as one function per setting, with no helper calls: each function the graph calls is
    compiled on its own, and these ran on every step's first call.
    """
    if combine is not None:
        def objective(*batch):
            out = forward(*batch)
            value, aux = (out[0], out[1:]) if isinstance(out, tuple) else (out, {})
            if len(aux) == 1 and isinstance(aux[0], dict):
                aux = aux[0]
            if not isinstance(value, dict):
                raise ValueError("forward must return a dict of named losses with losses=..., or that dict "
                                 "followed by aux outputs: `(losses_dict, ...)`.")
            total, parts = combine(value)
            total = _map.CAST(total, ms.float32)
            return scale.scale(total), (total, ms.Tensor(1.0, ms.float32), aux, parts)
    elif normalize == "count":
        def objective(*batch):
            out = forward(*batch)
            value, aux = (out[0], out[1:]) if isinstance(out, tuple) and isinstance(out[0], tuple) else (out, ())
            if len(aux) == 1 and isinstance(aux[0], dict):
                aux = aux[0]
            if not isinstance(value, tuple) or len(value) != 2:
                raise ValueError("forward must return `(loss_sum, count)` with normalize='count', or that pair "
                                 "followed by aux outputs: `((loss_sum, count), ...)`.")
            if value[0].ndim != 0:
                raise ValueError("forward must return a scalar loss sum (a 0-d tensor); reduce it with `.sum()` "
                                 "inside forward.")
            total, weight = _map.CAST(value[0], ms.float32), _map.CAST(value[1], ms.float32)
            return scale.scale(total), (total / weight, weight, aux, {})
    else:
        def objective(*batch):
            out = forward(*batch)
            # `{}` for no aux: the dict path of aux_items, fewer graph nodes than an empty tuple's loop
            loss, aux = (out[0], out[1:]) if isinstance(out, tuple) else (out, {})
            if len(aux) == 1 and isinstance(aux[0], dict):
                aux = aux[0]
            if isinstance(loss, (tuple, dict)):
                raise ValueError("forward returned a structure where the loss should be; return `loss`, "
                                 "`(loss, aux...)`, `(loss_sum, count)` with normalize='count', or a dict of "
                                 "named losses with losses=mindstep.losses.weighted({...}).")
            if loss.ndim != 0:
                raise ValueError("forward must return a scalar loss (a 0-d tensor); reduce it with `.mean()` "
                                 "or `.sum()` inside forward.")
            loss = _map.CAST(loss, ms.float32)
            return scale.scale(loss), (loss, ms.Tensor(1.0, ms.float32), aux, {})
    return objective


class Counter(nn.Cell):
    """An int32 Parameter counting applied updates: the position LR schedules read."""

    def __init__(self, name: str):
        super().__init__()
        self.value = ms.Parameter(ms.Tensor(0, ms.int32), name=name, requires_grad=False)

    def increment(self):
        ops.assign_add(self.value, ms.Tensor(1, ms.int32))
        return True


class Stages(nn.Cell):
    """Stages 7-13 for one optimizer, with its metrics: the part of the pipeline that
    `StepGraph` and each objective of `mindstep.gan.GANStep` share. A subclass sets the stage
    attributes (`optimizer`, `scale`, `accumulate`, `clip`, `ema`, `lr`, `finite`, `reduce`,
    `counter`) and the two constants `identity_unscale` and `in_place`."""

    def names(self) -> tuple:
        """The names of `_metrics`' values, in order."""
        return ("loss", "step", "applied") + self.scale.metric_names + self.clip.metric_names \
            + self.lr.metric_names + self.finite.metric_names

    def _metrics(self, loss, applied, finite, norm, lrs, flags):
        """The flat metric tuple, in `metric_names` order."""
        return ((loss, self.counter.value + 0, applied) + self.scale.metrics(finite) + self.clip.metrics(norm)
                + self.lr.metrics(lrs) + self.finite.metrics(flags))

    def _update(self, grads, total_weight, lrs):
        """Stages 7-13, once per accumulation window."""
        grads, total_weight = self.reduce(grads, total_weight)
        if not self.identity_unscale:  # k = 1 without loss scaling: nothing to divide
            factor = self.scale.unscale_factor() / total_weight
            if self.in_place:
                _map.MAP(ops.partial(_map.scale_into, factor), grads)
            else:
                grads = _map.MAP(ops.partial(_map.mul, factor), grads)
        finite = self.finite.all_finite(grads)
        norm = self.clip.norm(grads)
        if finite:
            grads = self.clip(grads, norm, self.in_place)
            self.lr.assign(lrs)
            self.optimizer(grads)
            self.ema.update()
            self.counter.increment()
        # `finite` threads through `record` and `adjust`: a stage call whose result is dropped made
        # MindSpore 2.10 mis-compile the step (a float64 `Tensor(True)`, or `_all_finite` run as nested
        # Python), or warn that "side effect nodes were eliminated by mistake" (no loss scale)
        finite = self.finite.record(finite)
        finite = self.scale.adjust(finite)
        self.accumulate.reset()
        # as a tensor: without a finite check `finite` is the Python constant True
        return ops.logical_and(ms.Tensor(True), finite), norm


class StepGraph(Stages):
    """The canonical pipeline (see the module docstring), composed from stage Cells."""

    PARTS = ("full", "micro", "update")

    def __init__(self, forward, optimizer, *, counter, normalize: str, scale, accumulate, clip, ema, lr,
                 finite, reduce, combine=None, part: str = "full", compiled: bool = True):
        """`part`: "full" (k = 1: every stage in one graph), "micro" (stages 1-6 only) or "update"
        (stages 7-13 on the accumulators; the graph takes no inputs). `compiled`: the Cell runs as a
        compiled graph, not eagerly (`in_place` needs MindSpore's in-place kernels, graph-only on CPU)."""
        super().__init__(auto_prefix=False)
        if part not in self.PARTS:
            raise ValueError(f"part must be one of {self.PARTS}, got {part!r}")
        self.optimizer = optimizer
        self.scale = scale
        self.accumulate = accumulate
        self.clip = clip
        self.ema = ema
        self.lr = lr
        self.finite = finite
        self.reduce = reduce
        self.combine = combine
        if part != "update":
            # built in PyNative: under a global GRAPH_MODE, MindSpore 2.10 builds a staged (jit) grad
            # function instead, which an eager step cannot call ("The pointer[seq_abs] is null")
            with pynative_mode():
                self.grad_fn = ms.value_and_grad(_objective(forward, scale, normalize, combine), None,
                                                 optimizer.parameters, has_aux=True)
        self.counter = counter
        # a Python constant: each part compiles only its own stages
        self.part = part
        self.metric_names = self.names()
        self.identity_unscale = accumulate.k == 1 and not scale.metric_names and normalize == "mean" \
            and not reduce.active
        # The update graph's gradients are the accumulators, reset at the end of every update: unscale
        # and clip them where they are instead of holding a second copy of every gradient until the
        # optimizer is done (float32 only, where `g * factor` keeps the dtype, so the values are the
        # same bits as the copying path's).
        # (Not after a reduction: the reduced gradients are new tensors; not in an eager step, see
        # `_map.scale_into`.)
        self.in_place = compiled and part == "update" and not reduce.active \
            and all(a.dtype == ms.float32 for a in accumulate.acc)

    def construct(self, *batch):
        if self.part == "update":
            grads, total_weight = self.accumulate.totals()
            lrs = self.lr.values(self.counter.value)
            flags = self.finite.flags(grads)
            finite, norm = self._update(grads, total_weight, lrs)
            # the micro-step graph that ran just before reports the loss and the user's aux values
            return self._metrics(ms.Tensor(float("nan"), ms.float32), finite, finite, norm, lrs, flags), (), ()
        (_, (loss, weight, aux, parts)), grads = self.grad_fn(*batch)
        if self.part == "micro":  # add in place: no copy of the sums (the update graph reads them)
            self.accumulate.add(grads, weight)
            grads = self.accumulate.acc
        else:  # k = 1: this batch is the whole window
            total_weight = weight
        lrs = self.lr.values(self.counter.value)
        # on_nonfinite="raise": which parameters' (accumulated) gradients are finite, every call, so the
        # host can raise at the first micro-step that brings a non-finite value into the window
        flags = self.finite.flags(grads)
        if self.part == "full":
            finite, norm = self._update(grads, total_weight, lrs)
            applied = finite
        else:
            finite = ms.Tensor(True)
            norm = ms.Tensor(float("nan"), ms.float32)
            applied = ms.Tensor(False)
        metrics = self._metrics(loss, applied, finite, norm, lrs, flags)
        # Returning the aux dict itself makes MindSpore 2.10 compile ~3x slower (ResNet-18: 8.7 s vs
        # 3.0 s); its values and its (constant) keys as two tuples compile at the normal speed.
        values, names = aux_items(aux)
        return metrics, tuple(parts.values()) + values, tuple(parts.keys()) + names
