"""`TrainStep`: the user's forward function and optimizer, compiled into one training step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mindspore import nn

import contextlib
import time

from . import _compile, _core, _discover, _porting
from . import accumulate as _accumulate
from . import ema as _ema
from . import groups as _groups
from . import nonfinite as _nonfinite
from . import precision as _precision
from ._errors import bad_type, check_bool, check_choice, check_int
from ._graph import StepGraph
from .dist import reduce as _reduce
from .optimize.pass_ import check_settings as _check_optimize, rewritable, run_with_settings

_UNSET = object()  # loss_scale not given: the precision level picks the default


def _check_optimizer(optimizer: Any) -> None:
    params = getattr(optimizer, "parameters", None)
    if not callable(optimizer) or params is None or len(params) == 0:
        raise bad_type(
            "optimizer", optimizer,
            "a MindSpore optimizer (an `nn.Optimizer` such as `nn.Adam`, or a "
            "`mindspore.experimental.optim` optimizer) that owns at least one parameter",
            "Build it from your network, e.g. `nn.Adam(net.trainable_params(), 1e-3)`.")


@dataclass(frozen=True)
class StepSettings:
    """A `TrainStep`'s settings, validated on the host before anything is built (`check`)."""

    name: str
    jit: bool
    compiler: str
    accumulate: int
    normalize: str
    precision: _precision.Plan
    guards: bool
    debug: bool
    optimize: dict | None
    reduce: str | None
    world_size: int
    update: _core.Update

    @classmethod
    def check(cls, forward, optimizer, *, jit, compiler, name, accumulate, normalize, precision, keep_fp32, guards,
              debug, optimize, reduce, update: dict) -> "StepSettings":
        """Every argument of `TrainStep` but the networks, or one error naming the argument, the value,
        the valid choices and the fix."""
        _core.check_function("forward", forward, "forward(*batch) -> loss",
                             "Pass the function itself, e.g. `TrainStep(forward, opt)`, not its result.")
        _check_optimizer(optimizer)
        for arg, value in (("jit", jit), ("guards", guards), ("debug", debug)):
            check_bool(arg, value)
        check_choice("compiler", compiler, _compile.COMPILERS,
                     "Use 'cell' (GRAPH_MODE Cell, the default) or 'function' (mindspore.jit).")
        _core.check_name(name, "mindstep", [optimizer])
        k = check_int("accumulate", accumulate, minimum=1, fix="Pass the number of micro-batches per update, e.g. accumulate=4.")
        check_choice("normalize", normalize, _accumulate.NORMALIZE,
                     "Use 'mean' when forward returns a mean loss, 'count' when it returns (loss_sum, count).")
        plan = _core.check_precision(precision, keep_fp32)
        if update["loss_scale"] is _UNSET:  # the precision level picks the default
            update = dict(update, loss_scale="dynamic" if plan.dynamic_loss_scale else None)
        checked = _core.Update.check(**update)
        checked.check_trained_by(optimizer)
        mode, world = _reduce.resolve(reduce)
        return cls(name=name, jit=jit, compiler=compiler, accumulate=k, normalize=normalize, precision=plan,
                   guards=guards, debug=debug, optimize=_check_optimize(optimize, jit), reduce=mode, world_size=world,
                   update=checked)


class _LossHolder(nn.Cell):
    """`TrainStep.from_net`'s parameter-free loss Cell, held as the sub-Cell `loss`."""

    def __init__(self, loss: nn.Cell):
        super().__init__()
        self.loss = loss

    def construct(self, *args):
        return self.loss(*args)


class TrainStep(_core.StepMethods):
    """Compile `forward` + gradients + `optimizer` into one graph-mode training step.

    Args:
        forward: the user's function `forward(*batch)`; returns a scalar loss tensor, `(loss, aux)`
            where `aux` is a dict of tensors that come back as metrics, or `(loss, tensor, ...)` as
            MindSpore's tutorials return for `value_and_grad(..., has_aux=True)`: the tensors after
            the loss come back as the metrics ``aux1``, ``aux2``, ... (their place in the tuple). It
            must not scale its loss with a loss scaler (pass the scaler as `loss_scale=`) nor divide
            it by the accumulation steps (the step averages them); the step refuses the first and
            warns about the second (`mindstep.PortingWarning`). It must be a
            `def` (MindSpore cannot compile lambdas), or a method of your Cell or object. The step
            finds the networks it uses by reading its code (`mindstep._discover.find`): closures,
            the globals and attributes it uses (`net`, `self.net`), the functions and methods it
            calls. Those that own optimizer parameters (`step.nets`) are put in training mode
            (`set_train(True)`) at every call, as `nn.TrainOneStepCell` does, so BatchNorm uses
            batch statistics; call `net.set_train(False)` yourself before evaluating.
        optimizer: a MindSpore optimizer; gradients are taken over `optimizer.parameters`.
        jit: compile the step (default) or run it eagerly in PyNative for debugging; both run
            the same stage pipeline, so results agree to float tolerance.
        compiler: how to compile when `jit=True`: ``"cell"`` (a GRAPH_MODE Cell, default: the
            faster one measured here, and it sees host-side weight writes) or ``"function"``
            (`mindspore.jit`).
        name: prefix of every Parameter the step creates (``"<name>.step"``, ...). Must not
            clash with your own Parameter names or an optimizer's (`accum.*`, `moment1.*`).
        loss_scale: None, ``"dynamic"`` (start 2**16, halve on overflow, double after 2000 finite
            updates, never below 1), a float >= 1 (static), or a `mindspore.amp` loss scaler
            (`mindstep.loss_scale.dynamic(init, factor, period)` builds a validated one). With a
            loss scale, a non-finite update is skipped entirely (see `mindstep._graph`).
        accumulate: k >= 1; each call is one micro-batch and the optimizer runs on every k-th call
            with the mean of the k gradients (or the token mean with `normalize="count"`).
        normalize: ``"mean"`` (forward returns a mean loss) or ``"count"`` (forward returns
            `(loss_sum, count)`; the update divides the window's gradient sum by its total count).
        clip_grad_norm: clip the global L2 norm of the unscaled, accumulated gradient to this limit.
        clip_grad_value: clamp every gradient element to [-v, v] (applied before the norm clip).
        ema: decay in (0, 1) of an exponential moving average of the weights; see `ema_weights()`.
        precision: ``"O0"`` (default), ``"O1"``, ``"O2"``, ``"O3"``, a policy string such as
            ``"p=f32,c=f16,o=f32"`` or a `mindstep.Precision`; see `mindstep.precision` for exactly
            what each level casts. O2/O3 turn on ``loss_scale="dynamic"`` unless `loss_scale` is given.
            Refused for a network already converted by `mindspore.amp.auto_mixed_precision`,
            `custom_mixed_precision` or `to_float(float16)`: keep one of the two conversions.
        keep_fp32: Cell types and/or name patterns (``[nn.BatchNorm2d, "head.*"]``) kept in float32.
        lr_schedule: a `mindstep.schedules` schedule, evaluated inside the graph from the update
            counter; sets every optimizer group's LR (keeping the groups' ratios) before each update.
        losses: `mindstep.losses.weighted({...})` or `mindstep.losses.uncertainty([...])`: forward
            returns a dict of named losses and the step optimises their combination.
        guards: with ``compiler="function"`` (default on), weights written from the host after
            compiling are detected and re-synced (one recompile) instead of being silently ignored by
            the stale compiled copy. (A recompile after the first call is logged with its reason
            whatever this is.)
        debug: on the first call, print each stage's shapes and dtypes (inputs, loss, aux, gradient
            norms per parameter group, loss scale) from the host, once; the step's results are unchanged.
        optimize: run the composed-operator pass (`mindstep.optimize`) on the networks at the first
            call's shapes, before compiling; `step.optimize_report` holds the decision table and
            `step.optimize_budget_mb` the memory budget it kept to. `True` uses the default budget
            (`mindstep.optimize.pass_.budget_mb`: a quarter of the native step's peak, with the
            process's memory before the pass plus a lower bound of what the native step adds,
            `mindstep.optimize.memory.native_growth_mb`, standing in for it); a dict sets
            `native_peak_mb` (the native step's measured peak, e.g. from `mindstep bench`), or
            `memory_budget_mb` (a number of MB, or None for no cap), `cache_dir`, `measure`,
            `force` (fixed forms per layer-name pattern, see `mindstep.optimize`), `share`
            (False: measure every layer shape instead of sharing decisions across widths) and
            `fuse` (True: the pass measures and the step compiles with MindSpore's graph-kernel
            fusion, `mindstep.optimize.fusion`: the bench BERT's step 91.6 -> 46.2 ms on one
            CPU, for a longer first compile; `mindstep bench --modes jit-opt,jit-opt-fuse` measures it).
        on_nonfinite: ``"skip"`` (default), ``"raise"`` or ``"apply"``: what an update whose
            gradient holds NaN/Inf does (`mindstep.nonfinite`): skipped entirely and counted
            (metrics `skipped`, `skipped_in_row`), skipped then `mindstep.NonFiniteError` naming the
            loss or the parameters, or applied as it is (no check; not with a loss scale).
        max_consecutive_skips: with ``"skip"``, raise `NonFiniteError` after this many skipped
            updates in a row (default 100; None: never).
        reduce: data parallel (`mindstep launch` + `mindstep.init_distributed()`): ``"auto"``
            (default: ``"mean"`` when the process is one of several workers, else nothing),
            ``"mean"`` (the update is the mean over every rank's data, equal to one process on the
            concatenated batch; with `normalize="count"` the global token mean), ``"sum"`` (the sum
            of the ranks' means) or None (no communication). One all-reduce per applied update, at
            the accumulation boundary, before unscale, the finite check and clipping, so every rank
            skips or applies together (`mindstep.dist.reduce`). `step.metric_scopes` says which
            metrics are this rank's (`loss`, aux) and which are the reduced gradient's (`grad_norm`).
        nets: the networks `forward` trains, for what reading its code cannot see (a network
            built inside forward, reached through a computed key or `getattr`); used as given.
            When some optimizer parameters belong to no found network, the step warns
            (`mindstep.NetworkWarning`), or raises if `precision`, `keep_fp32` or `optimize` is
            set, since those settings would silently miss that network.

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
        ['applied', 'loss', 'skipped', 'skipped_in_row', 'step']

    Note:
        Unlike `nn.TrainOneStepCell`, which takes a `WithLossCell`, `TrainStep` takes any function
        returning a loss, and returns named metrics instead of a bare loss.
    """

    def __init__(self, forward: Callable, optimizer: Any, *, jit: bool = True, compiler: str = "cell",
                 name: str = "mindstep", loss_scale: Any = _UNSET, accumulate: int = 1, normalize: str = "mean",
                 clip_grad_norm: float | None = None, clip_grad_value: float | None = None,
                 ema: float | None = None, precision: Any = "O0", keep_fp32=(), lr_schedule=None,
                 losses=None, guards: bool = True, debug: bool = False, optimize: bool = False, nets=None,
                 on_nonfinite: str = "skip", max_consecutive_skips: int | None = _nonfinite.DEFAULT_MAX_CONSECUTIVE_SKIPS,
                 reduce: str | None = "auto"):
        self.config = StepSettings.check(
            forward, optimizer, jit=jit, compiler=compiler, name=name, accumulate=accumulate, normalize=normalize,
            precision=precision, keep_fp32=keep_fp32, guards=guards, debug=debug, optimize=optimize, reduce=reduce,
            update=dict(loss_scale=loss_scale, clip_grad_norm=clip_grad_norm, clip_grad_value=clip_grad_value, ema=ema,
                        lr_schedule=lr_schedule, losses=losses, on_nonfinite=on_nonfinite,
                        max_consecutive_skips=max_consecutive_skips))
        config = self.config
        self.forward, self.optimizer = forward, optimizer
        self._find_networks(nets, precision, keep_fp32)
        stages = dict(_core.update_stages(optimizer, config.update, config.name, config.reduce, config.world_size),
                      normalize=config.normalize, accumulate=_accumulate.stage(list(optimizer.parameters),
                                                                               config.accumulate, config.name))
        # k = 1: every stage in one graph; k > 1: the micro-step graph (see mindstep._graph)
        self.graph = StepGraph(forward, optimizer, part="full" if config.accumulate == 1 else "micro",
                               compiled=config.jit, **stages)
        self._param_names = [p.name for p in optimizer.parameters]
        # what each metric describes once ranks reduce: the batch this rank saw, or the reduced update
        reduced = "all ranks" if self.reduce else "this process"
        self.metric_scopes = {n: ("this rank" if self.reduce else "this process") if n == "loss" else reduced
                              for n in self.graph.metric_names}
        self._group_of = {n: label for label, names in _groups.labelled_groups(optimizer) for n in names}
        self._watch_all = _core.watched(self.graph, self.cells)
        runner = dict(jit=config.jit, compiler=config.compiler, name=config.name, watch=self._watch_all,
                      guards=config.guards)
        self._runner = _compile.Runner(self.graph, **runner)
        # k > 1: every k-th call also runs the update graph on the accumulators, no forward
        self._update_runner = None if config.accumulate == 1 else _compile.Runner(
            StepGraph(forward, optimizer, part="update", compiled=config.jit, **stages), **runner)
        self._micro = 0  # calls into the current window, mirrored from `<name>.micro`
        self.optimize_report = None
        self.optimize_s = 0.0
        self.optimize_budget_mb = None

    def _find_networks(self, nets, precision, keep_fp32) -> None:
        """The networks `forward` uses (`mindstep._discover`), checked for the tutorials' idioms that
        train wrong inside a step, in training mode and converted to the step's precision."""
        config, optimizer = self.config, self.optimizer
        needs = ([f"precision={precision!r}"] if config.precision.scope != "none" else []) + (
            [f"keep_fp32={keep_fp32!r}"] if _precision.check_keep(keep_fp32) else []) + (
            ["optimize=..."] if config.optimize is not None else [])
        losses = config.update.losses
        networks = _discover.resolve(self.forward, optimizer, nets, needs=needs,
                                     owners=[losses] if isinstance(losses, nn.Cell) else [])
        _porting.check_scaler_calls(networks.scaler_calls)
        if config.precision.scope != "none":
            _porting.check_converted(networks.trained, precision)
        _porting.check_predivided(self.forward, config.accumulate)
        self.cells = networks.cells
        self.nets = networks.trained
        # what `optimize=` rewrites: the trained networks and the Cells without any parameter that
        # forward uses (its loss: an `nn.CrossEntropyLoss` inside it is a layer of the pass), not a
        # frozen network's (those have parameters, just no trainable ones); a loss that is itself a
        # layer of the pass (`loss_fn = nn.CrossEntropyLoss()` called by forward) has no parent Cell
        # to hold a replacement, so it is left out
        self._pass_nets = self.nets + [c for c in networks.loss_cells if next(c.get_parameters(), None) is None
                                       and not rewritable(c)]
        _discover.train_mode(self.nets)
        self.cast_cells = _precision.apply(config.precision, self.nets, networks.loss_cells)

    # the settings, read-only (`self.config` holds them)
    name = property(lambda self: self.config.name)
    accumulate = property(lambda self: self.config.accumulate)
    normalize = property(lambda self: self.config.normalize)
    precision = property(lambda self: self.config.precision)
    loss_scaler = property(lambda self: self.config.update.loss_scale)
    on_nonfinite = property(lambda self: self.config.update.on_nonfinite)
    max_consecutive_skips = property(lambda self: self.config.update.max_consecutive_skips)
    reduce = property(lambda self: self.config.reduce)
    world_size = property(lambda self: self.config.world_size)
    debug = property(lambda self: self.config.debug)
    optimize = property(lambda self: self.config.optimize)

    def settings(self) -> dict:
        """The step's settings as JSON values (repr for objects): what a checkpoint manifest records."""
        config = self.config
        return {"name": config.name, "jit": self.jit, "compiler": self.compiler, "accumulate": config.accumulate,
                "normalize": config.normalize, **config.update.manifest(),
                "precision": _core.precision_manifest(config.precision), "keep_fp32": repr(config.precision.keep_fp32),
                "optimizer": type(self.optimizer).__name__, "optimize": self._optimize_manifest()}

    @classmethod
    def from_net(cls, net: nn.Cell, loss_fn: Callable, optimizer: Any, **kwargs) -> "TrainStep":
        """Build a step for the common case `loss_fn(net(x), *targets)`.

        Example:
            `step = TrainStep.from_net(net, nn.CrossEntropyLoss(), opt)`, then
            `step(images, labels)["loss"]`.
        """
        if not isinstance(net, nn.Cell):
            raise bad_type("net", net, "a mindspore.nn.Cell", "Pass your network instance.")
        if not callable(loss_fn):
            raise bad_type("loss_fn", loss_fn, "a callable `loss_fn(logits, *targets)` such as nn.CrossEntropyLoss()",
                           "Pass an instance (`nn.MSELoss()`), not the class or its result.")

        if kwargs.get("optimize", False) not in (False, None) and isinstance(loss_fn, nn.Cell) \
                and next(loss_fn.get_parameters(), None) is None:
            # held by a Cell of ours, so that `optimize=` can put a composed form of the loss (see
            # `mindstep.optimize.cross_entropy`) in its place; the caller's loss Cell is not changed
            loss_fn = _LossHolder(loss_fn)

        def forward(x, *targets):
            return loss_fn(net(x), *targets)

        kwargs.setdefault("nets", [net])
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
        """How many times MindSpore compiled this step for a new input (0 when `jit=False`): the
        forward graph's compiles (one per input signature). An accumulating step's update graph
        takes no inputs and compiles once; `update_compile_count` counts it."""
        return self._runner.compile_count

    @property
    def update_compile_count(self) -> int:
        """Compiles of the update graph of an accumulating step (0 for accumulate=1 or before the first update)."""
        return 0 if self._update_runner is None else self._update_runner.compile_count

    def resync(self) -> None:
        """Re-read the host's mirrors of the step's state from its Parameters (after a checkpoint
        load): the position inside the accumulation window."""
        if self._update_runner is not None:
            self._micro = int(self.graph.accumulate.micro.asnumpy())

    def _lr_stages(self) -> list:
        return [(self.graph.lr, self.optimizer)]

    @contextlib.contextmanager
    def ema_weights(self):
        """Swap the EMA shadow weights into the network for evaluation; restore the live weights
        after the block, also when it raises.

        Example:
            `with step.ema_weights(): evaluate(net)`.
        """
        if not isinstance(self.graph.ema, _ema.EMA):
            raise ValueError("ema_weights() needs a step built with `ema=<decay>`, but this one has ema=None. "
                             "Pass e.g. TrainStep(..., ema=0.999).")
        with self.graph.ema.swapped():
            yield

    def _prepare(self, batch, what: str = "step(*batch)") -> tuple:
        """The batch as tensors, the networks in training mode, and before the first compile the
        composed-operator pass (`optimize=`) and the debug report."""
        if not batch:
            raise ValueError(f"{what} needs at least one batch element, but got none. "
                             "Call it with the tensors your forward function takes, e.g. step(x, y).")
        tensors = tuple(_compile.to_tensor(i, b) for i, b in enumerate(batch))
        _discover.train_mode(self.nets)
        if self.optimize is not None and self.optimize_report is None:
            t0 = time.perf_counter()
            with self._fusion():
                self.optimize_report, self.optimize_budget_mb = run_with_settings(
                    self._pass_nets, self.forward, self.optimize, inputs=tensors)
            self.optimize_s = time.perf_counter() - t0
        if self.debug and self.compile_count == 0 and not getattr(self, "_debugged", False):
            self._debugged = True
            from ._debug import report

            print(report(self, tensors), flush=True)
        return tensors

    def compile(self, *batch) -> int:
        """Compile the step for `batch`'s shapes and dtypes without training on it: the composed-
        operator pass (with `optimize=`) and every graph of the step (an accumulating step's update
        graph too) are built now, so the first call only executes. Nothing is updated: no weight,
        counter or optimizer state changes. Only for the default ``compiler="cell"``; returns the
        number of graphs compiled (0 when they were compiled already).

        Example:
            `step.compile(images, labels)`, then `m = step(images, labels)` runs without compiling.
        """
        if self.compiler != "cell":
            raise ValueError(f"step.compile(*batch) builds a GRAPH_MODE Cell step ahead of its first call, but this "
                             f"step runs as compiler={self.compiler!r} (valid: 'cell'). Build it with "
                             "TrainStep(..., jit=True, compiler='cell') (the default), or let its first call compile it.")
        tensors = self._prepare(batch, "step.compile(*batch)")
        with self._fusion():
            try:
                compiled = self._runner.compile(*tensors)
            except (TypeError, ValueError, IndexError) as error:
                raise _compile.step_failure(error, self._runner.signatures, tensors) from None
            if self._update_runner is not None and self._update_runner.compile_count == 0:
                compiled += self._update_runner.compile()
        return compiled

    def __call__(self, *batch) -> dict:
        """Run one training step on `batch` and return the metrics dict."""
        tensors = self._prepare(batch)
        with self._fusion():  # a graph compiled now (the first call, a new shape) is fused as the rest
            try:
                values, aux_values, aux_keys = self._runner(*tensors)
            except (TypeError, ValueError, IndexError) as error:
                raise _compile.step_failure(error, self._runner.signatures, tensors) from None
            self._micro = (self._micro + 1) % self.accumulate
            update = None
            if self._update_runner is not None and self._micro == 0:  # the window is complete: update
                update, _, _ = self._update_runner()
        if update is not None:
            values = tuple(values[:1]) + tuple(update[1:])  # the loss is the micro-batch's
        metrics = dict(zip(self.graph.metric_names, values))
        for key, value in zip(aux_keys, aux_values):
            if key in metrics:
                raise ValueError(f"forward returned an aux metric named {key!r}, which is reserved for the step's "
                                 f"own metrics {sorted(metrics)}. Rename it, e.g. 'aux_{key}'.")
            metrics[key] = value
        _nonfinite.host_check(metrics, policy=self.on_nonfinite, max_in_row=self.max_consecutive_skips,
                              scaled=self.loss_scaler is not None, names=self._param_names,
                              groups=self._group_of)
        return metrics
