"""`TrainStep`: the user's forward function and optimizer, compiled into one training step."""
from __future__ import annotations

import re
from typing import Any, Callable

import mindspore as ms
from mindspore import nn

from . import _compile
from ._errors import bad_type, bad_value, check_bool, check_choice
from ._graph import StepGraph

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_optimizer(optimizer: Any) -> None:
    params = getattr(optimizer, "parameters", None)
    if not callable(optimizer) or params is None or len(params) == 0:
        raise bad_type(
            "optimizer", optimizer,
            "a MindSpore optimizer (an `nn.Optimizer` such as `nn.Adam`, or a "
            "`mindspore.experimental.optim` optimizer) that owns at least one parameter",
            "Build it from your network, e.g. `nn.Adam(net.trainable_params(), 1e-3)`.")


class TrainStep:
    """Compile `forward` + gradients + `optimizer` into one graph-mode training step.

    Args:
        forward: the user's function `forward(*batch)`; returns a scalar loss tensor, or
            `(loss, aux)` where `aux` is a dict of tensors that come back as metrics. It closes
            over the network; it must be a `def` (MindSpore cannot compile lambdas).
        optimizer: a MindSpore optimizer; gradients are taken over `optimizer.parameters`.
        jit: compile the step (default) or run it eagerly in PyNative for debugging; both run
            the same stage pipeline, so results agree to float tolerance.
        compiler: how to compile when `jit=True`: ``"cell"`` (a GRAPH_MODE Cell, default: the
            faster one measured here, and it sees host-side weight writes) or ``"function"``
            (`mindspore.jit`).
        name: prefix of every Parameter the step creates (``"<name>.step"``, ...). Must not
            clash with your own Parameter names or an optimizer's (`accum.*`, `moment1.*`).

    Returns:
        A callable: `step(*batch) -> dict` of metrics; `float(m["loss"])` works.

    Example:
        >>> import numpy as np, mindspore as ms
        >>> from mindspore import nn
        >>> net = nn.Dense(4, 1)
        >>> opt = nn.SGD(net.trainable_params(), 0.1)
        >>> step = TrainStep.from_net(net, nn.MSELoss(), opt)
        >>> m = step(np.ones((8, 4), np.float32), np.zeros((8, 1), np.float32))
        >>> sorted(m)
        ['loss', 'step']

    Note:
        Unlike `nn.TrainOneStepCell`, which takes a `WithLossCell`, `TrainStep` takes any function
        returning a loss, and returns named metrics instead of a bare loss.
    """

    def __init__(self, forward: Callable, optimizer: Any, *, jit: bool = True, compiler: str = "cell",
                 name: str = "mindstep"):
        if not callable(forward):
            raise bad_type("forward", forward, "a function `forward(*batch) -> loss`",
                           "Pass the function itself, e.g. `TrainStep(forward, opt)`, not its result.")
        if getattr(forward, "__name__", "") == "<lambda>":
            raise bad_value("forward", forward, "a function defined with `def`",
                            "MindSpore cannot compile lambdas (`Parse Lambda Function Fail`); write "
                            "`def forward(x, y): return loss_fn(net(x), y)`.")
        _check_optimizer(optimizer)
        check_bool("jit", jit)
        check_choice("compiler", compiler, _compile.COMPILERS,
                     "Use 'cell' (GRAPH_MODE Cell, the default) or 'function' (mindspore.jit).")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise bad_value("name", name, "a Python identifier such as 'mindstep'",
                            "Pick a short prefix made of letters, digits and underscores.")
        taken = {p.name.split(".")[0] for p in optimizer.parameters}
        if name in taken:
            raise bad_value("name", name, f"a prefix that none of the optimizer's parameters use ({sorted(taken)})",
                            "Pass another `name=`, e.g. name='mindstep'.")
        self.forward = forward
        self.optimizer = optimizer
        self.name = name
        self.graph = StepGraph(forward, optimizer, prefix=name)
        self._runner = _compile.Runner(self.graph, jit=jit, compiler=compiler, name=name)

    @classmethod
    def from_net(cls, net: nn.Cell, loss_fn: Callable, optimizer: Any, **kwargs) -> "TrainStep":
        """Build a step for the common case `loss_fn(net(x), *targets)`.

        Example:
            >>> step = TrainStep.from_net(net, nn.CrossEntropyLoss(), opt)  # doctest: +SKIP
            >>> step(images, labels)["loss"]  # doctest: +SKIP
        """
        if not isinstance(net, nn.Cell):
            raise bad_type("net", net, "a mindspore.nn.Cell", "Pass your network instance.")
        if not callable(loss_fn):
            raise bad_type("loss_fn", loss_fn, "a callable `loss_fn(logits, *targets)` such as nn.CrossEntropyLoss()",
                           "Pass an instance (`nn.MSELoss()`), not the class or its result.")

        def forward(x, *targets):
            return loss_fn(net(x), *targets)

        step = cls(forward, optimizer, **kwargs)
        step.net = net
        return step

    @property
    def jit(self) -> bool:
        return self._runner.jit

    @property
    def compiler(self) -> str:
        """``"eager"``, ``"cell"`` or ``"function"``: how the step runs."""
        return self._runner.compiler

    @property
    def compile_count(self) -> int:
        """How many times MindSpore compiled this step (0 when `jit=False`)."""
        return self._runner.compile_count

    def state_parameters(self) -> list:
        """The Parameters this step created (counters, accumulators, ...), for checkpoints."""
        prefix = self.name + "."
        return [p for p in self.graph.get_parameters() if p.name.startswith(prefix)]

    def __call__(self, *batch) -> dict:
        """Run one training step on `batch` and return the metrics dict."""
        if not batch:
            raise ValueError("step(*batch) needs at least one batch element, but got none. "
                             "Call it with the tensors your forward function takes, e.g. step(x, y).")
        tensors = tuple(_compile.to_tensor(i, b) for i, b in enumerate(batch))
        values, aux = self._runner(*tensors)
        metrics = dict(zip(self.graph.metric_names, values))
        for key, value in aux.items():
            if key in metrics:
                raise ValueError(f"forward returned an aux metric named {key!r}, which is reserved for the step's "
                                 f"own metrics {sorted(metrics)}. Rename it, e.g. 'aux_{key}'.")
            metrics[key] = value
        return metrics
