"""Evaluation inside `fit`: the user's `eval_fn`, the built-in classification and loss metrics,
EMA weights, and one value per metric over every rank's samples.

`eval_fn(step, eval_data) -> {name: value}`. A value may be a number (under data parallel the
ranks' values are averaged, each rank counting once) or a `Mean(total, count)`: a sum and how many
samples it covers, which `fit` sums over the ranks before dividing, so the result is the mean over
every rank's samples, exactly what one process would compute on all of them. The built-ins return
`Mean`s.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from .._errors import bad_type, check_int
from ..dist import context as _dist
from . import data as _data


@dataclass(frozen=True)
class Mean:
    """A metric's sum over `count` samples; `fit` reports `total / count` over every rank."""

    total: float
    count: float

    def __float__(self) -> float:
        return float(self.total) / float(self.count) if self.count else float("nan")


def _all_reduce(values: np.ndarray) -> np.ndarray:
    """The sum over the ranks of a float64 vector (MindSpore's AllReduce, from the host)."""
    import mindspore as ms
    from mindspore import ops

    return ops.AllReduce()(ms.Tensor(values.astype(np.float32))).asnumpy().astype(np.float64)


def merge(metrics: dict, world: int) -> dict:
    """{name: float}: `Mean`s summed over the ranks, numbers averaged over them."""
    names = sorted(metrics)
    for name in names:
        value = metrics[name]
        if not isinstance(value, Mean):
            try:
                float(value)
            except (TypeError, ValueError):
                raise bad_type(f"eval_fn's value {name!r}", value, "a number or mindstep.loop.Mean(total, count)",
                               "Return e.g. {'accuracy': hits / n}, or Mean(hits, n) to weight ranks by samples.") from None
    if world == 1:
        return {n: float(metrics[n]) for n in names}
    flat = []
    for n in names:
        v = metrics[n]
        flat += [float(v.total), float(v.count)] if isinstance(v, Mean) else [float(v), 1.0]
    summed = _all_reduce(np.asarray(flat))
    return {n: float(summed[2 * i] / summed[2 * i + 1]) if summed[2 * i + 1] else float("nan")
            for i, n in enumerate(names)}


def run(step, eval_fn, eval_data, *, world: int, ema: bool) -> dict:
    """`eval_fn` once, with the EMA weights when the step keeps them, the networks in evaluation
    mode during it, merged over the ranks."""
    nets = list(getattr(step, "nets", None) or getattr(step, "cells", ()))
    for net in nets:
        net.set_train(False)
    try:
        with step.ema_weights() if ema else contextlib.nullcontext():
            values = eval_fn(step, eval_data)
    finally:
        for net in nets:
            net.set_train(True)
    if not isinstance(values, dict):
        raise bad_type("eval_fn's result", values, "a dict {metric name: value}",
                       "Return e.g. {'accuracy': 0.93} from eval_fn(step, eval_data).")
    return merge(values, world)


def classification(net=None, *, loss_fn=None, top_k=(1, 5), label: int = -1):
    """An `eval_fn` for a network mapping inputs to class logits: `accuracy` (top-1),
    `top<k>` for each other k below the number of classes, and `loss` when `loss_fn` is given, each a `Mean` over samples.

    Args:
        net: the network; None: the step's (`step.net` from `TrainStep.from_net`, or its one network).
        loss_fn: e.g. `nn.CrossEntropyLoss()`: also report the mean loss (`loss_fn` must return a mean).
        top_k: which top-k accuracies; 1 is reported as `accuracy`.
        label: the position of the labels in each batch (the other elements are the network's inputs).

    Example:
        `fit(step, train, eval_data=test, eval_fn=mindstep.loop.classification(loss_fn=nn.CrossEntropyLoss()))`.
    """
    ks = tuple(check_int("top_k", k, minimum=1) for k in top_k)

    def evaluate(step, eval_data):
        model = net if net is not None else _the_net(step)
        counts = {k: 0.0 for k in ks}
        loss_sum, n, classes = 0.0, 0, 0
        for batch in _batches(eval_data, "classification()"):
            args = _data.as_args(batch)
            inputs, labels = args[:label] + args[label + 1:] if label != -1 else args[:-1], args[label]
            logits = model(*(_tensor(a) for a in inputs))
            y = labels.asnumpy() if hasattr(labels, "asnumpy") else np.asarray(labels)
            scores = logits.asnumpy()
            classes = scores.shape[1]
            order = np.argsort(-scores, axis=1)
            for k in ks:
                counts[k] += float((order[:, :k] == y.reshape(-1, 1)).any(1).sum())
            if loss_fn is not None:
                loss_sum += float(loss_fn(logits, _tensor(labels)).asnumpy()) * len(y)
            n += len(y)
        # a top-k over k or fewer classes is always right: not reported
        out = {("accuracy" if k == 1 else f"top{k}"): Mean(counts[k], n) for k in ks if k == 1 or k < classes}
        if loss_fn is not None:
            out["loss"] = Mean(loss_sum, n)
        return out

    return evaluate


def loss(forward=None):
    """An `eval_fn` reporting `loss`: the step's forward function (or `forward`) averaged over the
    evaluation batches, weighted by their first dimension.

    Example:
        `fit(step, train, eval_data=held_out, eval_fn=mindstep.loop.loss())`.
    """

    def evaluate(step, eval_data):
        fn = forward if forward is not None else step.forward
        total, n = 0.0, 0
        for batch in _batches(eval_data, "loss()"):
            args = _data.as_args(batch)
            out = fn(*(_tensor(a) for a in args))
            value = out[0] if isinstance(out, (tuple, list)) else out
            rows = int(args[0].shape[0]) if hasattr(args[0], "shape") and args[0].shape else 1
            total += float(value.asnumpy() if hasattr(value, "asnumpy") else value) * rows
            n += rows
        return {"loss": Mean(total, n)}

    return evaluate


def _batches(eval_data, who: str):
    if eval_data is None:
        raise ValueError(f"mindstep.loop.{who} evaluates on eval_data, but fit got none; pass fit(..., eval_data=...)")
    return _data.one_pass(eval_data, rank=_dist.rank(), world=_dist.world_size())


def _tensor(value):
    import mindspore as ms

    return value if isinstance(value, ms.Tensor) else ms.Tensor(np.asarray(value))


def _the_net(step):
    net = getattr(step, "net", None)
    if net is not None:
        return net
    nets = list(getattr(step, "nets", ()))
    if len(nets) != 1:
        raise ValueError(f"classification() without net= needs a step with one network, but this step trains "
                         f"{len(nets)}; pass classification(net=my_net)")
    return nets[0]
