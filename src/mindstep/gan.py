"""`GANStep`: a generator and a discriminator, two optimizers, one compiled pipeline.

A GAN iteration has two objectives, each with its own optimizer, loss scale, LR schedule,
clipping, finite check and EMA (the stages of `mindstep._graph`, one set per objective, named
``<name>.d.*`` and ``<name>.g.*``). One call, ``step(*batch)``, runs in this order:

1. **generate, once**: ``fake = generator(*batch[:g_inputs])`` under `mindspore.vjp`, which keeps
   what the generator's backward needs; the generator's forward is not run again.
2. **D** (``order="d_first"``, the default): ``d_loss(stop_gradient(fake), *batch)`` is
   differentiated over the discriminator's parameters only, scaled by D's loss scale, and D's
   stages 7-13 run (reduce, unscale, finite check, clip, LR, optimizer, EMA, counter). The
   detached `fake` means no D gradient reaches the generator.
3. **G**: ``g_loss(fake, *batch)`` is differentiated with respect to `fake` only (so D's
   parameters get no gradient and the G update never moves D), through the discriminator *as
   updated in 2*; the vector-Jacobian product of step 1 carries that gradient into the generator's
   parameters; G's stages 7-13 run.

This equals the hand-written two-step loop ``fake = G(x); D step on fake.detach(); G step on
g_loss(G(x))``: D's update does not change the generator, so the generator's second forward in
that loop computes the same `fake` (tested bit-identical, PyNative and compiled), and here it is
not computed twice. ``order="g_first"`` runs 3 before 2 (G against the discriminator before its
update, then D on the same detached `fake`), which is the order of ESRGAN's reference code
(BasicSR's `ESRGANModel.optimize_parameters`: optimize net_g with net_d frozen, then net_d).

An overflow (a non-finite gradient) in one objective skips that objective's update and shrinks
its loss scale only; the other objective's update is applied. With ``d_steps_per_g=n`` the
discriminator updates every iteration and the generator every n-th (n-critic), and with
``g_warmup=w`` the first w iterations update the generator only. The host picks, from its mirror of
the iteration counter ``<name>.iteration``, one of three graphs (both objectives, D only, G only),
each compiled once on first use; D only runs the generator's forward without its backward.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import mindspore as ms
from mindspore import nn, ops

from . import _compile, _core, _discover, _porting
from ._context import pynative_mode
from . import ema as _ema
from . import groups as _groups
from . import nonfinite as _nonfinite
from . import precision as _precision
from ._errors import bad_type, bad_value, check_bool, check_choice, check_int
from ._graph import Counter, Stages, _objective, aux_items
from .accumulate import NoAccumulate
from .dist import reduce as _reduce
from .optimize.pass_ import check_settings as _check_optimize

ORDERS = ("d_first", "g_first")
OBJECTIVES = ("d", "g")
OPTION_KEYS = _core.UPDATE_KEYS


def _options(which: str, options: Any, default_scale) -> _core.Update:
    """One objective's settings (`d_options`, `g_options`), validated on the host."""
    arg = f"{which}_options"
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise bad_type(arg, options, f"a dict with keys among {OPTION_KEYS}",
                       f"Example: {arg}={{'loss_scale': 'dynamic', 'clip_grad_norm': 1.0}}.")
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise bad_value(arg, options, f"a dict with keys among {OPTION_KEYS}", f"Remove or rename {unknown}.")
    return _core.Update.check(lambda key: f"{arg}[{key!r}]", learned_losses=False,
                              **dict(options, loss_scale=options.get("loss_scale", default_scale)))


def _check_optimizer(arg: str, optimizer, net: nn.Cell, other: nn.Cell) -> None:
    params = getattr(optimizer, "parameters", None)
    if not callable(optimizer) or not params:
        raise bad_type(arg, optimizer, "a MindSpore optimizer that owns at least one parameter",
                       f"Build it from the network, e.g. nn.Adam({arg[:1]}.trainable_params(), 1e-4).")
    mine = {id(p) for p in net.get_parameters()}
    theirs = {id(p) for p in other.get_parameters()}
    foreign = [p.name for p in params if id(p) in theirs or id(p) not in mine]
    if foreign:
        raise bad_value(arg, foreign[:5], "parameters of its own network only",
                        f"Build {arg} from that network's trainable_params(); a parameter shared with the other "
                        "network, or of neither, would be moved by the wrong objective.")


def _distinct_state(d_optimizer, g_optimizer) -> None:
    """Give the two optimizers' own state Parameters distinct names where they clash.

    MindSpore optimizers name their state without a prefix (`global_step`, `learning_rate`,
    Adam's `beta1_power`, ...), so two of one kind in one graph share names; MindSpore 2.10 then
    renames Parameters at compile time ('d.0.weight' became 'd.optimizer.d.0.weight', measured),
    and a checkpoint could not tell the two `global_step`s apart. The clashing state of each is
    renamed `d_optimizer.<name>` / `g_optimizer.<name>`; the networks' weights keep their names.
    """
    d_names = {p.name for p in d_optimizer.get_parameters()}
    g_names = {p.name for p in g_optimizer.get_parameters()}
    own = {id(p) for p in list(d_optimizer.parameters) + list(g_optimizer.parameters)}
    for label, optimizer in (("d_optimizer", d_optimizer), ("g_optimizer", g_optimizer)):
        for p in optimizer.get_parameters():
            if id(p) not in own and p.name in d_names & g_names:
                p.name = f"{label}.{p.name}"


class Objective(Stages):
    """One objective's stages 7-13 (k = 1: no accumulation) and its metrics."""

    def __init__(self, optimizer, update: _core.Update, prefix: str, reduce_mode, world: int):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        stages = _core.update_stages(optimizer, update, prefix, reduce_mode, world)
        self.counter, self.scale, self.clip, self.ema = stages["counter"], stages["scale"], stages["clip"], stages["ema"]
        self.lr, self.finite, self.reduce, self.combine = stages["lr"], stages["finite"], stages["reduce"], stages["combine"]
        self.accumulate = NoAccumulate()
        self.identity_unscale = not self.scale.metric_names and not self.reduce.active
        self.in_place = False
        self.metric_names = self.names()

    def apply(self, loss, grads):
        """Stages 7-13 on this objective's gradients; the metric tuple."""
        lrs = self.lr.values(self.counter.value)
        flags = self.finite.flags(grads)
        finite, norm = self._update(grads, ops.ones((), ms.float32), lrs)
        return self._metrics(loss, finite, finite, norm, lrs, flags)


class GANGraph(nn.Cell):
    """One compiled GAN iteration for a phase: ``"dg"`` (both objectives, in `order`), ``"d"`` or ``"g"``."""

    PHASES = ("dg", "d", "g")

    def __init__(self, generator, d_loss, g_loss, d: Objective, g: Objective, iteration: Counter, *,
                 g_inputs: int, order: str, phase: str):
        super().__init__(auto_prefix=False)
        self.generator = generator
        self.d = d
        self.g = g
        self.counter = iteration  # the checkpoint's "step": iterations run
        self.g_inputs = g_inputs
        self.order = order
        self.phase = phase
        with pynative_mode():  # as in `_graph.StepGraph`: an eager step needs PyNative grad functions
            self.d_grad = ms.value_and_grad(_objective(d_loss, d.scale, "mean", d.combine), None,
                                            d.optimizer.parameters, has_aux=True)
            self.g_grad = ms.value_and_grad(_objective(g_loss, g.scale, "mean", g.combine), 0, None, has_aux=True)
        self.g_params = g.optimizer.parameters

    def construct(self, *batch):
        x = batch[:self.g_inputs]
        if self.phase == "d":  # the generator's forward only, no backward to keep
            fake = ops.stop_gradient(self.generator(*x))
            d_out = self._d_phase(fake, batch)
            self.counter.increment()
            return d_out, ()
        fake, vjp_fn = ms.vjp(self.generator, *x, weights=self.g_params)
        if self.phase == "g":
            g_out = self._g_phase(fake, vjp_fn, batch)
            self.counter.increment()
            return (), g_out
        if self.order == "d_first":
            d_out = self._d_phase(ops.stop_gradient(fake), batch)
            g_out = self._g_phase(ops.depend(fake, d_out[0][2]), vjp_fn, batch)
        else:
            g_out = self._g_phase(fake, vjp_fn, batch)
            d_out = self._d_phase(ops.depend(ops.stop_gradient(fake), g_out[0][2]), batch)
        self.counter.increment()
        return d_out, g_out

    def _d_phase(self, fake, batch):
        (_, (loss, _, aux, parts)), grads = self.d_grad(fake, *batch)
        return _phase_outputs(self.d.apply(loss, grads), aux, parts)

    def _g_phase(self, fake, vjp_fn, batch):
        (_, (loss, _, aux, parts)), dfake = self.g_grad(fake, *batch)
        grads = vjp_fn(dfake)[1]  # (the inputs' gradients, the weights' gradients)
        return _phase_outputs(self.g.apply(loss, grads), aux, parts)


def _phase_outputs(metrics, aux, parts):
    """One objective's outputs: its metrics, then its loss parts' and aux outputs' values and names."""
    values, names = aux_items(aux)
    return metrics, tuple(parts.values()) + values, tuple(parts.keys()) + names


class GANStep(_core.StepMethods):
    """Train a generator and a discriminator, each with its own optimizer and stages, in one compiled step.

    Args:
        generator: the generator Cell, called as ``generator(*batch[:g_inputs])``.
        discriminator: the discriminator Cell (the losses call it; `GANStep` puts it in training
            mode and casts it for `precision`).
        d_loss: ``d_loss(fake, *batch) -> loss`` (or ``(loss, aux)``): the discriminator's loss;
            `fake` arrives detached.
        g_loss: ``g_loss(fake, *batch) -> loss``, ``(loss, aux)``, or with
            ``g_options={"losses": mindstep.losses.weighted({...})}`` a dict of named losses
            (reported as ``loss/g/<name>``).
        d_optimizer: a MindSpore optimizer over the discriminator's own parameters.
        g_optimizer: a MindSpore optimizer over the generator's own parameters.
        g_inputs: how many leading batch elements the generator takes (default 1: ``batch[0]``).
        order: ``"d_first"`` (default) or ``"g_first"`` (see the module docstring).
        d_steps_per_g: the generator updates every this many iterations (n-critic); D every one.
        g_warmup: the first this many iterations update the generator only.
        d_options: the discriminator objective's ``loss_scale``, ``clip_grad_norm``,
            ``clip_grad_value``, ``ema``, ``lr_schedule``, ``on_nonfinite``,
            ``max_consecutive_skips``, as `TrainStep` takes them.
        g_options: the generator objective's, the same keys and ``losses``.
        precision: one precision level or policy for both networks (`TrainStep(precision=)`); its
            default loss scale (dynamic under O2/O3) applies to each objective unless its options
            set one.
        keep_fp32: as for `TrainStep`.
        jit: as for `TrainStep`.
        compiler: as for `TrainStep`.
        name: the prefix of the step's Parameters: ``<name>.d.*``, ``<name>.g.*`` and
            ``<name>.iteration``.
        reduce: data parallel, as for `TrainStep`.
        optimize: the composed-operator pass over both networks (`TrainStep(optimize=)`), run at
            the first call before anything compiles.

    Returns:
        A callable: ``step(*batch) -> dict`` of metrics named per objective: ``loss/d``,
        ``loss/g``, ``loss/g/<part>``, ``applied/d``, ``step/g``, ``loss_scale/d``, ``grad_norm/g``,
        ``lr/d``, ``skipped/g``, ...; an objective that does not run in an iteration reports only
        ``applied/<o>`` (False). The user's aux values come back as ``<key>/<o>``.

    Example:
        `step = GANStep(G, D, d_loss, g_loss, nn.Adam(D.trainable_params(), 1e-4),
        nn.Adam(G.trainable_params(), 1e-4), g_options={"ema": 0.999})`, then `m = step(lr_images,
        hr_images)` and `float(m["loss/d"])`, `float(m["loss/g"])`; the GAN how-to page runs a whole one.
    """

    # settings that change what the saved state means (see mindstep.checkpoint.STRUCTURAL)
    STRUCTURAL = ("kind", "d_ema", "g_ema", "d_loss_scale", "g_loss_scale", "d_on_nonfinite", "g_on_nonfinite")

    def __init__(self, generator: nn.Cell, discriminator: nn.Cell, d_loss: Callable, g_loss: Callable,
                 d_optimizer: Any, g_optimizer: Any, *, g_inputs: int = 1, order: str = "d_first",
                 d_steps_per_g: int = 1, g_warmup: int = 0, d_options: dict | None = None,
                 g_options: dict | None = None, precision: Any = "O0", keep_fp32=(), jit: bool = True,
                 compiler: str = "cell", name: str = "gan", reduce: str | None = "auto", optimize: Any = False):
        for arg, net in (("generator", generator), ("discriminator", discriminator)):
            if not isinstance(net, nn.Cell):
                raise bad_type(arg, net, "a mindspore.nn.Cell", f"Pass your {arg} network instance.")
        if generator is discriminator:
            raise bad_value("discriminator", discriminator, "a network other than the generator",
                            "Pass the two networks of the GAN.")
        for arg, fn in (("d_loss", d_loss), ("g_loss", g_loss)):
            _core.check_function(arg, fn, f"{arg}(fake, *batch) -> loss", "Pass the function itself.")
        _check_optimizer("d_optimizer", d_optimizer, discriminator, generator)
        _check_optimizer("g_optimizer", g_optimizer, generator, discriminator)
        self.g_inputs = check_int("g_inputs", g_inputs, minimum=1, fix="Pass how many leading batch elements "
                                  "the generator takes, e.g. g_inputs=1 for step(lr_image, hr_image).")
        check_choice("order", order, ORDERS, "Use 'd_first' (D then G, default) or 'g_first' (ESRGAN's reference order).")
        self.d_steps_per_g = check_int("d_steps_per_g", d_steps_per_g, minimum=1,
                                       fix="Pass e.g. d_steps_per_g=5 for five D updates per G update.")
        self.g_warmup = check_int("g_warmup", g_warmup, minimum=0, fix="Pass 0 (no warm-up) or a number of iterations.")
        check_bool("jit", jit)
        optimize = _check_optimize(optimize, jit)
        check_choice("compiler", compiler, _compile.COMPILERS, "Use 'cell' (default) or 'function'.")
        _core.check_name(name, "gan", [d_optimizer, g_optimizer])
        plan = _core.check_precision(precision, keep_fp32)
        default_scale = "dynamic" if plan.dynamic_loss_scale else None
        d_opts = _options("d", d_options, default_scale)
        g_opts = _options("g", g_options, default_scale)
        if d_opts.losses is not None:
            raise bad_value("d_options['losses']", d_opts.losses, "None",
                            "Named loss parts are for the generator's objective (g_options); return (loss, aux) "
                            "from d_loss to report parts of it.")
        self.reduce, self.world_size = _reduce.resolve(reduce)
        _distinct_state(d_optimizer, g_optimizer)
        for arg, fn in (("d", d_loss), ("g", g_loss)):
            _porting.check_scaler_calls(_discover.find(fn).scaler_calls, "GANStep",
                                        f"GANStep(..., {arg}_options={{'loss_scale': loss_scaler}})")
        if plan.scope != "none":
            _porting.check_converted([generator, discriminator], precision, "GANStep")
        self.generator, self.discriminator = generator, discriminator
        self.cells = [generator, discriminator]
        self.nets = self.cells
        _discover.train_mode(self.nets)
        self.precision = plan
        self.cast_cells = _precision.apply(plan, self.nets)
        self.name, self.order, self.jit_enabled = name, order, jit
        self.options = {"d": d_opts, "g": g_opts}
        self.optimizers = {"d": d_optimizer, "g": g_optimizer}
        objectives = {o: Objective(self.optimizers[o], self.options[o], f"{name}.{o}", self.reduce, self.world_size)
                      for o in OBJECTIVES}
        self.objectives = objectives
        iteration = Counter(f"{name}.iteration")
        self._graphs = {phase: GANGraph(generator, d_loss, g_loss, objectives["d"], objectives["g"], iteration,
                                        g_inputs=self.g_inputs, order=order, phase=phase) for phase in GANGraph.PHASES}
        self.graph = self._graphs["dg"]  # holds every stage Parameter (checkpoints read it)
        self._runner_args = dict(jit=jit, compiler=compiler, name=name, watch=_core.watched(self.graph, self.cells))
        self._runners: dict = {}
        self._iteration = 0
        self._names = {o: [p.name for p in self.optimizers[o].parameters] for o in OBJECTIVES}
        self._groups = {o: {n: label for label, names in _groups.labelled_groups(self.optimizers[o]) for n in names}
                        for o in OBJECTIVES}
        self._losses = (d_loss, g_loss)
        # the composed-operator pass (its decisions are saved with checkpoints)
        self.optimize = optimize
        self.optimize_report = None
        self.optimize_budget_mb = None

    def phase(self, iteration: int) -> str:
        """Which objectives iteration `iteration` (0-based) updates: ``"dg"``, ``"d"`` or ``"g"``."""
        if iteration < self.g_warmup:
            return "g"
        return "dg" if (iteration - self.g_warmup + 1) % self.d_steps_per_g == 0 else "d"

    @property
    def iteration(self) -> int:
        """Iterations run (calls), also after a checkpoint load."""
        return self._iteration

    @property
    def compile_count(self) -> int:
        """Compiles over the phase graphs (each compiles once, on first use, per input signature)."""
        return sum(r.compile_count for r in self._runners.values())

    @property
    def compiler(self) -> str:
        return "eager" if not self.jit_enabled else self._runner_args["compiler"]

    @property
    def jit(self) -> bool:
        return self.jit_enabled

    def _lr_stages(self) -> list:
        return [(self.objectives[o].lr, self.optimizers[o]) for o in OBJECTIVES]

    def resync(self) -> None:
        """Re-read the iteration counter from its Parameter (after a checkpoint load)."""
        self._iteration = int(self.graph.counter.value.asnumpy())

    def settings(self) -> dict:
        """The step's settings as JSON values (repr for objects): what a checkpoint manifest records."""
        out = {"kind": "GANStep", "name": self.name, "jit": self.jit, "compiler": self.compiler,
               "order": self.order, "d_steps_per_g": self.d_steps_per_g, "g_warmup": self.g_warmup,
               "g_inputs": self.g_inputs, "precision": _core.precision_manifest(self.precision),
               "optimize": self._optimize_manifest()}
        for o in OBJECTIVES:
            out.update({f"{o}_{key}": value for key, value in self.options[o].manifest().items()})
            out[f"{o}_optimizer"] = type(self.optimizers[o]).__name__
        return out

    @contextlib.contextmanager
    def ema_weights(self, objective: str = "g"):
        """Swap an objective's EMA shadow weights into its network for the block (default: the generator)."""
        check_choice("objective", objective, OBJECTIVES, "Use 'g' (the generator) or 'd'.")
        stage = self.objectives[objective].ema
        if not isinstance(stage, _ema.EMA):
            raise ValueError(f"ema_weights({objective!r}) needs {objective}_options={{'ema': <decay>}}, but this "
                             f"step has no EMA for {objective!r}.")
        with stage.swapped():
            yield

    def _optimize(self, tensors) -> None:
        """The composed-operator pass over both networks, before the first compile; the probe runs
        the generator and both losses once, so every conv of either network meets its input."""
        from .optimize.pass_ import run_with_settings

        d_loss, g_loss = self._losses

        def probe(*batch):
            fake = self.generator(*batch[:self.g_inputs])
            d_loss(ops.stop_gradient(fake), *batch)
            return g_loss(fake, *batch)

        with self._fusion():
            self.optimize_report, self.optimize_budget_mb = run_with_settings(self.nets, probe, self.optimize,
                                                                              inputs=tensors)

    def _runner(self, phase: str) -> _compile.Runner:
        if phase not in self._runners:
            self._runners[phase] = _compile.Runner(self._graphs[phase], **self._runner_args)
        return self._runners[phase]

    def __call__(self, *batch) -> dict:
        if len(batch) < self.g_inputs:
            raise ValueError(f"step(*batch) got {len(batch)} batch element(s), but the generator takes the first "
                             f"g_inputs={self.g_inputs}; call it with every tensor the losses take, e.g. step(lr, hr).")
        tensors = tuple(_compile.to_tensor(i, b) for i, b in enumerate(batch))
        _discover.train_mode(self.nets)
        if self.optimize is not None and self.optimize_report is None:
            self._optimize(tensors)
        phase = self.phase(self._iteration)
        runner = self._runner(phase)
        try:
            with self._fusion():
                d_out, g_out = runner(*tensors)
        except (TypeError, ValueError, IndexError) as error:
            raise _compile.step_failure(error, runner.signatures, tensors, who="GANStep") from None
        self._iteration += 1
        metrics = {"iteration": self._iteration}
        for o, out in (("d", d_out), ("g", g_out)):
            if not out:
                metrics[f"applied/{o}"] = False
                continue
            values, aux_values, aux_keys = out
            own = dict(zip(self.objectives[o].metric_names, values))
            opts = self.options[o]
            _nonfinite.host_check(own, policy=opts.on_nonfinite, max_in_row=opts.max_consecutive_skips,
                                  scaled=opts.loss_scale is not None, names=self._names[o],
                                  groups=self._groups[o])
            metrics.update((f"{k}/{o}", v) for k, v in own.items())
            n_parts = len(self.options[o].losses.names) if self.options[o].losses is not None else 0
            for i, (key, value) in enumerate(zip(aux_keys, aux_values)):
                # the weighted parts come first, named "loss/<part>": "loss/g/<part>"; aux values "<key>/g"
                name = f"loss/{o}/{key[len('loss/'):]}" if i < n_parts else f"{key}/{o}"
                if name in metrics:
                    raise ValueError(f"{o}_loss returned an aux metric named {key!r}, which is reserved for the "
                                     f"step's own metrics; rename it, e.g. 'aux_{key}'.")
                metrics[name] = value
        return metrics
