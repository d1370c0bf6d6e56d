"""Measured, cached choice between a native layer and its composed form.

For each distinct (layer configuration, input shape) the pass times forward + input and weight
gradients of native and the composed forms on the actual device, in GRAPH_MODE like the training
step (for convs, the chosen form once more with the native weight-gradient kernel: per direction),
keeps the fastest, and stores the decision in a JSON file keyed by device, MindSpore version and shape, so the
measurement runs once per machine. On devices whose native convolutions are fast (GPU, Ascend) the
layers are left native without measuring.
"""
from __future__ import annotations

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
from .conv import NATIVE_DW, GemmConv2d, conv_pads, dw_forms, forms_for, out_shape, single_tap
from .memory import extra_mb

NATIVE_FAST_DEVICES = ("GPU", "Ascend")
# Bumped whenever the composed forms change, so cached decisions measured on old code are not reused.
FORMULATION = "gemmconv-22"
# A form that needs more memory must be this much faster than the leaner one to be chosen: a layer
# timed alone does not show the cost of its extra buffers inside a whole training graph (rrdbnet:
# one-GEMM layers won alone by 1.2x, yet the whole step ran faster and 1.9x leaner with batched).
MEMORY_MARGIN = 1.25
# A composed conv form must be this much faster than native to be chosen: a near tie timed alone can
# lose inside the step. Measured on an AMD EPYC (family 25 model 1, AVX2; batch 4, 32 px): rrdbnet's
# two 32->32 layers on 64x64 maps timed batched 49.6 vs native 50.0 ms alone and were composed; the
# step then ran 435-521 ms (median 472) against native's 412-448 (median 416) in 5 interleaved rounds.
# ResNet-18's near ties there (batched+native-dw 10.8 vs native 10.9 ms on 8x8 maps) bought nothing
# either: its step with only the clear wins composed ran as fast as with them (140-156 vs 138-164 ms).
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


# A layer whose channel counts are both within this factor of a measured layer's, with the same
# geometry otherwise (kernel, stride, dilation, pads, bias, group kind, batch, spatial size, dtype),
# takes that layer's decision instead of being measured (`neighbour`). Checked on mindcv models' fully
# measured tables (batch 16, 32 px, AMD EPYC): DenseNet-121 56 of 60 layers with such a neighbour
# had its decision, MobileNetV2 15 of 17; each of the others lost at most 0.6 ms by its own timings
# (near ties: 1.02 vs 0.97 ms, 5.99 vs 5.43 ms).
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


# A layer with no measured neighbour in width (`neighbour`) may take, without measuring, a composed
# decision measured on a layer of the same geometry on a larger map (`ancestor`): the same kernel,
# stride, dilation, pads, bias, group kind, batch, dtype and input-gradient need, any channels, more
# input positions but at most `INHERIT_POSITIONS` times its own, where the chosen form beat native by
# at least `INHERIT_RATIO`. It takes its own lead form (`inherited_form`: one GEMM on small maps, else
# batched), and is not checked against native here (as a shared decision is not; the forms are tested
# over a grid). Not the per-direction variant even where the source chose it: whether MindSpore's
# weight-gradient kernel beats the GEMM changes with the shape (ResNet-18 here: 1.19x faster on 8x8
# maps, 0.93x on 2x2), and carrying it over was no better in whole steps (in one process, 12
# interleaved rounds: ResNet-18 96.3 vs 94.5 ms lead only, a first try 106.2 vs 99.0 with every layer
# measured; EfficientNet-B0 199.9 vs 201.2; GhostNet 141.2 vs 147.1).
# Why: the pass's first call is mostly one probe compile per measured layer shape, and where native
# convolutions are slow a ResNet's layers win by 6-45x at every map size.
# Checked against fully measured tables (every distinct shape timed, batch 16, 32 px, Intel Xeon family
# 6 model 167, 2026-12-06; the pass visits larger maps first): over the bench's ResNet-18 and -50 and
# mindcv's ResNet-18, MobileNetV2, MobileNetV3-small, EfficientNet-B0, GhostNet, RegNetX-200MF,
# ShuffleNetV2 and DenseNet-121, 201 of 327 shapes are measured with `neighbour` alone and 172 with this
# rule too (ResNet-18 11 -> 5, ResNet-50 20 -> 14). By their own timings alone, the 31 inherited
# layers' lead forms cost 0.0-4.5 ms per model against their measured choices (of 27-170 ms summed over
# each model's shapes; the most, 4.3 ms, one EfficientNet depthwise layer whose variant won alone); none
# was measured native, and their own measured leads over native were 1.5x or more (with 64x the
# positions allowed, depthwise layers on 2x2 and 1x1 maps would have come in at 1.1x). Wins shrink on
# smaller maps for some kinds (depthwise 3x3: 5.9x at 16x16, 1.9x at 2x2, native at 1x1; 1x1 stride-1
# layers are native at 2x2 and larger but win at 1x1), so the margin matters: at a ratio of 3, one of
# those layers would have been composed against its measured native choice, at 2 five (0.1-2.4 ms
# each); a source on a map of the same size (what `neighbour` bounds by width) put 20 of DenseNet's
# 2x2 1x1 layers on one 3.0x layer's choice at 3.
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


# A probe's first call after its compile (`_Timed.first`: compiled apart, `Cell.compile`) counts as one
# of its timed calls when it took at least this long: its one-time costs are then noise. Measured on an
# AMD EPYC family 25 model 17 (a 64->64 3x3 conv, forward + backward, GRAPH_MODE): at (2, 64, 4, 4) the
# first call took 11.0 ms against 5.3-7.5 after it, at (4, 64, 8, 8) 44.6 vs 46.7-48.2, at
# (16, 64, 16, 16) 539 vs 531-630, at (32, 64, 56, 56) 17.8 s vs 21.2-21.9 s. At 224 px, batch 32, a
# native ResNet-50 3x3 layer's call takes 13-17 s there, and one call less per such layer is about a
# third of the pass's time.
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


# A composed form chosen with a lead over native of less than this is timed again, alternating call by
# call with native (`CONFIRM_PAIRS` pairs), and kept only if it still beats native by the margin there.
# Each form is otherwise timed in a block of its own, so a load that comes and goes between the blocks
# (another process, a test run) moves the comparison: on an AMD EPYC family 25 model 1 (native convs
# fast), ResNet-50 at 224 px, batch 32, composed 16 of 53 convs (1x1 layers timed 1.11-1.18x faster than
# native) with other work running and 1 of 53 without; quiet, the 16-layer step was 0.98x `jit`. Under
# a load of one busy core, on and off every 2 s, a native block came out 1.8x slower than alternating
# calls gave, so the bound is CLEAR_RATIO, past which no form is timed further anyway.
CONFIRM_RATIO = CLEAR_RATIO
CONFIRM_PAIRS = 5


def confirm(native: _Timed, form: _Timed, pairs: int = CONFIRM_PAIRS) -> tuple[float, float]:
    """Median ms of native and of a form over `pairs` calls each, alternating, so both see the same load."""
    native_ms, form_ms = [], []
    for _ in range(pairs):
        native_ms.append(native.time(1, fresh=True))
        form_ms.append(form.time(1, fresh=True))
    return statistics.median(native_ms), statistics.median(form_ms)


def time_layer(layer: nn.Cell, x, r, repeats: int = REPEATS, input_grad: bool = True) -> tuple[float, list]:
    """Median ms of forward + input (if `input_grad`) and weight gradients, compiled in GRAPH_MODE
    (first call excluded), and the first call's loss and gradients on the host."""
    timed = _Timed(layer, x, r, input_grad)
    values = timed.first()
    return timed.time(repeats), values


# At this many output positions or fewer, the batched forms (the kernel broadcast over the batch, one
# small GEMM per sample) are not timed when a one-GEMM form exists. Over the 226 layer shapes measured on
# this project's AMD EPYC (ResNet-18/50, mindcv MobileNetV2, DenseNet-121, RegNetX, ShuffleNetV2, 32 px),
# batched / one-gemm at <= 4 positions was never below 1.66x (1x1 s1: 2.0-48x, 3x3 s1: 3.7-14x, 3x3 s2:
# 1.7-18x); at 16 positions it went down to 0.52x, so larger maps time both.
BATCHED_MIN_POSITIONS = 5


# The "+phases" forms differ from the others only in the input gradient (by stride phases, see
# `conv._PhaseGrad`; forward and weight gradient are the same graphs), so:
# - a layer without an input gradient (its input is the batch: a strided stem) times only the others;
# - a strided 1x1 conv (a ResNet downsample) times only the "+phases" forms: its input gradient
#   touches one stride phase of the input, which they compute alone (the other phases are zeros),
#   where the other forms correlate the zero-inserted output gradient over the whole map. In the 45
#   such measurements this project's decision caches held (ResNet-18/50 at 32 and 64 px, AMD EPYC,
#   2026-11/12), the best other form took 1.06-7.3x the best "+phases" form's time (median 2.5x; the
#   smallest ratios on 2x2 inputs), never less.


def plausible_forms(conv: nn.Conv2d, shape: tuple, input_grad: bool = True) -> tuple:
    """The composed forms worth timing for this layer at this input shape (`forms_for`; without an
    input gradient no "+phases" form, on a strided 1x1 layer only those; less the batched forms on
    maps of fewer than `BATCHED_MIN_POSITIONS` output positions where a one-GEMM form exists)."""
    forms = forms_for(conv)
    if any(f.endswith("+phases") for f in forms):
        if not input_grad:
            forms = tuple(f for f in forms if not f.endswith("+phases"))
        elif tuple(conv.kernel_size) == (1, 1):
            forms = tuple(f for f in forms if f.endswith("+phases"))
    _, _, ho, wo = out_shape(conv, shape)
    if ho * wo < BATCHED_MIN_POSITIONS and any(f.startswith("one-gemm") for f in forms):
        return tuple(f for f in forms if not f.startswith("batched"))
    return forms


# Where a layer has several composed forms, one (`lead_form`) is timed first, then native; if it takes
# over CLEAR_RATIO times native, the others are not compiled or timed. Compiling the probes is most of
# the pass (ResNet-18 at 32 px, batch 16, empty cache, AMD EPYC family 25 model 1: 22.5 of 26.5 s, 0.5-1.0
# s per composed probe), and on CPUs whose native convolutions are fast most layers have every form
# far behind native: there, 64->64 on 8x8 timed batched 16.0 and one-gemm 16.4 against native 7.8 ms,
# and 64->128 stride 2 on 8x8 all four forms 18.4-24.3 against 5.8. The per-direction variant is not
# timed either then (it needs its base within CLEAR_RATIO). Where native is slow (the Zen 4 EPYC) the
# lead is within the ratio and every form is timed, as before.
LEAD_SCREEN = True
# And the other way round: where the lead takes under 1/CLEAR_RATIO of native's time, the other forms
# are not timed either (the per-direction variant of the lead still is). Where native convolutions are
# slow, every layer is such a case, and the forms differ far less among themselves than from native: on
# an Intel Xeon (family 6 model 167, AVX-512, batch 16, 32 px) ResNet-18's 11 layer configurations
# timed native at 12.6-147 ms and their leads 6-35x faster; the best other form was at most 10 %
# faster than the lead (a strided 1x1 layer: batched+phases 1.8 vs 2.0 ms), and with each lead's
# per-direction variant timed as before every layer got the form it got with all timed (or one within
# 3 %). That is 9 of the pass's 30 composed probes, ~0.3 s of compile each.
LEAD_DECIDES = True
# The lead is the one-GEMM form on maps of at most this many output positions, else the batched one
# (the phase form of that GEMM where only phase forms are plausible): at 16 positions and fewer one GEMM
# over the folded batch won in this project's caches (128->128 on 4x4: 8.9 vs 17.3 ms), at 64 they tied
# (16.4 vs 16.0) and from 256 the batched form won (the stem: 11.2 vs 13.8; rrdbnet's 64x64 maps).
LEAD_ONE_GEMM_POSITIONS = 16


def lead_form(forms: tuple, positions: int) -> str | None:
    """The form of `forms` that `compare` times first (see `LEAD_ONE_GEMM_POSITIONS`), or None for
    fewer than two forms or with `LEAD_SCREEN` off."""
    if len(forms) < 2 or not LEAD_SCREEN:
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
    `CLEAR_RATIO` times native, the other forms are not compiled or timed (`LEAD_SCREEN`), and the
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
        base = choice if choice != "native" else min((f for f in times if f != "native"), key=times.get)
        if times[base] < CLEAR_RATIO * times["native"]:
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
    kept_native = False  # by the alternate timing below, which says so in the reason itself
    if choice != "native" and times[choice] * CONFIRM_RATIO > times["native"]:
        native_ms, form_ms = confirm(timed_native, probes[choice])
        if form_ms * native_margin < native_ms:
            notes += f"; {choice} confirmed, timed alternately with native: {form_ms:.1f} vs {native_ms:.1f} ms"
            times.update({"native": native_ms, choice: form_ms})  # the figures the choice rests on
        else:
            notes += (f"; native kept: {choice} not {native_margin:g}x faster when timed alternately with native "
                      f"({form_ms:.1f} vs {native_ms:.1f} ms)")
            choice, kept_native = "native", True
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
        variant = form + NATIVE_DW
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


# The other per-direction forms (`conv.NATIVE_FWD_DX`: MindSpore's own forward and input gradient, the
# weight gradient by GEMM) are not timed here; `force=` can ask for them. Where native forward and input
# gradient are slow (the Zen 4 EPYC: 800-1630 ms against 6.8-47 ms for the native weight gradient, see
# `conv.NATIVE_DW`) they cannot win, and where they are fast they did not: on an AMD EPYC family 25
# model 1 (AVX2, batch 16), alone they took 0.95-1.64x native over nine ResNet-18 and depthwise/grouped
# shapes (1.04-1.29x on ResNet-18's 3x3 layers, never the 1.1x `CONV_MARGIN`), and forced on every layer
# the ResNet-18 step (32 px) ran level with the clear wins alone (139-166 vs 141-156 ms) and rrdbnet's
# slower than native (529-714 vs 412-448 ms). A probe per layer would only lengthen the first call.


# A per-direction variant (a conv form with MindSpore's own weight-gradient kernel) must be this much
# faster than its form alone to take its place. Measured in whole steps (the bench models, batch 16 and
# 4, one process, interleaved rounds, AMD EPYC Zen 4) while any faster variant was taken: ResNet-18
# at 64 px 1.11x faster, at 32 px 1.03-1.14x, ResNet-50 at 32 px level, but rrdbnet 0.93-0.96x, where
# 32 of 35 layers took variants that were level with their forms alone (20.0 vs 19.9 ms) or slower
# (they were counted leaner then), and the step peaked 60 MB higher.
REFINE_MARGIN = 1.1


# A form of one of the pass's other kinds (`pass_.KINDS`) must be this much faster than native to be
# chosen: a near tie buys nothing and may cost memory. Measured with the LayerNorm's native-forward
# form on an AMD EPYC with AVX-512: on the bench BERT it timed level with native (2.2 ms each) yet
# composing its four LayerNorms raised the step's peak RSS by 55 MB at batch 16 (+7 at batch 2, -1 at
# batch 64); on a 768-wide BERT it won 1.14x alone, 1.04x in the whole step, for +20 % of peak.
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


# A layer of the other kinds whose input has at most this many elements is timed as a chain of calls
# in one probe graph (`kind_calls`, at most KIND_CHAIN_MAX; not under graph-kernel fusion): one call
# of a small layer is a few ms, of which the probe's own launch, loss and host copies are ~1.3 ms,
# and its timing moved with warm-up.
# Measured on an Intel Xeon family 6 model 167 (the bench BERT's (16, 64, 128) LayerNorm, forward and
# backward, GRAPH_MODE): alone, 15 calls in a row, native 3.1-3.7 and `reduce` 2.7-2.9 ms, but
# alternating (the pass's confirmation) 3.2-3.4 vs 3.3-3.6, so the pass kept native; yet the whole
# unfused step ran 12-14 % faster with its four LayerNorms `reduce` (40.3-43.6 vs 46.3-50.9 ms). Chained
# 8 in a row, alternating: native 3.0 vs reduce 1.8-2.3 ms per call, as the step has it.
KIND_CHAIN_ELEMENTS = 2**21
KIND_CHAIN_MAX = 8


def kind_calls(shape: tuple, out: tuple, extra: tuple = ()) -> int:
    """How many calls in a row a probe of a layer of the other kinds makes (see `KIND_CHAIN_ELEMENTS`):
    1 for a layer whose output is not its input's shape or that takes more arguments (a loss)."""
    if tuple(out) != tuple(shape) or extra:
        return 1
    return int(max(1, min(KIND_CHAIN_MAX, KIND_CHAIN_ELEMENTS // max(1, int(np.prod(shape))))))
