"""Run every bench mode in its own fresh subprocess and collect results (failures included)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field

import mindspore as ms

from .. import _cpu
from .._errors import bad_value, check_choice, check_int
from .._warmup import DEFAULT_WARMUP
from .modes import ACCUMULATE, MODES, OPT_MODES
from .worker import MAX_SECONDS, PREFIX
from .zoo import MODELS

DEFAULT_MODES = ("pynative", "jit", "jit-opt", "seed", "model")


@dataclass
class BenchConfig:
    model: str = "resnet18"
    modes: tuple = DEFAULT_MODES
    batch_size: int | None = None  # None: the model's default
    image_size: int = 32
    seq_len: int = 64
    steps: int = 5
    warmup: int = DEFAULT_WARMUP  # the compiling call and MindSpore's CPU kernel search (`_warmup`)
    max_seconds: float | None = MAX_SECONDS  # a run's timed steps stop once they add up to this (None: never)
    repeat: int = 1  # runs of every mode, interleaved; rows report the median of the per-run medians
    seed: int = 0
    distinct_batches: int = 2
    features: bool = False
    accumulate: int = ACCUMULATE  # jit-accum's window; jit-big's batch is batch_size x accumulate
    opt_memory_budget: str | float = "jit"  # 'jit' (calibrated against the jit row's peak), 'none', or MB
    profile_dir: str | None = None
    ceiling: bool = False  # also time the model's own GEMM shapes (`ceiling.measure`)
    timeout_s: int = 900
    extra_env: dict = field(default_factory=dict)

    def validate(self) -> "BenchConfig":
        check_choice("model", self.model, MODELS)
        if not self.modes:
            raise bad_value("modes", self.modes, f"a non-empty list of {', '.join(MODES)}", "e.g. --modes pynative,jit")
        for m in self.modes:
            check_choice("modes", m, MODES)
        if len(set(self.modes)) != len(self.modes):
            raise bad_value("modes", self.modes, "modes without repeats", "List each mode once.")
        if self.batch_size is None:
            self.batch_size = MODELS[self.model].default_batch
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("image_size", self.image_size, minimum=8, fix="ResNets need at least 8 px, e.g. --image-size 32.")
        check_int("seq_len", self.seq_len, minimum=1)
        check_int("steps", self.steps, minimum=1)
        if self.max_seconds in ("none", None):
            self.max_seconds = None
        else:
            seconds = _number(self.max_seconds)
            if not seconds > 0:
                raise bad_value("max_seconds", self.max_seconds, "a number of seconds > 0, or 'none'",
                                "e.g. --max-seconds 600 to time more steps of a slow mode, or --max-seconds none "
                                "to always time --steps steps.")
            self.max_seconds = seconds
        check_int("warmup", self.warmup, minimum=1, fix="The first call compiles; keep --warmup >= 1 so it is not timed.")
        check_int("distinct_batches", self.distinct_batches, minimum=1)
        check_int("repeat", self.repeat, minimum=1, fix="e.g. --repeat 3 to see the spread between runs.")
        check_int("accumulate", self.accumulate, minimum=2,
                  fix="jit-accum accumulates K >= 2 micro-batches per update, e.g. --accumulate 4.")
        budget = self.opt_memory_budget
        if budget not in ("jit", "none"):
            budget = _number(budget)
            if not budget >= 0:
                raise bad_value("opt_memory_budget", self.opt_memory_budget, "'jit', 'none' or a number of MB >= 0",
                                "e.g. --opt-memory-budget none, or --opt-memory-budget 300.")
            self.opt_memory_budget = budget
        return self


def _number(value) -> float:
    """A number, or its text (from the command line), as a float; NaN (which fails every bound) for
    anything else, bools included."""
    if isinstance(value, bool):
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def spec_for(cfg: BenchConfig, mode: str) -> dict:
    return {"mode": mode, "model": cfg.model, "batch_size": cfg.batch_size, "image_size": cfg.image_size,
            "seq_len": cfg.seq_len, "seed": cfg.seed, "steps": cfg.steps, "warmup": cfg.warmup,
            "max_seconds": cfg.max_seconds,
            "distinct_batches": cfg.distinct_batches, "features": cfg.features, "accumulate": cfg.accumulate,
            "profile_dir": os.path.join(cfg.profile_dir, mode) if cfg.profile_dir else None}


def run_worker(spec: dict, timeout_s: int, extra_env: dict | None = None) -> dict:
    """One mode in a fresh interpreter; returns its result dict or `{"error": ...}`."""
    env = dict(os.environ, GLOG_v=os.environ.get("GLOG_v", "3"), **(extra_env or {}))
    cmd = [sys.executable, "-m", "mindstep.bench.worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX):])
    tail = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
    message = next((ln for ln in reversed(tail) if "Error" in ln or "error" in ln), tail[-1] if tail else "")
    return {"error": f"exit code {proc.returncode}: {message.strip()}", "stderr_tail": "\n".join(tail[-15:])}


def run(cfg: BenchConfig, on_progress=None) -> dict:
    """Measure the device peak and every mode, `cfg.repeat` times interleaved (peak, all modes, peak,
    all modes, ..., peak); the result follows the documented JSON schema."""
    cfg.validate()
    total = cfg.repeat * len(cfg.modes) + 1
    peaks = []

    def measure_peak():
        if on_progress:
            on_progress("peak matmul", 0, total)
        peaks.append(run_worker({"mode": "peak"}, cfg.timeout_s, cfg.extra_env).get("peak_gflops", float("nan")))

    measure_peak()
    ceiling = None
    if cfg.ceiling:
        if on_progress:
            on_progress("GEMM ceiling at the model's shapes", 0, total)
        ceiling = run_worker({**spec_for(cfg, "ceiling"), "mode": "ceiling"}, cfg.timeout_s, cfg.extra_env)
    prepared = {}
    for mode in (m for m in OPT_MODES if m in cfg.modes):
        if on_progress:
            on_progress(f"{mode}: measuring layer decisions", 0, total)
        prepared[mode] = run_worker({**spec_for(cfg, mode), "mode": "prepare-opt", "fuse": mode == "jit-opt-fuse"},
                                    cfg.timeout_s, cfg.extra_env)
    # jit runs before jit-opt whatever the listed order: its measured peak memory is the native
    # reference for jit-opt's memory budget (see mindstep.optimize.pass_.budget_mb)
    order = sorted(cfg.modes, key=lambda m: m in OPT_MODES)
    runs, calibrations, specs, i = {m: [] for m in order}, {}, {}, 0
    for r in range(cfg.repeat):
        for mode in order:
            i += 1
            if on_progress:
                on_progress(mode if cfg.repeat == 1 else f"{mode} (run {r + 1}/{cfg.repeat})", i, total)
            if mode not in specs:
                specs[mode] = spec_for(cfg, mode)
                if mode in OPT_MODES:  # calibrated once, against the first jit run
                    first_jit = _row(cfg, "jit", runs["jit"][0], float("nan")) if runs.get("jit") else {}
                    calibrations[mode] = _opt_settings(cfg, specs[mode], first_jit, on_progress, i, total)
            runs[mode].append(run_worker(specs[mode], cfg.timeout_s, cfg.extra_env))
        measure_peak()
    good = [p for p in peaks if p == p and p > 0]
    peak_gflops = max(good) if good else float("nan")
    rows = {m: _row(cfg, m, combine(runs[m]), peak_gflops) for m in order}
    results = [rows[m] for m in cfg.modes]
    if on_progress:
        on_progress("done", total, total)
    from .worker import PEAK_METHOD

    return {"device": ms.get_context("device_target"), "mindspore": ms.__version__, "cpu": _cpu.describe(),
            "peak_gflops": peak_gflops,
            "peak_runs_gflops": peaks,
            "peak_method": f"{PEAK_METHOD} in each of "
                           f"{len(peaks)} processes (before the modes and after each round of them); the best "
                           f"over all",
            "config": {k: v for k, v in asdict(cfg).items() if k not in ("extra_env",)},
            "optimize_prepare": prepared.get("jit-opt"), "optimize_calibration": calibrations.get("jit-opt"),
            "optimize_prepare_fuse": prepared.get("jit-opt-fuse"),
            "optimize_calibration_fuse": calibrations.get("jit-opt-fuse"),
            "shape_ceiling": _ceiling_row(ceiling, peak_gflops), "results": results}


def _ceiling_row(ceiling: dict | None, peak_gflops: float) -> dict | None:
    """The `--ceiling` worker's result with its rate as a fraction of the run's peak (`mfu`)."""
    if ceiling is None or "error" in ceiling:
        return ceiling
    ok = peak_gflops == peak_gflops and peak_gflops > 0
    return {**ceiling, "mfu": ceiling["gflops"] / peak_gflops if ok else float("nan")}


RUN_KEYS = ("step_ms_p50", "step_ms_p90", "compile_s", "peak_mem_mb", "anon_mem_mb")


def combine(outs: list) -> dict:
    """One row from a mode's repeated runs: the median of each per-run figure, with every run's
    figures under `runs` and the p50's spread ((max - min) / median), and the fewest calls a run timed
    (`timed_calls`, with that run's `timed_calls_why` when `--max-seconds` cut it; and `warmup_why`
    from the run whose warm-up it cut shortest); a failed run fails the row."""
    failed = [o for o in outs if "error" in o]
    if failed:
        return dict(failed[0], error=failed[0]["error"] + (f" (run {outs.index(failed[0]) + 1} of {len(outs)})"
                                                             if len(outs) > 1 else ""))
    row = dict(outs[0])
    if len(outs) == 1:
        return row
    keys = [key for key in RUN_KEYS if all(o.get(key) is not None for o in outs)]
    for key in keys:
        row[key] = statistics.median(o[key] for o in outs)
    row["throughput"] = row["batch_size"] / (row["step_ms_p50"] / 1000.0)
    fewest = min(outs, key=lambda o: o.get("timed_calls", 0))
    row["timed_calls"] = fewest.get("timed_calls", 0)
    settings = {k: v for k, v in (row.get("settings") or {}).items() if k not in ("timed_calls_why", "warmup_why")}
    if "timed_calls_why" in (fewest.get("settings") or {}):
        settings["timed_calls_why"] = fewest["settings"]["timed_calls_why"]
    cut = [o["settings"]["warmup_why"] for o in outs if "warmup_why" in (o.get("settings") or {})]
    if cut:  # the run whose warm-up --max-seconds cut shortest
        settings["warmup_why"] = min(cut, key=lambda why: int(why.split(" ", 1)[0]))
    row["settings"] = settings
    p50s = [o["step_ms_p50"] for o in outs]
    row["runs"] = {key: [o[key] for o in outs] for key in keys}
    row["step_ms_spread"] = (max(p50s) - min(p50s)) / row["step_ms_p50"]
    return row


def _opt_settings(cfg: BenchConfig, spec: dict, jit: dict, on_progress, i: int, total: int) -> dict | None:
    """Put jit-opt's pass settings (`optimize`, the TrainStep argument) and where its memory budget
    came from (`budget_source`) into `spec`; return the calibration record when one ran."""
    if cfg.opt_memory_budget == "none":
        spec.update(optimize={"memory_budget_mb": None}, budget_source="no cap")
    elif cfg.opt_memory_budget != "jit":
        spec.update(optimize={"memory_budget_mb": cfg.opt_memory_budget}, budget_source="--opt-memory-budget")
    elif jit.get("status") == "ok" and jit.get("mem_source") == "process peak RSS":
        calibration = calibrate_budget(cfg, spec, jit["peak_mem_mb"], on_progress, i, total)
        if calibration["chosen"] != "default":
            spec.update(optimize={"memory_budget_mb": calibration["chosen"]},
                        budget_source="calibrated against the jit row's peak")
        else:
            spec.update(optimize={"native_peak_mb": jit["peak_mem_mb"]}, budget_source="the jit row's peak")
        return calibration
    else:
        spec["budget_source"] = "the pass's estimate of the native peak (no jit row in this run)"
    return None


CALIBRATION_STEPS = 4  # bisection steps after the no-cap trial


def calibrate_budget(cfg: BenchConfig, spec: dict, native_peak_mb: float, on_progress=None, i=0, total=0) -> dict:
    """Find the fastest jit-opt setting whose measured peak stays within PEAK_RATIO x the jit row's.

    How much of the per-layer memory estimate a whole step keeps varies by network (0 to 0.19
    measured, see `optimize.memory.RETAINED`, and not in proportion layer by layer), so the bench measures
    instead of assuming: one step (its first, compiling call alone) in a fresh process with no cap;
    if that is over, a bisection over the budget between 0 and what the no-cap run kept, keeping the
    largest budget whose peak is within the ratio; if none is, the pass's own default budget."""
    from ..optimize.memory import RETAINED
    from ..optimize.pass_ import PEAK_RATIO

    limit = PEAK_RATIO * native_peak_mb
    trials, chosen = [], "default"

    def trial(budget):
        if on_progress:
            on_progress(f"jit-opt: memory calibration ({'no cap' if budget is None else f'{budget:.0f} MB'})", i, total)
        # one call, the compiling one: the peak is reached there (docs/design/measurements.md)
        out = run_worker({**spec, "steps": 1, "warmup": 0, "optimize": {"memory_budget_mb": budget}},
                         cfg.timeout_s, cfg.extra_env)
        peak = out.get("peak_mem_mb")
        ok = peak is not None and out.get("mem_source") == "process peak RSS" and peak <= limit
        settings = out.get("settings") or {}
        trials.append({"memory_budget_mb": budget, "peak_mem_mb": peak, "within": bool(ok),
                       "rewritten": settings.get("rewritten"), "error": out.get("error")})
        return ok, settings

    ok, settings = trial(None)
    if ok:
        return {"native_peak_mb": native_peak_mb, "peak_ratio": PEAK_RATIO, "trials": trials, "chosen": None}
    lo, hi = 0.0, RETAINED * sum(r.get("extra_mb", 0.0) for r in settings.get("optimize_report") or [])
    for _ in range(CALIBRATION_STEPS if hi > 0 else 0):
        budget = (lo + hi) / 2
        ok, _ = trial(budget)
        if ok:
            lo, chosen = budget, budget
        else:
            hi = budget
    return {"native_peak_mb": native_peak_mb, "peak_ratio": PEAK_RATIO, "trials": trials, "chosen": chosen}


def _row(cfg: BenchConfig, mode: str, out: dict, peak_gflops: float) -> dict:
    if "error" in out:
        nan = float("nan")
        return {"mode": mode, "model": cfg.model, "batch_size": cfg.batch_size, "throughput": nan,
                "step_ms_p50": nan, "step_ms_p90": nan, "compile_s": nan, "peak_mem_mb": nan, "mem_source": "",
                "mfu": nan, "loss_first": nan, "loss_last": nan, "status": "failed", "error": out["error"]}
    achieved = out["flops_per_step"] / (out["step_ms_p50"] / 1000.0) / 1e9
    out["mfu"] = achieved / peak_gflops if peak_gflops == peak_gflops and peak_gflops > 0 else float("nan")
    out["status"] = "ok"
    return out


def ratios(report: dict, base: str = "pynative") -> dict:
    """Throughput of each mode divided by the base mode's, both from this same run."""
    rows = {r["mode"]: r for r in report["results"]}
    ref = rows.get(base)
    if ref is None or ref.get("status") != "ok":
        return {}
    return {m: r["throughput"] / ref["throughput"] for m, r in rows.items() if r.get("status") == "ok"}
