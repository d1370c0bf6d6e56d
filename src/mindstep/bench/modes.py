"""The bench's modes: each builds a `run(batch) -> loss tensor` training step from the same model.

- `pynative`: mindstep's TrainStep with jit=False.
- `jit`: mindstep's TrainStep compiled (GRAPH_MODE Cell), plain fp32 layers.
- `jit-all`: `jit` with every gradient-pipeline feature on (`FEATURES`), to price them in one run.
- `jit-nocheck`: `jit` without the default finite check (`on_nonfinite="apply"`), to price it.
- `jit-accum`: `jit` with `accumulate=K` (`--accumulate`, default 4) at the same micro-batch: what
  accumulation costs and saves against `jit` (one batch) and `jit-big`.
- `jit-big`: `jit` on batches K times as large (the batch `jit-accum`'s window adds up to).
- `jit-opt`: compiled with the best settings for this device (see `OPT_SETTINGS`); the composed-
  operator pass keeps to a memory budget that the runner calibrates against the `jit` row's measured
  peak (run first; see `runner.calibrate_budget`), or the one given by `--opt-memory-budget`.
- `jit-opt-fuse`: `jit-opt` with MindSpore's graph-kernel fusion (`optimize={"fuse": True}`, see
  `mindstep.optimize.fusion`): the pass measures its decisions fused and the step compiles fused.
- `seed`: the tutorial's hand-written step, `value_and_grad` + optimizer under `ms.jit`.
- `model`: `mindspore.train.Model(...).train(...)` in GRAPH_MODE (sink mode where supported).
- `onestep`: `nn.TrainOneStepCell(nn.WithLossCell(net, loss), opt)` in GRAPH_MODE.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import amp, nn

from ..step import TrainStep

MODES = ("pynative", "jit", "jit-all", "jit-nocheck", "jit-accum", "jit-big", "jit-opt", "jit-opt-fuse", "seed",
         "model", "onestep")
OPT_MODES = ("jit-opt", "jit-opt-fuse")  # the modes that run the composed-operator pass

# What jit-opt turns on, per device, and why. On CPU, fp16 kernels are 2-3x slower than fp32 and
# bf16 kernels are missing, so the best precision there is fp32.
OPT_SETTINGS = {
    "CPU": {"precision": "fp32", "note": "fp32 (fp16 is slower on CPU, bf16 has no CPU kernels) + "
            "composed-operator pass (measured per layer)"},
    "GPU": {"precision": "O2", "note": "O2 mixed precision (fp16) with dynamic loss scaling"},
    "Ascend": {"precision": "O2", "note": "O2 mixed precision (fp16) with dynamic loss scaling"},
}

FEATURES = {"loss_scale": "dynamic", "accumulate": 2, "clip_grad_norm": 1.0, "ema": 0.999}
ACCUMULATE = 4  # jit-accum's window by default (--accumulate); jit-big's batch factor


def make_optimizer(net):
    return nn.Momentum(net.trainable_params(), 0.01, 0.9)


def build(mode: str, net, loss_fn, *, features: bool = False, optimize=True, accumulate: int = ACCUMULATE):
    """Return `(run, settings)` where `run(*batch)` performs one training step and returns the loss.

    `settings["compile"]`, where the mode's step can be compiled without running (a GRAPH_MODE Cell:
    `TrainStep.compile`, `Cell.compile`), is that function: the worker then compiles apart, so the
    first call only executes (see `worker.run`). `pynative` has nothing to compile and `seed`'s
    `ms.jit` function no compile-only API in MindSpore 2.10.

    `accumulate`: `jit-accum`'s window (the worker gives `jit-big` batches that many times larger).

    `optimize`: jit-opt's `TrainStep(optimize=...)` setting (the pass's memory budget; the runner
    chooses it, see `runner._opt_settings`)."""
    device = ms.get_context("device_target")
    extra = dict(FEATURES) if features else {}
    if mode == "jit-all":
        mode, extra = "jit", dict(FEATURES)
    if mode == "jit-nocheck":
        mode, extra = "jit", {"on_nonfinite": "apply"}
    if mode == "jit-accum":
        mode, extra = "jit", {**extra, "accumulate": accumulate}
    if mode == "jit-big":
        mode = "jit"
    if mode in ("pynative", "jit"):
        opt = make_optimizer(net)
        step = TrainStep.from_net(net, loss_fn, opt, jit=(mode == "jit"), **extra)
        return (lambda *b: step(*b)["loss"]), {"compiler": step.compiler, "step": step, **extra,
                                               **({"compile": step.compile} if mode == "jit" else {})}
    if mode in OPT_MODES:
        if mode == "jit-opt-fuse":
            optimize = {**(optimize if isinstance(optimize, dict) else {}), "fuse": True}
        settings = OPT_SETTINGS.get(device, OPT_SETTINGS["CPU"])
        if settings["precision"] != "fp32":
            net = amp.auto_mixed_precision(net, settings["precision"])
            extra.setdefault("loss_scale", "dynamic")
        opt = make_optimizer(net)
        step = TrainStep.from_net(net, loss_fn, opt, optimize=optimize, **extra)
        note = settings["note"] + (" + graph-kernel fusion" if mode == "jit-opt-fuse" else "")
        return (lambda *b: step(*b)["loss"]), {"compiler": step.compiler, "opt": note, "step": step,
                                               "compile": step.compile, **extra}
    if mode == "seed":
        return _seed(net, loss_fn), {"compiler": "ms.jit(function)"}
    if mode == "onestep":
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), make_optimizer(net))
        cell.set_train()
        ms.set_context(mode=ms.GRAPH_MODE)
        return cell, {"compiler": "GRAPH_MODE TrainOneStepCell", "compile": cell.compile}
    raise ValueError(f"unknown mode {mode!r}")  # `model` is driven by `run_model` (it owns its loop)


def _seed(net, loss_fn):
    net.set_train(True)  # as nn.TrainOneStepCell and Model do; the tutorial's code forgets it
    opt = make_optimizer(net)

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    return train_step
