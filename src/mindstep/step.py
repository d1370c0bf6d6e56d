"""`TrainStep`: the user's forward function and optimizer, compiled into one training step."""
from __future__ import annotations

import re
from typing import Any, Callable

import mindspore as ms
from mindspore import nn

import contextlib
import time

from . import _compile, _discover, _porting
from . import checkpoint as _checkpoint
from . import accumulate as _accumulate
from . import clip as _clip
from . import ema as _ema
from . import groups as _groups
from . import loss_scale as _loss_scale
from . import losses as _losses
from . import nonfinite as _nonfinite
from . import precision as _precision
from . import schedules as _schedules
from ._errors import bad_type, bad_value, check_bool, check_choice, check_float, check_int
from ._graph import Counter, StepGraph
from .dist import reduce as _reduce
from .optimize import fusion as _fusion
from .optimize.pass_ import check_force, rewritable, run_with_settings

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNSET = object()  # loss_scale not given: the precision level picks the default


_OPTIMIZE_KEYS = ("native_peak_mb", "memory_budget_mb", "cache_dir", "measure", "force", "share", "fuse")


def _check_optimize(optimize: Any, jit: bool = True) -> dict | None:
    """`optimize=` as None (off) or a dict of the pass's settings; `jit`: the step's own setting (a
    PyNative step runs its ops one by one: there is nothing to fuse)."""
    if isinstance(optimize, bool):
        return {} if optimize else None
    if not isinstance(optimize, dict):
        raise bad_type("optimize", optimize, "True, False or a dict of the pass's settings",
                       "Pass `optimize=True`, or e.g. `optimize={'native_peak_mb': 1200}`.")
    unknown = sorted(set(optimize) - set(_OPTIMIZE_KEYS))
    if unknown:
        raise bad_value("optimize", optimize, f"a dict with keys among {_OPTIMIZE_KEYS}",
                        f"Remove {unknown}.")
    if "native_peak_mb" in optimize and "memory_budget_mb" in optimize:
        raise bad_value("optimize", optimize, "a dict with `native_peak_mb` or `memory_budget_mb`, not both",
                        "Give the native peak (the budget is derived from it) or the budget itself.")
    for key in ("native_peak_mb", "memory_budget_mb"):
        if optimize.get(key) is not None:
            check_float(f"optimize[{key!r}]", optimize[key], low=0.0, fix=f"e.g. optimize={{'{key}': 1200}}"
                        + (", or None for no cap." if key == "memory_budget_mb" else "."))
    for key in ("measure", "share", "fuse"):
        if key in optimize:
            check_bool(f"optimize[{key!r}]", optimize[key])
    if optimize.get("fuse"):
        if not jit:
            raise bad_value("optimize['fuse']", True, "False with jit=False",
                            "Graph-kernel fusion fuses the kernels of a compiled step; PyNative (jit=False) runs "
                            "its ops one by one. Drop 'fuse', or build the step with jit=True.")
        _fusion.check_available()
    if "force" in optimize:
        check_force(optimize["force"])
    return dict(optimize)


def _check_optimizer(optimizer: Any) -> None:
    params = getattr(optimizer, "parameters", None)
    if not callable(optimizer) or params is None or len(params) == 0:
        raise bad_type(
            "optimizer", optimizer,
            "a MindSpore optimizer (an `nn.Optimizer` such as `nn.Adam`, or a "
            "`mindspore.experimental.optim` optimizer) that owns at least one parameter",
            "Build it from your network, e.g. `nn.Adam(net.trainable_params(), 1e-3)`.")


class _LossHolder(nn.Cell):
    """`TrainStep.from_net`'s parameter-free loss Cell, held as the sub-Cell `loss`."""

    def __init__(self, loss: nn.Cell):
        super().__init__()
        self.loss = loss

    def construct(self, *args):
        return self.loss(*args)


class TrainStep:
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
        guards: runtime guards (default on): a recompile after the first call logs its reason; with
            ``compiler="function"``, weights written from the host after compiling are detected and
            re-synced (one recompile) instead of being silently ignored by the stale compiled copy.
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
        if not callable(forward):
            raise bad_type("forward", forward, "a function `forward(*batch) -> loss`",
                           "Pass the function itself, e.g. `TrainStep(forward, opt)`, not its result.")
        if getattr(forward, "__name__", "") == "<lambda>":
            raise bad_value("forward", forward, "a function defined with `def`",
                            "MindSpore cannot compile lambdas (`Parse Lambda Function Fail`); write "
                            "`def forward(x, y): return loss_fn(net(x), y)`.")
        _check_optimizer(optimizer)
        check_bool("jit", jit)
        check_bool("guards", guards)
        check_bool("debug", debug)
        optimize = _check_optimize(optimize, jit)
        check_choice("compiler", compiler, _compile.COMPILERS,
                     "Use 'cell' (GRAPH_MODE Cell, the default) or 'function' (mindspore.jit).")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise bad_value("name", name, "a Python identifier such as 'mindstep'",
                            "Pick a short prefix made of letters, digits and underscores.")
        taken = {p.name.split(".")[0] for p in optimizer.parameters}
        if name in taken:
            raise bad_value("name", name, f"a prefix that none of the optimizer's parameters use ({sorted(taken)})",
                            "Pass another `name=`, e.g. name='mindstep'.")
        k = check_int("accumulate", accumulate, minimum=1, fix="Pass the number of micro-batches per update, e.g. accumulate=4.")
        check_choice("normalize", normalize, _accumulate.NORMALIZE,
                     "Use 'mean' when forward returns a mean loss, 'count' when it returns (loss_sum, count).")
        if clip_grad_norm is not None:
            clip_grad_norm = check_float("clip_grad_norm", clip_grad_norm, low=0.0, low_open=True)
        if clip_grad_value is not None:
            clip_grad_value = check_float("clip_grad_value", clip_grad_value, low=0.0, low_open=True)
        if ema is not None:
            ema = check_float("ema", ema, low=0.0, high=1.0, low_open=True, high_open=True,
                              fix="Pass a decay such as ema=0.999 (closer to 1 = slower average).")
        plan = _precision.plan(precision, keep_fp32)
        _precision.check_device(plan, ms.get_context("device_target"))
        if loss_scale is _UNSET:
            loss_scale = "dynamic" if plan.dynamic_loss_scale else None
        scaler = _loss_scale.resolve(loss_scale)
        self.on_nonfinite, self.max_consecutive_skips = _nonfinite.check(on_nonfinite, max_consecutive_skips,
                                                                        scaled=scaler is not None)
        self.reduce, self.world_size = _reduce.resolve(reduce)
        if lr_schedule is not None and not isinstance(lr_schedule, _schedules.Schedule):
            raise bad_type("lr_schedule", lr_schedule, "a mindstep.schedules schedule or None",
                           "Example: lr_schedule=mindstep.schedules.warmup(100, mindstep.schedules.cosine_decay(1e-3, 10_000)).")
        if losses is not None and not isinstance(losses, (_losses.Weighted, _losses.Uncertainty)):
            raise bad_type("losses", losses, "mindstep.losses.weighted({...}), mindstep.losses.uncertainty([...]) or None",
                           "Example: losses=mindstep.losses.weighted({'sr': 1.0, 'adv': 5e-3}).")
        opt_ids = {id(p) for p in optimizer.parameters}
        if isinstance(losses, _losses.Uncertainty) and id(losses.log_var) not in opt_ids:
            raise bad_value("losses", losses.log_var.name, "learned weights that the optimizer trains",
                            "Add them: nn.Adam(net.trainable_params() + weighting.trainable_params(), ...).")
        needs = ([f"precision={precision!r}"] if plan.scope != "none" else []) + (
            [f"keep_fp32={keep_fp32!r}"] if _precision.check_keep(keep_fp32) else []) + (
            ["optimize=..."] if optimize is not None else [])
        networks = _discover.resolve(forward, optimizer, nets, needs=needs,
                                     owners=[losses] if isinstance(losses, nn.Cell) else [])
        # idioms of a hand-written loop that the step already does (MindSpore's tutorials): refused or warned
        _porting.check_scaler_calls(networks.scaler_calls)
        if plan.scope != "none":
            _porting.check_converted(networks.trained, precision)
        _porting.check_predivided(forward, k)
        self.cells = networks.cells
        self.nets = networks.trained
        # what `optimize=` rewrites: the trained networks and the Cells without any parameter that
        # forward uses (its loss: an `nn.CrossEntropyLoss` inside it is a layer of the pass), not a
        # frozen network's (those have parameters, just no trainable ones); a loss that is itself a
        # layer of the pass (`loss_fn = nn.CrossEntropyLoss()` called by forward) has no parent Cell
        # to hold a replacement, so it is left out, as before the pass knew losses
        self._pass_nets = self.nets + [c for c in networks.loss_cells if next(c.get_parameters(), None) is None
                                       and not rewritable(c)]
        _discover.train_mode(self.nets)
        self.precision = plan
        self.cast_cells = _precision.apply(plan, self.nets, networks.loss_cells)
        lr_stage = _schedules.NoSchedule()
        if lr_schedule is not None:
            lr_params = _groups.lr_parameters(optimizer)
            lr_stage = _schedules.ScheduleStage(lr_schedule, lr_params, _groups.lr_scales(optimizer, lr_params))
        params = list(optimizer.parameters)
        self.forward = forward
        self.optimizer = optimizer
        self.name = name
        self.loss_scaler = scaler
        self.accumulate = k
        self.normalize = normalize
        stages = dict(counter=Counter(f"{name}.step"), normalize=normalize, scale=_loss_scale.stage(scaler, name),
                      accumulate=_accumulate.stage(params, k, name), clip=_clip.Clip(clip_grad_norm, clip_grad_value),
                      ema=_ema.stage(params, ema, name), lr=lr_stage, combine=losses,
                      finite=_nonfinite.stage(self.on_nonfinite, name), reduce=_reduce.stage(params, self.reduce, self.world_size))
        # k = 1: every stage in one graph; k > 1: the micro-step graph (see mindstep._graph)
        self.graph = StepGraph(forward, optimizer, part="full" if k == 1 else "micro", compiled=bool(jit), **stages)
        self._param_names = [p.name for p in params]
        # what each metric describes once ranks reduce: the batch this rank saw, or the reduced update
        reduced = "all ranks" if self.reduce else "this process"
        self.metric_scopes = {n: ("this rank" if self.reduce else "this process") if n == "loss" else reduced
                              for n in self.graph.metric_names}
        self._group_of = {n: label for label, names in _groups.labelled_groups(optimizer) for n in names}
        watch = {id(p): p for p in self.graph.get_parameters()}
        for cell in self.cells:
            watch.update((id(p), p) for p in cell.get_parameters())
        runner = dict(jit=jit, compiler=compiler, name=name, watch=watch.values(), guards=guards)
        self._runner = _compile.Runner(self.graph, **runner)
        # k > 1: every k-th call also runs the update graph on the accumulators, no forward
        self._update_runner = None if k == 1 else _compile.Runner(
            StepGraph(forward, optimizer, part="update", compiled=bool(jit), **stages), **runner)
        self._micro = 0  # calls into the current window, mirrored from `<name>.micro`
        self.debug = debug
        self._watch_all = list(watch.values())
        self.optimize = optimize
        self.optimize_report = None
        self.optimize_s = 0.0
        self.optimize_budget_mb = None

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

    def _sync_micro(self) -> None:
        """Re-read the window position from its Parameter (after a checkpoint load)."""
        if self._update_runner is not None:
            self._micro = int(self.graph.accumulate.micro.asnumpy())

    def state_parameters(self) -> list:
        """The Parameters this step created (counters, accumulators, ...), for checkpoints."""
        prefix = self.name + "."
        return [p for p in self.graph.get_parameters() if p.name.startswith(prefix)]

    def save(self, path, *, format: str = "ckpt", keep: int | None = None):
        """Save the complete training state atomically (`mindstep.checkpoint.save`); returns the path.
        In a data-parallel job only rank 0 writes (every rank holds the same state) and the other
        ranks return None.

        Example:
            `step.save("runs/ckpt/step-000100.ckpt", keep=3)`.
        """
        return _checkpoint.save(self, path, format=format, keep=keep)

    def load(self, path, *, strict: bool = True) -> dict:
        """Load a checkpoint into this step in place (`mindstep.checkpoint.load`); returns its manifest.

        Example:
            `step.load(mindstep.checkpoint.latest("runs/ckpt"))`.
        """
        return _checkpoint.load(self, path, strict=strict)

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

    def _fusion(self):
        """The block the pass, the compiles and the calls run in (`mindstep.optimize.fusion`)."""
        return _fusion.for_settings(self.optimize)

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
