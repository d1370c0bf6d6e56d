"""Measured, cached choice between a native layer and its composed form.

For each distinct (layer configuration, input shape) the pass times forward + input and weight
gradients of native and the composed forms on the actual device, in GRAPH_MODE like the training
step (for convs, the chosen form once more with the native weight-gradient kernel: per direction),
keeps the fastest, and stores the decision in a JSON file keyed by device, MindSpore version and shape, so the
measurement runs once per machine. On devices whose native convolutions are fast (GPU, Ascend) the
layers are left native without measuring.
"""
from __future__ import annotations

import dataclasses

import json
import math
import os
import re
import statistics
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn

from .._context import graph_mode
from . import fusion
from .conv import Form, GemmConv2d, conv_pads, dw_forms, forms_for, out_shape, single_tap
from .memory import extra_mb

NATIVE_FAST_DEVICES = ("GPU", "Ascend")
# Bumped whenever the composed forms change, so cached decisions measured on old code are not reused.
FORMULATION = "gemmconv-22"
# A form that needs more memory must be this much faster than the leaner one to be chosen: a layer
# timed alone does not show the cost of its extra buffers inside a whole training graph (rrdbnet:
# one-GEMM layers won alone by 1.2x, yet the whole step ran faster and 1.9x leaner with batched).
MEMORY_MARGIN = 1.25
# A composed conv form must beat native by this factor: a near tie timed alone can lose in the step.
# Measurements: docs/design/composed-pass.md#conv_margin
CONV_MARGIN = 1.1


def cache_path(cache_dir: str | None = None) -> Path:
    root = cache_dir or os.environ.get("MINDSTEP_CACHE_DIR") or os.path.join(Path.home(), ".cache", "mindstep")
    return Path(root) / "decisions.json"


def load_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def save_cache(path: Path, cache: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    os.replace(tmp, path)  # atomic: a crash never leaves a half-written cache


def key(device: str, conv: nn.Conv2d, shape: tuple, dtype, input_grad: bool = True) -> str:
    pads = conv_pads(conv, shape[2], shape[3])
    return (f"{device}|mindspore-{ms.__version__}|{FORMULATION}|conv2d {conv.in_channels}->{conv.out_channels} "
            f"k{conv.kernel_size} s{conv.stride} d{conv.dilation} pads{pads} bias{int(conv.has_bias)}"
            + (f" group{conv.group}" if conv.group != 1 else "")
            + f"|in{tuple(shape)} {dtype}" + ("" if input_grad else " no-dx"))


# A layer within this factor of a measured layer's channel counts (same geometry otherwise) takes its decision.
# Measurements: docs/design/composed-pass.md#share_factor
SHARE_FACTOR = 2.0

_KEY = re.compile(r"^(?P<head>.*\|conv2d )(?P<cin>\d+)->(?P<cout>\d+) (?P<geo>k.*?)(?: group(?P<group>\d+))?"
                  r"\|in\((?P<n>\d+), (?P<c>\d+), (?P<h>\d+), (?P<w>\d+)\)(?P<tail>.*)$")


def family(cache_key: str):
    """(family, cin, cout) of a decision key: the family is the key without its channel counts (the
    group as its kind: depthwise, or the channels per group), so layers that differ only in width
    share one; None for a key of another shape."""
    m = _KEY.match(cache_key)
    if m is None:
        return None
    return (f"{m['head']}{m['geo']}{_group_kind(m)}|in({m['n']}, *, {m['h']}, {m['w']}){m['tail']}",
            int(m["cin"]), int(m["cout"]))


def _group_kind(m) -> str:
    """A matched key's group as its kind: none, depthwise, or the channels per group."""
    cin, cout, group = int(m["cin"]), int(m["cout"]), int(m["group"] or 1)
    return "" if group == 1 else (" depthwise" if group == cin == cout else f" {cin // group}/{cout // group} per group")


def _macs(cache_key: str) -> float:
    """Multiply-adds per output position of the key's layer (the scale of its time within a family)."""
    m = _KEY.match(cache_key)
    return int(m["cin"]) * int(m["cout"]) / int(m["group"] or 1)


def neighbour(cache: dict, cache_key: str) -> str | None:
    """The measured key nearest in channels (both within `SHARE_FACTOR`, the smallest log distance) of
    the same family as `cache_key`, or None."""
    mine = family(cache_key)
    if mine is None:
        return None
    best = None
    for other, entry in cache.items():
        if other == cache_key or "shared_from" in entry:
            continue
        theirs = family(other)
        if theirs is None or theirs[0] != mine[0]:
            continue
        a, b = theirs[1] / mine[1], theirs[2] / mine[2]
        if max(a, 1 / a, b, 1 / b) > SHARE_FACTOR:
            continue
        dist = abs(math.log(a)) + abs(math.log(b))
        if best is None or dist < best[0]:
            best = (dist, other)
    return None if best is None else best[1]


def shared(entry: dict, source: str, cache_key: str) -> dict:
    """`entry` (measured for the key `source`) as the decision for `cache_key`: the same choice, the
    times scaled by the ratio of the two layers' multiply-adds, and a reason that names the source."""
    _, sin, sout = family(source)
    ratio = _macs(cache_key) / _macs(source)
    times = {form: round(t * ratio, 3) for form, t in entry.get("times", {}).items()}
    return {**entry, "times": times, "native_ms": round(entry["native_ms"] * ratio, 3),
            "gemm_ms": round(entry["gemm_ms"] * ratio, 3), "shared_from": source,
            "reason": f"shared from the measured {sin}->{sout} layer of the same geometry (channels within "
                      f"{SHARE_FACTOR:g}x; times scaled by multiply-adds): " + entry["reason"]}


# A layer without a width neighbour takes a composed decision from a larger map of its geometry won by this ratio.
# Measurements: docs/design/composed-pass.md#inherit_ratio
INHERIT_RATIO = 4.0
INHERIT_POSITIONS = 16


def geometry(cache_key: str):
    """(geometry, input positions) of a decision key: the key without its channel counts and map size
    (the group as its kind, as in `family`); None for a key of another shape."""
    m = _KEY.match(cache_key)
    if m is None:
        return None
    return f"{m['head']}{m['geo']}{_group_kind(m)}|in({m['n']}, *, *, *){m['tail']}", int(m["h"]) * int(m["w"])


def ancestor(cache: dict, cache_key: str) -> str | None:
    """The measured key of the same `geometry` as `cache_key`, on a larger map of at most
    `INHERIT_POSITIONS` times its input positions, whose composed choice beat native by
    `INHERIT_RATIO` (the nearest in positions, then the largest lead); None if there is none."""
    mine = geometry(cache_key)
    if mine is None:
        return None
    best = None
    for other, entry in cache.items():
        if other == cache_key or "shared_from" in entry or entry.get("choice", "native") == "native":
            continue
        theirs = geometry(other)
        if theirs is None or theirs[0] != mine[0] or not mine[1] < theirs[1] <= INHERIT_POSITIONS * mine[1]:
            continue
        lead = entry["times"]["native"] / entry["times"][entry["choice"]]
        if lead < INHERIT_RATIO:
            continue
        rank = (theirs[1] / mine[1], -lead)
        if best is None or rank < best[0]:
            best = (rank, other)
    return None if best is None else best[1]


def inherited_form(conv: nn.Conv2d, shape: tuple, input_grad: bool) -> str:
    """The form a layer takes from a measured `ancestor`: the form `measure` would time first at this
    shape (its lead, or its only form)."""
    forms, lead = timed_forms(conv, shape, input_grad)
    return lead or forms[0]


def inherited(entry: dict, source: str, cache_key: str, form: str) -> dict:
    """`entry` (measured for the key `source`, an `ancestor`) as the decision for `cache_key`: `form`
    (`inherited_form`), with times scaled from the source's by multiply-adds (an estimate, for the
    memory budget's trade-offs), and a reason that names the source."""
    (_, positions), (_, theirs) = geometry(cache_key), geometry(source)
    ratio = _macs(cache_key) * positions / (_macs(source) * theirs)
    native, chosen = entry["times"]["native"], entry["times"][entry["choice"]]
    m = _KEY.match(source)
    return {"choice": form, "native_ms": round(native * ratio, 3), "gemm_ms": round(chosen * ratio, 3),
            "times": {"native": round(native * ratio, 3), form: round(chosen * ratio, 3)}, "inherited_from": source,
            "reason": f"inherited from the measured {m['cin']}->{m['cout']} layer on {m['h']}x{m['w']} maps of the "
                      f"same geometry, where {entry['choice']} beat native by {native / chosen:.1f}x (at least "
                      f"{INHERIT_RATIO:g}x, within {INHERIT_POSITIONS}x the positions; times scaled by multiply-adds): "
                      f"this layer's lead form, not timed here"}


def choose(times: dict, memory: dict, native_margin: float = 1.0) -> str:
    """The fastest form, except that a form needing more memory must beat a leaner, faster-than-
    native form by MEMORY_MARGIN (between forms of equal memory the faster wins), and any composed
    form must beat native by `native_margin`."""
    candidates = sorted((f for f in times if f != "native" and times[f] * native_margin < times["native"]),
                        key=lambda f: memory[f])
    if not candidates:
        return "native"
    best = candidates[0]
    for form in candidates[1:]:
        leaner_or_equal = memory[form] <= memory[best]
        if times[form] < times[best] if leaner_or_equal else times[form] * MEMORY_MARGIN <= times[best]:
            best = form
    return best


_NO_DX = " (no input gradient: its input is the batch)"


class _Probe(nn.Cell):
    """The layer's loss and gradients, as a training step computes them. The loss is returned too:
    with only the gradients as outputs, MindSpore drops the forward (its output feeds nothing), and
    the timing would leave out the forward convolution, which is where native CPU kernels are slowest.
    The loss weighs the output with a fixed random tensor `r`, so the gradients checked against
    native (`measure`) come from a non-uniform output gradient, as in a network. `extra`: the
    layer's arguments after `x`, as constants (a loss's labels); no gradient is taken for them.
    `calls` > 1 (a layer whose output has its input's shape) applies the layer that many times in a
    row, each call's input the last output plus `x` (see `KIND_CHAIN_ELEMENTS`)."""

    def __init__(self, layer, input_grad: bool = True, extra: tuple = (), calls: int = 1):
        super().__init__(auto_prefix=False)  # auto_prefix would rename the layer's Parameters
        self.layer = layer
        self.extra = tuple(extra)
        self.calls = int(calls)
        self.grad = ms.value_and_grad(self._loss, grad_position=0 if input_grad else None,
                                      weights=layer.trainable_params())

    def _loss(self, x, r):
        y = self.layer(x, *self.extra)
        for _ in range(self.calls - 1):  # a Python constant: unrolled in the graph
            y = self.layer(y + x, *self.extra)
        return (y * r).sum()

    def construct(self, x, r):
        return self.grad(x, r)


def _flat(out) -> list:
    """The loss and every gradient of a `_Probe` call, as host arrays (this waits for all of them)."""
    loss, grads = out
    items = [loss]
    while grads:
        head, grads = (grads[0], grads[1:]) if isinstance(grads, (tuple, list)) else (grads, ())
        if isinstance(head, (tuple, list)):
            grads = tuple(head) + tuple(grads)
        else:
            items.append(head)
    return [t.asnumpy() for t in items]


def mismatch(reference: list, got: list) -> float:
    """The largest difference between two `_flat` results, relative to each array's largest value."""
    return max(float(np.abs(a - b).max() / max(float(np.abs(a).max()), 1e-30)) for a, b in zip(reference, got))


# A composed form whose loss or gradients differ from native by more than this (relative to each
# array's largest value) is not used. Float reordering gives ~1e-6 on these layer sizes; a fault
# (a wrong tap, pad or crop) gives O(1).
CHECK_RTOL = 1e-3
# float16 inputs (mixed precision): native's own rounding is ~1e-3 there (one float16 ulp at 1.0 is
# 9.8e-4), so 1e-3 would reject any form that sums in another order; 1e-2 (ten ulps) still rejects a
# fault. Measured: a (16, 64, 128) float16 LayerNorm with a float32 backward vs native 2.9e-3,
# while both were within 7.4e-4 of the float64 gradient.
CHECK_RTOL_FP16 = 1e-2


def check_rtol(dtype) -> float:
    return CHECK_RTOL_FP16 if dtype == ms.float16 else CHECK_RTOL


# Timed calls per form (after the compiling one). Compiling the probes is ~97 % of the pass's time
# (mindcv MobileNetV2: 17.1 of 17.6 s), so more calls cost little; with 3, noise flipped near decisions
# between fresh runs (MobileNetV2: 8 to 16 of 52 layers rewritten, steps 80-118 ms).
REPEATS = 7


# A form's timing stops as soon as its fastest call so far is this many times the fastest form's median
# measured before it: it cannot be chosen (`choose` keeps forms faster than native, and any margin is
# far below this), so its remaining calls would only cost time. On this project's slow-native CPU a
# native ResNet-50 3x3 layer at 224 px takes ~10 s per call.
CLEAR_RATIO = 2.0


# A probe's first call after compiling counts as a timed call when it took at least this long.
# Measurements: docs/design/composed-pass.md#first_sample_ms
FIRST_SAMPLE_MS = 1000.0


class _Timed:
    """One layer's compiled probe: `first()` compiles and returns the loss and gradients on the host,
    `time()` the median ms of the timed calls; with `calls` > 1 (see `_Probe`) per call of the layer."""

    def __init__(self, layer: nn.Cell, x, r, input_grad: bool = True, extra: tuple = (), calls: int = 1):
        self.probe, self.x, self.r = _Probe(layer, input_grad, extra, calls), x, r
        self.first_ms = None  # the first call's time, when it counts as a timed one (FIRST_SAMPLE_MS)

    def first(self) -> list:
        with graph_mode():
            self.probe.compile(self.x, self.r)
            t0 = time.perf_counter()
            values = _flat(self.probe(self.x, self.r))
            took = 1000.0 * (time.perf_counter() - t0)
        self.first_ms = took / self.probe.calls if took >= FIRST_SAMPLE_MS else None
        return values

    def time(self, repeats: int = REPEATS, stop_above: float | None = None, fresh: bool = False) -> float:
        """Median ms of up to `repeats` calls (the first call among them when it counts, see
        `FIRST_SAMPLE_MS`, unless `fresh`); fewer once the fastest call is over `stop_above` ms."""
        times = [] if self.first_ms is None or fresh else [self.first_ms]
        with graph_mode():
            while len(times) < repeats and not (times and stop_above is not None and min(times) > stop_above):
                t0 = time.perf_counter()
                _flat(self.probe(self.x, self.r))
                times.append(1000.0 * (time.perf_counter() - t0) / self.probe.calls)
        return statistics.median(times)


# A composed form that leads native by less than this is re-timed alternating call by call with native.
# Measurements: docs/design/composed-pass.md#confirm_ratio
CONFIRM_RATIO = CLEAR_RATIO
CONFIRM_PAIRS = 5


def confirm(native: _Timed, form: _Timed, pairs: int = CONFIRM_PAIRS) -> tuple[float, float]:
    """Median ms of native and of a form over `pairs` calls each, alternating, so both see the same load."""
    native_ms, form_ms = [], []
    for _ in range(pairs):
        native_ms.append(native.time(1, fresh=True))
        form_ms.append(form.time(1, fresh=True))
    return statistics.median(native_ms), statistics.median(form_ms)


# At this many output positions or fewer the batched forms are not timed where one GEMM exists.
# Measurements: docs/design/composed-pass.md#batched_min_positions
BATCHED_MIN_POSITIONS = 5


# The "+phases" forms differ only in the input gradient: layers without one skip them, strided 1x1
# convs time only them.
# Measurements: docs/design/composed-pass.md#phases


def plausible_forms(conv: nn.Conv2d, shape: tuple, input_grad: bool = True) -> tuple:
    """The composed forms worth timing for this layer at this input shape (`forms_for`; without an
    input gradient no "+phases" form, on a strided 1x1 layer only those; less the batched forms on
    maps of fewer than `BATCHED_MIN_POSITIONS` output positions where a one-GEMM form exists)."""
    forms = forms_for(conv)
    parsed = {f: Form.parse(f) for f in forms}
    if any(form.phases for form in parsed.values()):
        if not input_grad:
            forms = tuple(f for f in forms if not parsed[f].phases)
        elif tuple(conv.kernel_size) == (1, 1):
            forms = tuple(f for f in forms if parsed[f].phases)
    _, _, ho, wo = out_shape(conv, shape)
    if ho * wo < BATCHED_MIN_POSITIONS and any(parsed[f].one_gemm for f in forms):
        return tuple(f for f in forms if parsed[f].one_gemm)
    return forms


# The lead form is timed first; over CLEAR_RATIO times native, the layer's other forms are skipped.
# Measurements: docs/design/composed-pass.md#the-lead-screen
# Under 1/CLEAR_RATIO of native's time, the lead decides without timing its rivals.
# Measurements: docs/design/composed-pass.md#lead_decides
LEAD_DECIDES = True
# The lead is one GEMM on maps of at most this many output positions, else the batched form.
# Measurements: docs/design/composed-pass.md#lead_one_gemm_positions
LEAD_ONE_GEMM_POSITIONS = 16


def lead_form(forms: tuple, positions: int) -> str | None:
    """The form of `forms` that `compare` times first (see `LEAD_ONE_GEMM_POSITIONS`), or None for
    fewer than two forms."""
    if len(forms) < 2:
        return None
    prefer = "one-gemm" if positions <= LEAD_ONE_GEMM_POSITIONS else "batched"
    return next((f for f in (prefer, prefer + "+phases") if f in forms), forms[0])


def compare(native: nn.Cell, composed: dict, x, r, input_grad: bool, memory: dict,
            native_margin: float = 1.0, refine=None, lead: str | None = None, extra: tuple = (),
            calls: int = 1) -> dict:
    """Time `native` and every composed layer of `composed` ({form: Cell}) on input `x` with output
    weights `r`, as the step runs them (forward, weight gradients and, if `input_grad`, the input
    gradient), and choose (`choose`, with `memory`: {form: extra MB}, native included, and
    `native_margin`). A form whose loss or gradients differ from native beyond `check_rtol` (of the
    input's dtype) is left out, and the reason says so.

    `refine(form)`, if given, returns variants of a form ({variant: Cell}; the conv's per-direction
    forms, see `measure`). It is called with the chosen form, or when native is chosen with the
    fastest composed form if that is within `CLEAR_RATIO` of native; each variant is timed and
    checked like the others and takes its form's place (and memory) if it is `REFINE_MARGIN` times
    faster than that form, and the choice is made again.

    `lead`, if given (a form of `composed`), is timed first and native after it; if it takes over
    `CLEAR_RATIO` times native, the other forms are not compiled or timed, and the
    reason names them; nor are they if it takes under 1/`CLEAR_RATIO` of native (`LEAD_DECIDES`: the
    lead and its `refine` variants are then the only forms timed).

    `extra`: the layers' arguments after `x`, the same constants for every form (see `_Probe`).
    `calls`: each probe applies its layer that many times in a row (`_Probe`); times are per call."""
    timed_native = _Timed(native, x, r, input_grad, extra, calls)
    reference = timed_native.first()  # compiled first: the composed forms are checked against its results
    times, rejected, probes = {}, {}, {}

    def run(forms: dict):
        for form, layer in forms.items():
            timed = _Timed(layer, x, r, input_grad, extra, calls)
            err = mismatch(reference, timed.first())
            if err > check_rtol(x.dtype):
                rejected[form] = err
            else:
                times[form] = timed.time(stop_above=CLEAR_RATIO * min(times.values()) if times else None)
                probes[form] = timed

    first = {lead: composed[lead]} if lead in composed and len(composed) > 1 else composed
    run(first)
    # native after the first forms, so that a native layer far slower than a composed form is timed
    # once, not REPEATS times
    times = {"native": timed_native.time(stop_above=CLEAR_RATIO * min(times.values()) if times else None), **times}
    rest = {f: c for f, c in composed.items() if f not in first}
    notes = ""
    if rest and lead in times and times[lead] > CLEAR_RATIO * times["native"]:
        notes += f"; {', '.join(rest)} not timed: {lead} took over {CLEAR_RATIO:g}x native"
    elif rest and lead in times and LEAD_DECIDES and times[lead] * CLEAR_RATIO < times["native"]:
        notes += f"; {', '.join(rest)} not timed: {lead} took under 1/{CLEAR_RATIO:g} of native"
    else:
        run(rest)
        times = {"native": times.pop("native"), **times}
    choice = choose(times, memory, native_margin)
    if refine is not None and len(times) > 1:
        choice, memory, refined = _refined(choice, times, memory, native_margin, refine, run)
        notes += refined
    choice, kept_native, confirmed = _confirmed(choice, times, timed_native, probes, native_margin)
    notes += confirmed
    shown = ", ".join(f"{k} {v:.1f} ms" + (f"/{memory[k]:.0f} MB" if k in memory else "") for k, v in times.items())
    shown += "".join(f"; {f} left out: differs from native by {e:.1e} (relative)" for f, e in rejected.items())
    shown += notes
    if choice == "native" and native_margin > 1.0 and min(times.values()) < times["native"] and not kept_native:
        shown += f"; native kept: no form is {native_margin:g}x faster"
    others = [v for k, v in times.items() if k != "native"]
    best = times[choice] if choice != "native" else (min(others) if others else float("nan"))
    return {"choice": choice, "native_ms": round(times["native"], 3), "gemm_ms": round(best, 3),
            "times": {k: round(v, 3) for k, v in times.items()},
            "extra_mb": round(memory[choice], 1),
            "reason": f"measured fwd+bwd{'' if input_grad else _NO_DX}{_chained(calls)}: {shown}"}


def _refined(choice: str, times: dict, memory: dict, native_margin: float, refine, run) -> tuple:
    """`compare`'s per-direction step: the chosen form's variants (or the fastest composed form's,
    when native was chosen within `CLEAR_RATIO`), timed by `run` into `times`; a variant
    `REFINE_MARGIN` faster than its form takes its place. `(choice, memory, notes)`."""
    notes = ""
    base = choice if choice != "native" else min((f for f in times if f != "native"), key=times.get)
    if times[base] >= CLEAR_RATIO * times["native"]:
        return choice, memory, notes
    variants = refine(base)
    run(variants)
    for form in variants:
        if form not in times:
            continue
        if times[form] * REFINE_MARGIN < times[base]:
            memory = {**memory, form: memory[base]}
            choice = choose({**{f: t for f, t in times.items() if f not in (base, *variants)},
                             form: times[form]}, memory, native_margin)
        else:
            notes += f"; {form} not {REFINE_MARGIN:g}x faster than {base}"
    return choice, memory, notes


def _confirmed(choice: str, times: dict, timed_native, probes: dict, native_margin: float) -> tuple:
    """`compare`'s confirmation: a composed choice whose lead over native is under `CONFIRM_RATIO`
    is timed again alternating with native (`confirm`) and kept only if it still wins; `times` takes
    the alternate figures. `(choice, kept_native, notes)`: `kept_native` when this step chose native."""
    if choice == "native" or times[choice] * CONFIRM_RATIO <= times["native"]:
        return choice, False, ""
    native_ms, form_ms = confirm(timed_native, probes[choice])
    if form_ms * native_margin < native_ms:
        times.update({"native": native_ms, choice: form_ms})  # the figures the choice rests on
        return choice, False, f"; {choice} confirmed, timed alternately with native: {form_ms:.1f} vs {native_ms:.1f} ms"
    return "native", True, (f"; native kept: {choice} not {native_margin:g}x faster when timed alternately with "
                            f"native ({form_ms:.1f} vs {native_ms:.1f} ms)")


def _chained(calls: int) -> str:
    return f" ({calls} calls in a row per probe, times per call)" if calls > 1 else ""


def _inputs(shape: tuple, out: tuple, dtype):
    rng = np.random.default_rng(0)  # (`ms.dtype_to_nptype` logs a deprecation warning since 2.7)
    return (ms.Tensor(rng.standard_normal(shape).astype(np.float32), dtype),
            ms.Tensor(rng.standard_normal(out).astype(np.float32), dtype))


def measure(conv: nn.Conv2d, shape: tuple, dtype, input_grad: bool = True) -> dict:
    """`compare` a conv layer with its composed forms (`plausible_forms`) at this input shape: the
    step's forward, weight gradients and, unless the layer's input is the batch itself
    (`input_grad=False`), its input gradient."""
    x, r = _inputs(shape, out_shape(conv, shape), dtype)
    forms, lead = timed_forms(conv, shape, input_grad)
    hw = (shape[2], shape[3])
    composed = {form: GemmConv2d(conv, hw, form, input_grad) for form in forms}
    memory = {"native": 0.0, **{f: extra_mb(conv, shape, f, input_grad) for f in forms}}

    def per_direction(form: str) -> dict:
        """The form with MindSpore's own weight-gradient kernel instead of its GEMM (one more probe,
        not one per form: the forms differ in their forward and input gradient)."""
        variant = str(dataclasses.replace(Form.parse(form), native="dw"))
        return {variant: GemmConv2d(conv, hw, variant, input_grad)} if variant in dw_forms(conv, hw) else {}

    return compare(conv, composed, x, r, input_grad, memory, native_margin=CONV_MARGIN, refine=per_direction,
                   lead=lead)


def timed_forms(conv: nn.Conv2d, shape: tuple, input_grad: bool = True) -> tuple[tuple, str | None]:
    """The composed forms `measure` times for this layer at this input shape (`plausible_forms`; one,
    'batched', for a layer whose 1x1 input meets one tap: the same (N, C) x (C, K) GEMM in every form)
    and the one it times first (`lead_form`, None for a single form)."""
    forms = ("batched",) if single_tap(conv, shape[2:]) is not None else tuple(plausible_forms(conv, shape, input_grad))
    _, _, ho, wo = out_shape(conv, shape)
    return forms, lead_form(forms, ho * wo)


# The `conv.NATIVE_FWD_DX` forms are never timed here (only `force=` takes them): they did not win where measured.
# Measurements: docs/design/composed-pass.md#native_fwd_dx


# A per-direction variant (MindSpore's weight-gradient kernel) must beat its form alone by this factor.
# Measurements: docs/design/composed-pass.md#refine_margin
REFINE_MARGIN = 1.1


# A GELU/LayerNorm/cross-entropy form must beat native by this factor: a near tie buys nothing, may cost memory.
# Measurements: docs/design/composed-pass.md#kind_margin
KIND_MARGIN = 1.1


def kind_key(device: str, kind, layer, shape: tuple, dtype) -> str:
    """The decision key of a layer of one of the pass's other kinds (`pass_.KINDS`: a module with
    `FORMULATION`, `config`, `FORMS`, `build`, `extra_mb`)."""
    return (f"{device}|mindspore-{ms.__version__}|{KIND_TIMING}|{kind.FORMULATION}|{kind.config(layer)}"
            f"|in{tuple(shape)} {dtype}")


# Part of every kind's decision key: bumped when the way those layers are timed changes (2: chained
# calls, `kind_calls`), so decisions timed the old way are measured again.
KIND_TIMING = "timing-2"


def measure_kind(kind, layer, shape: tuple, dtype) -> dict:
    """`compare` a layer with its kind's composed forms at this input shape: the output has the
    input's shape unless the kind says otherwise (`kind.out_shape(shape)`), and a kind whose layers
    take more than their input gives those arguments (`kind.probe_args(layer, shape)`: a loss's labels)."""
    out = kind.out_shape(shape) if hasattr(kind, "out_shape") else shape
    x, r = _inputs(shape, out, dtype)
    extra = kind.probe_args(layer, shape) if hasattr(kind, "probe_args") else ()
    composed = {form: kind.build(layer, form) for form in kind.FORMS}
    memory = {"native": 0.0, **{f: kind.extra_mb(shape) for f in kind.FORMS}}
    # not under graph-kernel fusion: it fused the chained calls into kernels whose compile ran for minutes
    # (the bench BERT's `jit-opt-fuse`: MindSpore's kernel-build process at 5.7 GB after 4 minutes)
    calls = 1 if fusion.active() else kind_calls(shape, out, extra)
    return compare(layer, composed, x, r, True, memory, native_margin=KIND_MARGIN, extra=extra, calls=calls)


# Layers of the other kinds up to this many input elements are timed as a chain of calls in one probe.
# Measurements: docs/design/composed-pass.md#kind_chain_elements
KIND_CHAIN_ELEMENTS = 2**21
KIND_CHAIN_MAX = 8


def kind_calls(shape: tuple, out: tuple, extra: tuple = ()) -> int:
    """How many calls in a row a probe of a layer of the other kinds makes (see `KIND_CHAIN_ELEMENTS`):
    1 for a layer whose output is not its input's shape or that takes more arguments (a loss)."""
    if tuple(out) != tuple(shape) or extra:
        return 1
    return int(max(1, min(KIND_CHAIN_MAX, KIND_CHAIN_ELEMENTS // max(1, int(np.prod(shape))))))
