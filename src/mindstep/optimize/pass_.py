"""`mindstep.optimize`: rewrite a network's layers into faster formulations for this device."""
from __future__ import annotations

import fnmatch
import gc

import mindspore as ms
from mindspore import nn

from .._cells import replace_cell
from .._context import gc_frozen
from .._probe import probe_forward
from .._errors import bad_type, bad_value, check_bool, check_float
from . import decide, memory
from . import cross_entropy, fusion, gelu, layernorm
from .conv import ALL_FORMS, Form, GemmConv2d, conv_pads, layer_forms, supported

# The layer kinds besides `nn.Conv2d` (which has its own forms, sharing and compile-memory rules): each
# a module with `matches(cell)`, `supported(cell, shape, dtype)`, `config`, `FORMS`, `FORMULATION`,
# `build(cell, form)` and `extra_mb(shape)` (shapes are the first argument's); their output has their
# input's shape unless the kind has `out_shape(shape)`, and a kind whose layers take more arguments
# gives them for its measurement with `probe_args(cell, shape)` (a loss: its labels).
KINDS = (gelu, layernorm, cross_entropy)


def kind_of(cell):
    return next((kind for kind in KINDS if kind.matches(cell)), None)


def rewritable(cell) -> bool:
    """A layer the pass can rewrite: an `nn.Conv2d` or a layer of one of `KINDS`."""
    return isinstance(cell, nn.Conv2d) or kind_of(cell) is not None


def record_inputs(nets, run, inputs=(), stats: dict | None = None) -> dict:
    """{id(layer): (input shape, dtype, input needs a gradient)} for every layer in `nets` the pass can
    rewrite (`nn.Conv2d`, `KINDS`), from one eager, inference-mode call of `run()` (see
    `mindstep._probe.probe_forward`).

    A conv whose input is one of `inputs` itself (the batch, e.g. the stem of an image model) needs
    no input gradient in a training step: MindSpore drops that unused computation from the compiled
    step, so the pass times such a layer without it.

    `stats`, when given, receives what `memory.native_growth_mb` reads off the same call: `calls`
    (calls of leaf Cells, layers without sub-Cells), `activation_mb` (the size of their tensor
    outputs) and `param_mb` (of the nets' trainable parameters)."""
    shapes = {}
    seen = {"calls": 0, "activation_mb": 0.0}

    def hook_for(cell):
        layer, leaf = rewritable(cell), next(iter(cell.cells()), None) is None
        if not (layer or leaf):
            return None

        def hook(cell, args, out):  # returns None: a hook's return value would replace the output
            if layer:
                batch = any(args[0] is t for t in inputs)
                shapes.setdefault(id(cell), (tuple(args[0].shape), args[0].dtype, not batch))
            if leaf:
                seen["calls"] += 1
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(t, ms.Tensor):
                        seen["activation_mb"] += t.nbytes / 2**20

        return hook

    probe_forward(nets, hook_for, run)
    if stats is not None:
        stats.update(seen, param_mb=sum(p.nbytes for net in nets for p in net.trainable_params()) / 2**20)
    return shapes


# The shape probe runs at batches 1 and 2 when the training batch is at least this: the two calls
# then cost 3 samples' forward instead of the whole batch's (docs/design/measurements.md).
SMALL_PROBE_FROM = 4


def _sliced(inputs, b: int, batch: int) -> tuple:
    """`inputs` with every tensor whose first axis is the batch cut to its first `b` samples."""
    return tuple(t[:b] if isinstance(t, ms.Tensor) and t.ndim >= 1 and t.shape[0] == batch else t
                 for t in inputs)


def _extrapolate(one: dict, two: dict, batch: int) -> dict | None:
    """The shapes at `batch` from those recorded at batches 1 and 2, or None unless every layer saw
    the same input but for a first axis proportional to the batch (s at 2 = 2 x s at 1)."""
    if one.keys() != two.keys():
        return None
    shapes = {}
    for key, (s1, dtype, grad) in one.items():
        s2, dtype2, grad2 = two[key]
        if (dtype2, grad2) != (dtype, grad) or len(s1) != len(s2) or not s1 or s2[1:] != s1[1:] \
                or s2[0] != 2 * s1[0]:
            return None
        shapes[key] = ((s1[0] * batch,) + tuple(s1[1:]), dtype, grad)
    return shapes


def probe_inputs(nets, run, inputs=(), stats: dict | None = None) -> dict:
    """`record_inputs` for `run(*inputs)`, read off two calls at batches 1 and 2 when that gives the
    whole batch's shapes.

    The batch is the first axis of the first tensor in `inputs`; from `SMALL_PROBE_FROM` samples on,
    `run` is called on every batch-sized tensor cut to 1 and then 2 samples (others unchanged), and
    each layer's shape at the batch is extrapolated when its first axis doubled and nothing else
    moved (`_extrapolate`), `stats` likewise (calls equal, activation sizes linear). Otherwise (fewer
    samples, a call that raises at the small batch, a layer whose shape does not follow the batch)
    the probe is one call on the whole batch, as before. A wrong guess could only cost speed: a
    rewritten conv reads the batch from its input at run time and falls back to the native kernel for
    an input size it was not built for (`GemmConv2d.construct`)."""
    first = next((t for t in inputs if isinstance(t, ms.Tensor) and t.ndim >= 1), None)
    batch = int(first.shape[0]) if first is not None else 0
    if batch >= SMALL_PROBE_FROM:
        recorded = []
        try:
            for b in (1, 2):
                part = _sliced(inputs, b, batch)
                counts = {}
                recorded.append((record_inputs(nets, lambda: run(*part), part, counts), counts))
        except Exception:  # noqa: BLE001 - e.g. a forward that hard-codes its batch: probe the whole batch
            recorded = []
        if recorded:
            (one, c1), (two, c2) = recorded
            shapes = _extrapolate(one, two, batch)
            if shapes is not None and c1["calls"] == c2["calls"]:
                if stats is not None:
                    grown = c2["activation_mb"] - c1["activation_mb"]
                    stats.update(c1, activation_mb=c1["activation_mb"] + grown * (batch - 1))
                return shapes
    counts = {}
    shapes = record_inputs(nets, lambda: run(*inputs), inputs, counts)
    if stats is not None:
        stats.update(counts)
    return shapes


PEAK_RATIO = 1.25  # the composed forms may add at most a quarter of the native step's peak memory


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def budget_mb(rss_before_probe: float, rss_after_probe: float, native_peak_mb: float | None = None,
              native_growth_mb: float = 0.0) -> float:
    """The memory the composed forms may keep: (PEAK_RATIO - 1) x the native step's peak, less the
    part of the shape probe's own memory a step may keep (`PROBE_KEPT`).

    The native step's peak is `native_peak_mb` when known (e.g. measured by `mindstep bench`'s `jit`
    row); otherwise the memory this process held before the probe plus `native_growth_mb`, a lower
    bound of what the native step adds to it (`memory.native_growth_mb`, from the probe's counts).
    """
    if native_peak_mb is not None:
        reference = native_peak_mb
    else:
        reference = rss_before_probe + max(0.0, native_growth_mb)
    return max(0.0, (PEAK_RATIO - 1.0) * reference - PROBE_KEPT * max(0.0, rss_after_probe - rss_before_probe))


# How much of the shape probe's own memory (an eager forward) a training step keeps: the native `jit`
# step's peak RSS with the probe run first against without: at most 0.42 of it, so a half is
# counted (docs/design/measurements.md).
PROBE_KEPT = 0.5


def apply_budget(rows: list[dict], budget_mb: float | None) -> None:
    """Within `budget_mb` of expected extra memory, trade the least speed per MB saved.

    Each row's `options` maps a form (native included) to `(ms, extra_mb)`; while the expected total
    is over the budget, the move to a leaner option of some layer that loses the fewest ms per MB
    saved is taken (a leaner *and* faster option first), so a layer steps down to a leaner composed
    form before it goes back to native. A row's `extra_mb` is `memory.extra_mb`'s upper-bound
    estimate; a whole step keeps about `memory.RETAINED` of it, which is what the budget counts.
    """
    if budget_mb is None:
        return
    for r in rows:
        if "options" not in r:
            r["options"] = {"native": (r.get("native_ms", 0.0), 0.0),
                            **({r["choice"]: (r["gemm_ms"], r["extra_mb"])} if r["choice"] != "native" else {})}
    if budget_mb <= 0:  # no extra memory at all: even a form whose estimate rounds to 0 MB goes native
        for r in rows:
            if r["choice"] != "native":
                r.update(choice="native", extra_mb=0.0,
                         reason=f"memory budget is {budget_mb:g} MB: native instead of {r['choice']}; "
                                + r["reason"].split("; ")[-1])
        return
    total = memory.RETAINED * sum(r["extra_mb"] for r in rows if r["choice"] != "native")
    while total > budget_mb:
        best = None
        for r in rows:
            if r["choice"] == "native":
                continue
            ms_now, mb_now = r["options"][r["choice"]]
            for form, (ms_o, mb_o) in r["options"].items():
                if mb_o < mb_now:
                    cost = (ms_o - ms_now) / (mb_now - mb_o)
                    if best is None or cost < best[0]:
                        best = (cost, r, form)
        if best is None:
            break
        _, r, form = best
        old, (ms_o, mb_o) = r["choice"], r["options"][form]
        total -= memory.RETAINED * (r["extra_mb"] - mb_o)
        r.update(choice=form, extra_mb=round(mb_o, 1), gemm_ms=ms_o if form != "native" else r.get("gemm_ms"),
                 reason=f"over the memory budget ({budget_mb:.0f} MB): {form} instead of {old}, which would keep "
                        f"up to {r['options'][old][1]:.1f} MB; " + r["reason"].split("; ")[-1])


SETTINGS_KEYS = ("native_peak_mb", "memory_budget_mb", "cache_dir", "measure", "force", "share", "fuse")


def check_settings(optimize, jit: bool = True) -> dict | None:
    """A step's `optimize=` as None (off) or a dict of the pass's settings; `jit`: the step's own setting (a
    PyNative step runs its ops one by one: there is nothing to fuse)."""
    if isinstance(optimize, bool):
        return {} if optimize else None
    if not isinstance(optimize, dict):
        raise bad_type("optimize", optimize, "True, False or a dict of the pass's settings",
                       "Pass `optimize=True`, or e.g. `optimize={'native_peak_mb': 1200}`.")
    unknown = sorted(set(optimize) - set(SETTINGS_KEYS))
    if unknown:
        raise bad_value("optimize", optimize, f"a dict with keys among {SETTINGS_KEYS}",
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
        fusion.check_available()
    if "force" in optimize:
        check_force(optimize["force"])
    return dict(optimize)


def check_force(force) -> dict | None:
    """Validate `force=`: None, or a dict of layer-name patterns (fnmatch) to a form or 'native'."""
    if force is None:
        return None
    choices = tuple(dict.fromkeys(("native",) + ALL_FORMS + sum((kind.FORMS for kind in KINDS), ())))
    if not isinstance(force, dict) or not all(isinstance(k, str) for k in force):
        raise bad_type("force", force, "None or a dict {layer-name pattern: form}",
                       "Example: force={'*': 'one-gemm'} or force={'layer4.*': 'batched', '*': 'native'}.")
    for pattern, form in force.items():
        if form not in choices:
            raise bad_value(f"force[{pattern!r}]", form, f"one of {choices}",
                            "Name a composed form, or 'native' to keep the layer as it is (a conv form "
                            "asked of a GELU or LayerNorm layer gives 'composed', and 'composed' asked of a "
                            "conv its first form).")
    return dict(force)


def forced_form(name: str, forms: tuple, force: dict | None) -> tuple[str, str] | None:
    """(form, pattern) of the first `force` pattern matching the layer name, or None; `forms` are the
    layer's own composed forms. A form the layer does not have gives the nearest one it has: without
    '+phases' (a layer not strided, or dilated), without the native weight gradient (a layer that
    becomes a plain matmul), the base form, else its first form (a grouped or depthwise conv:
    "batched"; a GELU or LayerNorm: "composed")."""
    for pattern, form in (force or {}).items():
        if fnmatch.fnmatchcase(name, pattern):
            if form != "native" and form not in forms:
                parsed = Form.parse(form) if form in ALL_FORMS else None  # other kinds' forms have no parts
                nearest = () if parsed is None else (str(Form(parsed.gemm, native=parsed.native)), str(parsed.base),
                                                     parsed.gemm)
                form = next((f for f in nearest if f in forms), forms[0])
            return form, pattern
    return None


def rewrite(nets, shapes: dict, *, device: str | None = None, cache_dir: str | None = None,
            measure: bool = True, memory_budget_mb: float | None = None, force: dict | None = None,
            share: bool = True) -> list[dict]:
    """Decide and rewrite every Conv2d and `KINDS` layer whose input shape is known; return the
    decision table.

    `memory_budget_mb` caps the summed extra memory of the composed forms (None: no cap). `force`
    (see `check_force`) fixes the form of the layers whose names match, without measuring: the
    budget does not move them, and they run on every device. `share`: a layer not in the cache
    whose channel counts are within `decide.SHARE_FACTOR` of a measured layer of the same geometry
    takes that layer's decision (`decide.neighbour`) instead of being measured, and a layer without
    one whose geometry won by `decide.INHERIT_RATIO` on a larger map takes its own lead form
    (`decide.ancestor`); such decisions are not written to the cache, which holds measurements only.
    """
    device = device or ms.get_context("device_target")
    path = decide.cache_path(cache_dir)
    cache = decide.load_cache(path)
    table, dirty, todo, configs, seen = [], False, [], set(), set()
    for net in nets:
        for name, cell in list(net.cells_and_names()):
            if id(cell) not in shapes or id(cell) in seen:  # a layer reached from two of the nets: once
                continue
            seen.add(id(cell))
            shape, dtype, input_grad = shapes[id(cell)]
            kind = kind_of(cell)
            if not name:  # the net itself is the layer: nothing holds it that could hold a replacement
                table.append({"layer": type(cell).__name__, "config": kind.config(cell) if kind else "conv2d",
                              "input": list(shape), "choice": "native",
                              "reason": "the network given is this layer itself, with no parent Cell to put "
                                        "a replacement in: wrap it in a Cell (or nn.SequentialCell) to rewrite it"})
                continue
            if kind is not None:
                row = _kind_row(kind, name, cell, shape, dtype, device, cache, force, measure)
                measured_now = row.pop("measured", False)
                dirty = dirty or measured_now
                table.append(row)
                todo.append((net, name, cell, shape, row))
                continue
            if not isinstance(cell, nn.Conv2d):
                continue
            row, measured_now = _conv_row(name, cell, shape, dtype, input_grad, device, cache, force, measure,
                                          share, configs)
            dirty = dirty or measured_now
            table.append(row)
            todo.append((net, name, cell, shape, row))
    if dirty:
        decide.save_cache(path, cache)
    apply_budget(table, memory_budget_mb)
    for row in table:
        row.pop("options", None)
    for net, name, cell, shape, row in todo:
        if row["choice"] != "native":
            kind = kind_of(cell)
            new = (kind.build(cell, row["choice"]) if kind is not None
                   else GemmConv2d(cell, (shape[2], shape[3]), row["choice"], shapes[id(cell)][2]))
            replace_cell(net, name, new)
    return table


def _conv_row(name: str, cell, shape, dtype, input_grad: bool, device: str, cache: dict, force, measure: bool,
              share: bool, configs: set) -> tuple[dict, bool]:
    """A Conv2d's decision-table row (forced, refused, shared, inherited, cached or measured now) and
    whether it was measured now; `configs` holds the composed configurations seen so far (the first
    layer of each carries its compile memory)."""
    measured = False
    row = {"layer": name, "config": f"{cell.in_channels}->{cell.out_channels} k{cell.kernel_size[0]}x"
           f"{cell.kernel_size[1]} s{cell.stride[0]}" + (f" g{cell.group}" if cell.group != 1 else ""),
           "input": list(shape)}
    if not _settled(row, supported(cell), layer_forms(cell, shape[2:]), force, device, "convolutions",
                    lambda form: memory.extra_mb(cell, shape, form, input_grad)):
        k = decide.key(fusion.key_device(device), cell, shape, dtype, input_grad)
        cached = k in cache
        source = decide.neighbour(cache, k) if share and not cached else None
        elder = decide.ancestor(cache, k) if share and not cached and source is None else None
        if source is not None:
            found = decide.shared(cache[source], source, k)
        elif elder is not None:
            form = decide.inherited_form(cell, shape, input_grad)
            found = decide.inherited(cache[elder], elder, k, form)
        else:
            if not cached and measure:
                cache[k] = decide.measure(cell, shape, dtype, input_grad)
                measured = True
            found = cache.get(k)
        if found is None:
            row.update(choice="native", reason="not measured (measure=False) and not in the cache")
        else:
            row.update({**found, "cached": cached})
            # timings are measured (cached), memory is computed from the shapes; the first layer
            # of each composed configuration (shared `_ConvFn`) also carries its compile memory
            times = found.get("times", {})
            fn_key = (cell.kernel_size, cell.stride, cell.dilation, conv_pads(cell, shape[2], shape[3]),
                      tuple(shape[2:]), input_grad)
            first = fn_key not in configs
            configs.add(fn_key)
            row["options"] = {form: (ms_, 0.0 if form == "native" else round(
                memory.extra_mb(cell, shape, form, input_grad)
                + (memory.config_mb(cell, form, shape[2:]) if first else 0.0), 1))
                for form, ms_ in times.items()}
            row["extra_mb"] = row["options"].get(row["choice"], (0.0, 0.0))[1]
    return row, measured


def _settled(row: dict, support: tuple, forms: tuple, force, device: str, what: str, extra_mb) -> bool:
    """Fill `row` for a layer decided without measuring, and say whether it was: not `supported`
    (`support` = (ok, why)), forced by a `force` pattern (among the layer's `forms`; `extra_mb(form)` its
    memory), or on a device whose native `what` are fast. False: the cache or a measurement decides."""
    ok, why = support
    forced = forced_form(row["layer"], forms, force) if ok else None
    if not ok:
        row.update(choice="native", reason=why)
    elif forced is not None:
        form, pattern = forced
        mb = 0.0 if form == "native" else extra_mb(form)
        row.update(choice=form, extra_mb=round(mb, 1), options={form: (0.0, mb)},
                   reason=f"forced by force[{pattern!r}]")
    elif device in decide.NATIVE_FAST_DEVICES:
        row.update(choice="native", reason=f"native {what} are fast on {device}")
    else:
        return False
    return True


def _kind_row(kind, name: str, cell, shape, dtype, device, cache: dict, force, measure: bool) -> dict:
    """The decision row of one layer of a `KINDS` kind (see `rewrite`); `measured` is set when it was
    measured now (the cache then needs saving). Each distinct input shape is measured (no sharing
    across widths: these layers have few distinct shapes per network)."""
    row = {"layer": name, "config": kind.config(cell), "input": list(shape)}
    if not _settled(row, kind.supported(cell, shape, dtype), kind.FORMS, force, device, "kernels",
                    lambda form: kind.extra_mb(shape)):
        k = decide.kind_key(fusion.key_device(device), kind, cell, shape, dtype)
        cached = k in cache
        if not cached and measure:
            cache[k] = decide.measure_kind(kind, cell, shape, dtype)
            row["measured"] = True
        found = cache.get(k)
        if found is None:
            row.update(choice="native", reason="not measured (measure=False) and not in the cache")
        else:
            row.update({**found, "cached": cached})
            row["options"] = {form: (ms_, 0.0 if form == "native" else round(kind.extra_mb(shape), 1))
                              for form, ms_ in found.get("times", {}).items()}
            row["extra_mb"] = row["options"].get(row["choice"], (0.0, 0.0))[1]
    return row


def optimize(net: nn.Cell, example_inputs, *, device: str | None = None, cache_dir: str | None = None,
             measure: bool = True, memory_budget_mb="auto", force: dict | None = None,
             share: bool = True) -> list[dict]:
    """Rewrite `net`'s layers, in place, into the faster formulation measured for this device.

    Every rewritten layer keeps the same Parameter objects (checkpoints and optimizers are
    unaffected; `trainable_params()` is unchanged in identity, order and names) and the same
    numerics within float tolerance. Today: `nn.Conv2d` (any group, depthwise included) -> im2col +
    GEMM with a GEMM backward, or (per direction) with MindSpore's own
    weight-gradient kernel (see `mindstep.optimize.conv`), `nn.GELU` (float32 or float16)
    -> elementwise kernels in float32 with a recomputing backward (`mindstep.optimize.gelu`), and
    `nn.LayerNorm` over the last axis (float32 or float16) -> elementwise kernels and matrix-vector
    products or reductions, both directions or the backward only (`mindstep.optimize.layernorm`), and
    `nn.CrossEntropyLoss` on 2-D logits -> `LogSoftmax` and a gather, with a softmax-and-scatter
    backward, or the rows' log-sum-exp from elementwise kernels and reductions
    (`mindstep.optimize.cross_entropy`; inside a Cell: a layer that is `net` itself stays); each
    chosen per layer configuration and input shape by timing the forms forward + backward on this
    device (cached on disk, see `mindstep.optimize.decide`). On GPU/Ascend the layers stay native.

    Args:
        net: the network to rewrite in place.
        example_inputs: a tuple of inputs for one `net(*example_inputs)` call at the training shape.
        device: 'CPU', 'GPU' or 'Ascend'; default: MindSpore's current device target.
        cache_dir: where `decisions.json` lives (default `$MINDSTEP_CACHE_DIR` or ~/.cache/mindstep).
        measure: measure shapes missing from the cache (else leave them native).
        memory_budget_mb: cap on the summed extra memory the composed forms keep during a step
            (estimated from the shapes, see `memory.extra_mb`); over it, the layers losing the least
            time per MB saved step down to a leaner form or back to native (`apply_budget`). "auto" (default): `budget_mb` with this process's memory
            plus a lower bound of what the native step adds (`memory.native_growth_mb`) standing in
            for the native step's peak (conservative); None: no cap; or a number of MB.
        force: `{layer-name pattern: form}` (fnmatch patterns, first match wins; forms: 'native',
            'batched', 'one-gemm', 'batched+phases', 'one-gemm+phases' for convs, each also with
            '+native-dw' (MindSpore's own weight-gradient kernel), 'batched+native-fwd-dx' and
            'one-gemm+native-fwd-dx' (MindSpore's own forward and input gradient, only the weight
            gradient by that GEMM; never chosen by measuring, see `decide`), 'composed' for GELU,
            'composed', 'native-fwd' (MindSpore's forward, the backward composed) and 'reduce'
            (composed with reduction kernels) for LayerNorm, 'composed' and 'lse' (elementwise
            kernels and row reductions, for graph-kernel fusion) for CrossEntropyLoss; a form a
            layer lacks gives the nearest it has, see `forced_form`): those layers take that
            form without measuring, e.g. for tests that need a given table (`{'*': 'one-gemm'}`).
        share: let a layer take the decision of a measured layer of the same geometry whose channel
            counts are within 2x of its own (`decide.SHARE_FACTOR`) instead of measuring it, or, without
            one, compose it where a layer of that geometry on a map of at most 16x its positions beat
            native by 4x (`decide.ancestor`) (default); False measures every distinct shape.

    Returns:
        The decision table: one dict per Conv2d, GELU, LayerNorm or CrossEntropyLoss with `layer`,
        `config`, `input`, `choice`, `reason` and, when measured, `native_ms`, `gemm_ms` (the composed
        form's time: the chosen one's, else the fastest), `extra_mb`.

    Example:
        `table = mindstep.optimize(net, (images,))`, then `[r["choice"] for r in table]`.
    """
    if not isinstance(net, nn.Cell):
        raise bad_type("net", net, "a mindspore.nn.Cell", "Pass the network to rewrite.")
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    if memory_budget_mb != "auto" and memory_budget_mb is not None:
        check_float("memory_budget_mb", memory_budget_mb, low=0.0,
                    fix='Pass "auto", None for no cap, or a number of MB, e.g. memory_budget_mb=500.')
    force = check_force(force)
    check_bool("share", share)
    inputs = tuple(x if isinstance(x, ms.Tensor) else ms.Tensor(x) for x in example_inputs)
    table, _ = run_pass([net], net, memory_budget_mb=memory_budget_mb, device=device,
                        cache_dir=cache_dir, measure=measure, inputs=inputs, force=force, share=share)
    return table


def run_pass(nets, run, *, memory_budget_mb="auto", native_peak_mb: float | None = None, device=None,
             cache_dir=None, measure: bool = True, inputs=(), force=None,
             share: bool = True) -> tuple[list[dict], float | None]:
    """Probe the input shapes of the layers the pass can rewrite with `run(*inputs)` (`probe_inputs`:
    at batches 1 and 2 where that gives them), fix the budget, rewrite; `(table, budget)`.

    The one sequence behind `optimize` and `TrainStep(optimize=...)`. `memory_budget_mb="auto"`
    derives the budget with `budget_mb` (from `native_peak_mb` when given), counting the probe's own
    memory against it."""
    before = rss_mb()
    # every probe graph compiles behind MindSpore's full `gc.collect()`: keep the process's existing
    # objects out of those walks (`gc_frozen`); what they leave behind is collected just below
    with gc_frozen():
        stats = {}
        shapes = probe_inputs(nets, run, inputs, stats)
        if memory_budget_mb == "auto":
            memory_budget_mb = budget_mb(before, rss_mb(), native_peak_mb, memory.native_growth_mb(**stats))
        table = rewrite(nets, shapes, device=device, cache_dir=cache_dir, measure=measure,
                        memory_budget_mb=memory_budget_mb, force=force, share=share)
    # the probes' Cells (and the graphs MindSpore compiled for them) are garbage now: free them before
    # the step compiles, rather than whenever Python's cycle collector next runs
    gc.collect()
    return table, memory_budget_mb


def run_with_settings(nets, run, settings: dict, inputs=()) -> tuple[list[dict], float | None]:
    """`run_pass` with a step's `optimize=` settings dict (`TrainStep`, `GANStep`): `(table, budget)`."""
    return run_pass(nets, run, memory_budget_mb=settings.get("memory_budget_mb", "auto"),
                    native_peak_mb=settings.get("native_peak_mb"), cache_dir=settings.get("cache_dir"),
                    measure=settings.get("measure", True), inputs=inputs, force=settings.get("force"),
                    share=settings.get("share", True))


def render(table: list[dict]) -> str:
    wide = max([len("choice")] + [len(r["choice"]) for r in table])  # e.g. one-gemm+phases+native-dw
    lines = [f"{'layer':<28} {'config':<24} {'input':<18} {'choice':<{wide}} {'native ms':>9} {'composed ms':>11} "
             f"{'extra MB':>8}  reason"]
    for r in table:
        lines.append(f"{r['layer']:<28} {r['config']:<24} {str(tuple(r['input'])):<18} {r['choice']:<{wide}} "
                     f"{r.get('native_ms', float('nan')):>9.1f} {r.get('gemm_ms', float('nan')):>11.1f} "
                     f"{r.get('extra_mb', 0.0):>8.1f}  {r['reason']}")
    return "\n".join(lines)
