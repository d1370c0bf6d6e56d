"""One bench mode in a fresh process: `python -m mindstep.bench.worker '<json spec>'`.

Prints one JSON line prefixed with `MINDSTEP_RESULT ` on success; any exception exits non-zero
with the traceback on stderr, which the parent reports as the mode's error.
"""
from __future__ import annotations

import json
import math
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("GLOG_v", "3")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402

from .._warmup import warmup_after  # noqa: E402

PREFIX = "MINDSTEP_RESULT "


def _peak_mem_mb() -> tuple[float, str]:
    try:
        device = float(ms.runtime.max_memory_allocated()) / 2**20
    except Exception:
        device = 0.0
    if device > 0:  # MindSpore reports 0 on CPU, real figures on GPU/Ascend
        return device, "device max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, "process peak RSS"


def _own_mem_mb() -> float | None:
    """The process's anonymous resident memory at the end of the run (Linux `RssAnon`: psutil's
    resident less its file-backed and shared pages), in MB, or None where psutil has no `shared`
    figure (not Linux).

    The peak RSS also counts the pages of MindSpore's shared libraries the process has touched, and
    how many of those are resident follows the machine's page cache: the same bare ResNet-18, BERT and
    ResNet-50 steps peaked ~105 MB lower two hours apart on one machine (their `RssFile` ~280 MB in
    the second run). Anonymous memory is the process's own; MindSpore's CPU memory pool keeps what it
    grew to, so at the end of the run it stands near the anonymous peak."""
    import psutil

    mem = psutil.Process().memory_info()
    return (mem.rss - mem.shared) / 2**20 if hasattr(mem, "shared") else None


PEAK_N, PEAK_REPEATS = 2048, 8
PEAK_METHOD = f"best of {PEAK_REPEATS} fp32 {PEAK_N}x{PEAK_N} matmuls under ms.jit"


def measure_peak_gflops(n: int = PEAK_N, repeats: int = PEAK_REPEATS) -> float:
    """This device's practical compute ceiling: the best of `repeats` fp32 n x n matmuls under ms.jit.

    The best, not the median: a ceiling is what the GEMM reaches when nothing interferes, and the
    best of short runs moves least between runs on a loaded machine (the runner also takes the best
    over several such processes, interleaved with the modes)."""
    from .ceiling import time_gemm

    return 2.0 * n ** 3 / time_gemm(n, n, n, repeats, max_seconds=math.inf) / 1e9


def _build_model(spec: dict):
    """The bench model of `spec`, its network built from the run's seed, and a generator seeded the
    same way for its batches: `(model spec, network, rng)`."""
    from . import zoo

    model = zoo.MODELS[spec["model"]]
    ms.set_seed(spec["seed"])
    net = model.build(spec["image_size"], spec["seq_len"])
    return model, net, np.random.default_rng(spec["seed"])


def run(spec: dict) -> dict:
    from . import zoo

    if spec["mode"] == "peak":
        return {"peak_gflops": measure_peak_gflops()}
    if spec["mode"] == "prepare-opt":
        return _prepare_opt(spec)
    if spec["mode"] == "ceiling":
        return _ceiling(spec)
    model, net, rng = _build_model(spec)
    loss_fn = model.loss()
    batch_size = spec["batch_size"] * (spec.get("accumulate", 1) if spec["mode"] == "jit-big" else 1)
    batches = [tuple(ms.Tensor(a) for a in model.batch(rng, batch_size, spec["image_size"], spec["seq_len"]))
               for _ in range(spec["distinct_batches"])]
    # forward + backward (2x forward), counted on one sample: every counted layer's FLOPs are linear in
    # the batch, and an eager native forward of a whole batch took ~1 minute at ResNet-50 224 px, batch 32
    flops = 3.0 * batch_size * zoo.forward_flops(net, (batches[0][0][:1],))
    warmup, steps = spec["warmup"], spec["steps"]

    def feed(calls: int) -> list:
        return [batches[i % len(batches)] for i in range(calls)]

    k = 1  # calls per update
    asked = warmup + steps  # the calls a run makes when nothing cuts it
    if spec["mode"] == "model":
        times, losses, compile_s, settings, warmup = _run_model(net, loss_fn, feed(asked), warmup,
                                                                spec.get("max_seconds"))
    else:
        times, losses, compile_s, settings, warmup, steps, k, asked = _time_mindstep(spec, net, loss_fn, feed,
                                                                                      batches[0], warmup, steps)
    measured = per_call(times[warmup:], k)
    p50 = statistics.median(measured)
    timed = len(times) - warmup
    if timed < steps:
        first = " (its first call, which ran after the step was compiled apart)" if warmup == 0 else ""
        settings["timed_calls_why"] = (f"{timed} of {steps} calls timed{first}: {'it' if timed == 1 else 'they'} took "
                                       f"{sum(times[warmup:]):.1f} s, over --max-seconds {spec['max_seconds']:g}; "
                                       f"its loss last is that of call {len(times)}, not {asked}")
    mem, source = _peak_mem_mb()
    return {
        "mode": spec["mode"], "model": spec["model"], "batch_size": batch_size,
        "throughput": batch_size / p50, "step_ms_p50": 1000 * p50,
        "step_ms_p90": 1000 * float(np.percentile(measured, 90)), "compile_s": compile_s,
        "peak_mem_mb": mem, "mem_source": source, "anon_mem_mb": _own_mem_mb(), "flops_per_step": flops,
        "loss_first": losses[0], "loss_last": losses[-1], "timed_calls": timed, "settings": settings,
    }


def _time_mindstep(spec: dict, net, loss_fn, feed, first_batch, warmup: int, steps: int):
    """A mindstep mode's step, compiled apart where it can be, then called `warmup` + `steps` times
    (whole accumulation windows) with every call timed: `(times, losses, compile_s, settings, warmup,
    steps, k, asked)`, `warmup` as the warm-up ended (`warmup_after`), `k` the calls per update and
    `asked` the calls a run makes when nothing cuts it."""
    from . import modes

    run_step, settings = modes.build(spec["mode"], net, loss_fn, features=spec.get("features", False),
                                     optimize=spec.get("optimize", True), accumulate=spec.get("accumulate", modes.ACCUMULATE))
    # an accumulating step compiles its update graph at its k-th call: keep that call out of the
    # timing; and time whole windows (k calls, the last one with the update)
    k = getattr(settings.get("step"), "accumulate", 1)
    warmup, steps = -(-max(warmup, k) // k) * k, -(-steps // k) * k
    asked = warmup + steps
    compile_fn = settings.pop("compile", None)
    compiled_s = 0.0 if compile_fn is None else _compile_apart(compile_fn, first_batch, settings)
    times, losses = [], []
    profiler = None
    for i, batch in enumerate(feed(asked)):
        if i == warmup and spec.get("profile_dir"):
            profiler = _start_profiler(spec["profile_dir"])
        t0 = time.perf_counter()
        loss = float(run_step(*batch).asnumpy())  # asnumpy synchronises before the clock is read
        times.append(time.perf_counter() - t0)
        losses.append(loss)
        if compile_fn is not None and first_call_counts(times, k, spec.get("max_seconds"), spec.get("profile_dir")):
            warmup = 0
            break
        warmup = warmup_after(times, warmup, k, spec.get("max_seconds"), settings)
        if enough(times[warmup:], k, spec.get("max_seconds")) or len(times) - warmup >= steps:
            break
    if profiler is not None:
        profiler.stop()
        profiler.analyse()
    step = settings.pop("step", None)
    # the first call, with the compile: apart, it came before (and any update graph's with it)
    compile_s = compiled_s + times[0] if compile_fn is not None else first_window_s(times, warmup, k)
    if step is not None and step.optimize_report is not None:
        # the composed-operator pass runs inside the compile apart (or the first call): report it apart
        compile_s -= step.optimize_s
        if "compiled_apart_s" in settings:  # the graph's compile alone
            settings["compiled_apart_s"] = round(compiled_s - step.optimize_s, 2)
        table = step.optimize_report
        settings["optimize_s"] = round(step.optimize_s, 2)
        budget = step.optimize_budget_mb
        settings["memory_budget_mb"] = None if budget is None else round(budget, 1)
        settings["memory_budget_from"] = spec.get("budget_source", "the pass's estimate of the native peak")
        settings["rewritten"] = f"{sum(r['choice'] != 'native' for r in table)}/{len(table)} layers"
        settings["optimize_report"] = table
    if k > 1:
        settings["timed_as"] = f"per call, the mean over each window of {k} calls"
    return times, losses, compile_s, settings, warmup, steps, k, asked


# A run's timed calls stop once they add up to this many seconds (`mindstep bench --max-seconds`): a
# ResNet-50 step at the tutorial's 224 px, batch 32, took 177-189 s natively on this project's CPUs, so
# the default 5 timed steps of `jit` and `model` alone took over 30 minutes; at least one call (or one
# accumulation window) is always timed, and the row says how many were.
MAX_SECONDS = 60.0


def enough(timed: list, k: int, max_seconds: float | None) -> bool:
    """Whether a run may stop timing after these timed calls (seconds each): they end a whole window of
    `k` calls, there is at least one window, and they add up to `max_seconds` (None: never stop early)."""
    return (max_seconds is not None and len(timed) >= k and len(timed) % k == 0
            and sum(timed) >= max_seconds)


def _compile_apart(compile_fn, batch, settings: dict) -> float:
    """Compile a step for `batch` without running it (the first call then only executes); its
    seconds, also put in `settings` as `compiled_apart_s`."""
    t0 = time.perf_counter()
    compile_fn(*batch)
    seconds = time.perf_counter() - t0
    settings["compiled_apart_s"] = round(seconds, 2)
    return seconds


def first_call_counts(times: list, k: int, max_seconds: float | None, profile_dir=None) -> bool:
    """Whether a step compiled apart may stop after its first call and time that call alone: the
    call only executed (the compile came before it), it took at least `max_seconds`, so a second
    call would be cut there too and cost as much again (a native ResNet-50 step at 224 px takes
    minutes on some CPUs), and each call is a whole update (k = 1; an accumulating step's first window
    holds its update graph's first run). Not when profiling, which starts after the warm-up. The
    one-time costs of a first execution are small beside it (docs/design/measurements.md)."""
    return (max_seconds is not None and k == 1 and not profile_dir and len(times) == 1
            and times[0] >= max_seconds)


def per_call(times: list, k: int = 1) -> list:
    """Per-call times: each call's own, or for an accumulating step each window's mean (k - 1
    micro-steps and one with the update), so its median is the cost of a call on average."""
    if k <= 1:
        return list(times)
    return [sum(times[i:i + k]) / k for i in range(0, len(times) - k + 1, k)]


def first_window_s(times: list, warmup: int, k: int = 1) -> float:
    """The first call's time, which holds the compile; for an accumulating step (k calls per update,
    whose update graph compiles at the k-th call) the first window's time less k - 1 steady calls.
    Steady = the mean of the measured calls (micro-steps and updates alternate there)."""
    measured = times[warmup:]
    k = max(1, min(k, warmup)) if warmup else 1
    return sum(times[:k]) - (k - 1) * (sum(measured) / len(measured))


def _prepare_opt(spec: dict) -> dict:
    """Measure the composed-operator decisions for this model and shape into the disk cache, in a
    process of its own, so the `jit-opt` worker's peak memory and timings hold training only."""
    from ..optimize import fusion, optimize

    model, net, rng = _build_model(spec)
    x = model.batch(rng, spec["batch_size"], spec["image_size"], spec["seq_len"])[0]
    t0 = time.perf_counter()
    with fusion.maybe(bool(spec.get("fuse"))):  # jit-opt-fuse's decisions are measured fused
        table = optimize(net, (ms.Tensor(x),))
    return {"optimize_s": time.perf_counter() - t0, "layers": len(table),
            "rewritten": sum(r["choice"] != "native" for r in table)}


def _ceiling(spec: dict) -> dict:
    """The GEMM ceiling at this model's own shapes (`ceiling.measure`), in a process of its own."""
    from . import ceiling, zoo

    model, net, rng = _build_model(spec)
    # one sample of the network's input, as the modes count their FLOPs (`run`)
    x = (ms.Tensor(model.batch(rng, spec["batch_size"], spec["image_size"], spec["seq_len"])[0][:1]),)
    counted = 3.0 * spec["batch_size"] * zoo.forward_flops(net, x)
    return ceiling.measure(net, x, spec["batch_size"], counted)


def _start_profiler(out_dir: str):
    from mindspore.profiler import Profiler

    return Profiler(output_path=out_dir)


def _run_model(net, loss_fn, feed, warmup: int = 1, max_seconds: float | None = None):
    """`mindspore.train.Model` in GRAPH_MODE; step times from a callback at each step boundary, which
    stops the training once the timed steps are `enough`.

    Its train network (`Model.train_network`, set to training as `Model.train` sets it) is compiled
    apart first (`Cell.compile` on the first batch; `Model.train` then finds the graph compiled), so
    the first step only executes and may be the timed one (`first_call_counts`). Returns the times,
    the losses, the first call's time with the compile, the settings, and how many leading calls
    were left out of the timing."""
    import mindspore.dataset as ds
    from mindspore.train import Callback, Model

    from .modes import make_optimizer

    ms.set_context(mode=ms.GRAPH_MODE)
    columns = [f"c{i}" for i in range(len(feed[0]))]

    def gen():
        for batch in feed:
            yield tuple(t.asnumpy() for t in batch)

    data = ds.GeneratorDataset(gen, column_names=columns, shuffle=False)

    class Timer(Callback):
        def __init__(self):
            super().__init__()
            self.times, self.losses, self.t0 = [], [], None

        def on_train_step_begin(self, run_context):
            self.t0 = time.perf_counter()

        def on_train_step_end(self, run_context):
            out = run_context.original_args().net_outputs
            loss = out[0] if isinstance(out, (tuple, list)) else out
            self.losses.append(float(loss.asnumpy()))
            self.times.append(time.perf_counter() - self.t0)
            if apart and first_call_counts(self.times, 1, max_seconds):
                self.warmup = 0
                run_context.request_stop()
                return
            self.warmup = warmup_after(self.times, self.warmup, 1, max_seconds, settings)
            if enough(self.times[self.warmup:], 1, max_seconds) or len(self.times) - self.warmup >= steps:
                run_context.request_stop()

    timer = Timer()
    timer.warmup, steps = warmup, len(feed) - warmup
    sink = ms.get_context("device_target") != "CPU"  # sink mode silently falls back on CPU anyway
    model = Model(net, loss_fn, make_optimizer(net))
    settings = {"compiler": "GRAPH_MODE Model.train", "dataset_sink_mode": sink}
    apart, compiled_s = not sink, 0.0  # sink mode runs the dataset inside the graph: no batch to compile for
    if apart:
        model.train_network.set_train(True)
        compiled_s = _compile_apart(model.train_network.compile, feed[0], settings)
    model.train(1, data, callbacks=[timer], dataset_sink_mode=sink)
    return timer.times, timer.losses, compiled_s + timer.times[0], settings, timer.warmup


def main() -> int:
    spec = json.loads(sys.argv[1])
    result = run(spec)
    sys.stdout.write(PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
