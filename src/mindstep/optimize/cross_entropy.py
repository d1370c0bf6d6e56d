"""`nn.CrossEntropyLoss` over (rows, classes) logits and class-index labels, with a composed backward.

Why: MindSpore 2.10's CPU cross-entropy (`ops.cross_entropy`: log-softmax, then a negative
log-likelihood through one-hot products) is slow on wide logits (docs/design/measurements.md). The
composed form:

    forward:  logp = log_softmax(logits);  loss = -sum(logp[i, y_i] * m_i) / sum(m_i)
    backward: d logits = (softmax(logits) - onehot(y)) * m_i * dloss / sum(m_i)

with `m_i` = 1 where `y_i` is not `ignore_index`. The forward takes MindSpore's `LogSoftmax`
kernel and one gather (`GatherElements`) of the picked log-probabilities, where native builds a
one-hot matrix of the logits' size; the backward recomputes the softmax from the logits (the
`Softmax` kernel) and subtracts at the labels' positions with one scatter (`TensorScatterAdd`), so
only two arrays of the logits' size exist at once.

Only the common case is composed: `weight=None`, `label_smoothing=0`, reduction 'mean' or 'sum',
2-D float32 or float16 logits; the labels must be 1-D integer class indices when the step runs
(labels given as class probabilities, or of another rank, run MindSpore's own loss: the check is
made on the types and shapes at compile time, so it costs the step nothing). float16 logits are
computed in float32 and the loss is cast back. A batch whose labels are all `ignore_index` gives
NaN under 'mean', as native does.

A second form, "lse", is made of elementwise kernels and row reductions only, for graph-kernel fusion
(`optimize={'fuse': True}`, `mindstep.optimize.fusion`), which fuses those into few generated kernels
but leaves `LogSoftmax` and `Softmax` as they are:

    forward:  lse = log(sum(exp(logits - max))) + max;  loss = -sum((logits[i, y_i] - lse_i) * m_i) / sum(m_i)
    backward: d logits = (exp(logits - lse) - onehot(y)) * m_i * dloss / sum(m_i)

(the backward recomputes `lse`, and builds the labels' one-hot by comparing them with the class
indices). Under graph-kernel fusion "lse" was the faster form, unfused the slower one
(docs/design/measurements.md). The pass measures both forms, and fused
decisions have a cache key of their own, so each setting gets its own.
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

from .._errors import bad_value

FORMS = ("composed", "lse")
FORMULATION = "cross-entropy-4"  # bumped whenever the composed form changes (see `decide.FORMULATION`)

_ZEROS_LIKE = ops.ZerosLike()
_REDUCE_MAX = ops.ReduceMax(keep_dims=True)
_INT_TYPES = (mstype.int32, mstype.int64)


class _CrossEntropyFn(nn.Cell):
    """The loss of (rows, classes) logits against 1-D class labels, and its composed backward."""

    def __init__(self, ignore_index: int, reduction: str):
        super().__init__()
        self.ignore_index, self.mean = ignore_index, reduction == "mean"

    def _weights(self, labels, dtype):
        """The labels with ignored entries moved to class 0 (a valid index), and the weight of each
        row in the loss: 1/count ('mean') or 1, and 0 where the label is ignored."""
        kept = ops.not_equal(labels, self.ignore_index)
        index = labels * ops.cast(kept, labels.dtype)
        weight = ops.cast(kept, dtype)
        if self.mean:
            weight = weight / weight.sum()
        return index, weight

    def construct(self, logits, labels):
        f32 = mstype.float32
        index, weight = self._weights(labels, f32)
        logp = ops.log_softmax(ops.cast(logits, f32), -1)
        picked = ops.gather_elements(logp, 1, index.reshape(-1, 1)).reshape(-1)
        return ops.cast(-(picked * weight).sum(), logits.dtype)

    def bprop(self, logits, labels, out, dout):
        f32 = mstype.float32
        index, weight = self._weights(labels, f32)
        weight = weight * ops.cast(dout, f32)
        grad = ops.softmax(ops.cast(logits, f32), -1) * weight.reshape(-1, 1)
        rows = ops.arange(labels.shape[0]).astype(index.dtype)
        grad = ops.tensor_scatter_add(grad, ops.stack((rows, index), 1), -weight)
        return ops.cast(grad, logits.dtype), _ZEROS_LIKE(labels)


class _LseCrossEntropyFn(_CrossEntropyFn):
    """The "lse" form (see the module docstring): the loss and its backward from the rows'
    log-sum-exp, with elementwise kernels and row reductions only."""

    @staticmethod
    def _lse(x):
        # the `ReduceMax` primitive: `Tensor.max` becomes `ArgMaxWithValue`, which also computes the
        # indices and which fusion leaves alone (0.59 ms per step of the fused bench BERT)
        top = _REDUCE_MAX(x, -1)
        return ops.log(ops.exp(x - top).sum(-1, keepdims=True)) + top

    def construct(self, logits, labels):
        f32 = mstype.float32
        index, weight = self._weights(labels, f32)
        x = ops.cast(logits, f32)
        picked = ops.gather_elements(x, 1, index.reshape(-1, 1))
        return ops.cast(-((picked - self._lse(x)).reshape(-1) * weight).sum(), logits.dtype)

    def bprop(self, logits, labels, out, dout):
        f32 = mstype.float32
        index, weight = self._weights(labels, f32)
        weight = weight * ops.cast(dout, f32)
        x = ops.cast(logits, f32)
        # the labels' one-hot by an elementwise comparison, which fusion folds into the same kernel as
        # the exponential, instead of a `TensorScatterAdd` (0.31 ms per fused bench BERT step; the head
        # block 8.34 -> 8.00 and 8.58 -> 8.34 ms in two processes)
        classes = ops.arange(logits.shape[1]).astype(index.dtype).reshape(1, -1)
        hot = ops.cast(ops.equal(classes, index.reshape(-1, 1)), f32)
        grad = (ops.exp(x - self._lse(x)) - hot) * weight.reshape(-1, 1)
        return ops.cast(grad, logits.dtype), _ZEROS_LIKE(labels)


class ComposedCrossEntropy(nn.Cell):
    """An `nn.CrossEntropyLoss` (see the module docstring for which) computed as above, in `form`
    ("composed" or "lse"), for 2-D logits and 1-D integer labels, and by the original loss Cell for
    any other inputs; no parameters."""

    def __init__(self, loss: nn.CrossEntropyLoss, form: str = "composed"):
        super().__init__()
        if form not in FORMS:
            raise bad_value("form", form, f"one of {FORMS}",
                            "Omit `form` for 'composed', or pass 'lse' (see mindstep.optimize.cross_entropy).")
        self.form = form
        self.native = loss
        fn = _LseCrossEntropyFn if form == "lse" else _CrossEntropyFn
        self.fn = fn(loss.ignore_index, loss.reduction)

    def construct(self, logits, labels):
        if logits.ndim == 2 and labels.ndim == 1 and labels.dtype in _INT_TYPES:
            return self.fn(logits, labels)
        return self.native(logits, labels)


def matches(cell) -> bool:
    """The exact `nn.CrossEntropyLoss` class: a subclass may compute something else."""
    return type(cell) is nn.CrossEntropyLoss


def supported(loss: nn.CrossEntropyLoss, shape: tuple, dtype) -> tuple[bool, str]:
    import mindspore as ms

    if loss.weight is not None or loss.label_smoothing != 0.0:
        return False, "class weights or label smoothing: no composed form"
    if loss.reduction not in ("mean", "sum"):
        return False, f"reduction={loss.reduction!r}: the composed loss is built for 'mean' and 'sum'"
    if len(shape) != 2 or dtype not in (ms.float32, ms.float16):
        return False, (f"{dtype} logits of shape {tuple(shape)}: the composed loss is built for 2-D (rows, "
                       "classes) float32 and float16 logits")
    return True, ""


def config(loss: nn.CrossEntropyLoss) -> str:
    return f"cross-entropy {loss.reduction} ignore{loss.ignore_index}"


def build(loss: nn.CrossEntropyLoss, form: str) -> nn.Cell:
    return ComposedCrossEntropy(loss, form)


def out_shape(shape: tuple) -> tuple:
    return ()


def probe_args(loss: nn.CrossEntropyLoss, shape: tuple) -> tuple:
    """The labels the measurement uses: random classes, every 16th row `ignore_index`."""
    rows, classes = shape
    labels = np.random.default_rng(0).integers(0, classes, rows).astype(np.int32)
    labels[::16] = loss.ignore_index
    return (Tensor(labels),)


def extra_mb(shape: tuple) -> float:
    """Extra memory (MB, fp32) either form may add to a step, as an upper bound: two arrays of the
    logits' size ("composed": the forward's log-probabilities and the backward's softmax; "lse": the
    exponentials each direction computes)."""
    return 4.0 * 2 * int(np.prod(shape)) / 2**20
