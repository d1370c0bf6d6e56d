"""`mindstep.optimize`: rewrite a network's layers into faster formulations for this device."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn

from .._probe import probe_forward
from .._errors import bad_type
from . import decide
from .conv import GemmConv2d, supported


def record_conv_inputs(nets, run) -> dict:
    """{id(conv): (input shape, dtype)} for every Conv2d in `nets`, from one eager, inference-mode
    call of `run()` (see `mindstep._probe.probe_forward`)."""
    shapes = {}

    def hook(cell, args, out):
        shapes.setdefault(id(cell), (tuple(args[0].shape), args[0].dtype))

    probe_forward(nets, lambda cell: hook if isinstance(cell, nn.Conv2d) else None, run)
    return shapes


def _replace(root: nn.Cell, name: str, new: nn.Cell) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = root if not parent_name else dict(root.cells_and_names())[parent_name]
    # write _cells directly: Cell.__setattr__ would re-prefix the Parameter names
    parent._cells[attr] = new
    if isinstance(parent, (nn.SequentialCell, nn.CellList)) and hasattr(parent, "cell_list"):
        parent.cell_list = list(parent._cells.values())


def rewrite(nets, shapes: dict, *, device: str | None = None, cache_dir: str | None = None,
            measure: bool = True) -> list[dict]:
    """Decide and rewrite every Conv2d whose input shape is known; return the decision table."""
    device = device or ms.get_context("device_target")
    path = decide.cache_path(cache_dir)
    cache = decide.load_cache(path)
    table, dirty = [], False
    for net in nets:
        for name, cell in list(net.cells_and_names()):
            if not isinstance(cell, nn.Conv2d) or id(cell) not in shapes:
                continue
            shape, dtype = shapes[id(cell)]
            row = {"layer": name, "config": f"{cell.in_channels}->{cell.out_channels} k{cell.kernel_size[0]}x"
                   f"{cell.kernel_size[1]} s{cell.stride[0]}", "input": list(shape)}
            ok, why = supported(cell)
            if not ok:
                row.update(choice="native", reason=why)
            elif device in decide.NATIVE_FAST_DEVICES:
                row.update(choice="native", reason=f"native convolutions are fast on {device}")
            else:
                k = decide.key(device, cell, shape, dtype)
                if k not in cache and measure:
                    cache[k] = decide.measure(cell, shape, dtype)
                    dirty = True
                found = cache.get(k)
                if found is None:
                    row.update(choice="native", reason="not measured (measure=False) and not in the cache")
                else:
                    row.update({**found, "cached": not dirty or k in cache})
            if row["choice"] != "native":
                _replace(net, name, GemmConv2d(cell, (shape[2], shape[3]), row["choice"]))
            table.append(row)
    if dirty:
        decide.save_cache(path, cache)
    return table


def optimize(net: nn.Cell, example_inputs, *, device: str | None = None, cache_dir: str | None = None,
             measure: bool = True) -> list[dict]:
    """Rewrite `net`'s layers, in place, into the faster formulation measured for this device.

    Every rewritten layer keeps the same Parameter objects (checkpoints and optimizers are
    unaffected; `trainable_params()` is unchanged in identity, order and names) and the same
    numerics within float tolerance. Today: `nn.Conv2d` (group=1) -> im2col + GEMM with a GEMM
    backward (see `mindstep.optimize.conv`), chosen per layer configuration and input shape by
    timing both forms forward + backward on this device (cached on disk, see
    `mindstep.optimize.decide`). On GPU/Ascend the layers stay native.

    Args:
        net: the network to rewrite in place.
        example_inputs: a tuple of inputs for one `net(*example_inputs)` call at the training shape.
        device: 'CPU', 'GPU' or 'Ascend'; default: MindSpore's current device target.
        cache_dir: where `decisions.json` lives (default `$MINDSTEP_CACHE_DIR` or ~/.cache/mindstep).
        measure: measure shapes missing from the cache (else leave them native).

    Returns:
        The decision table: one dict per Conv2d with `layer`, `config`, `input`, `choice`,
        `reason` and, when measured, `native_ms`, `gemm_ms`, `extra_mb`.

    Example:
        >>> table = mindstep.optimize(net, (images,))  # doctest: +SKIP
        >>> [r["choice"] for r in table]  # doctest: +SKIP
    """
    if not isinstance(net, nn.Cell):
        raise bad_type("net", net, "a mindspore.nn.Cell", "Pass the network to rewrite.")
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    inputs = tuple(x if isinstance(x, ms.Tensor) else ms.Tensor(x) for x in example_inputs)
    shapes = record_conv_inputs([net], lambda: net(*inputs))
    return rewrite([net], shapes, device=device, cache_dir=cache_dir, measure=measure)


def render(table: list[dict]) -> str:
    lines = [f"{'layer':<28} {'config':<18} {'input':<18} {'choice':<7} {'native ms':>9} {'gemm ms':>8} "
             f"{'extra MB':>8}  reason"]
    for r in table:
        lines.append(f"{r['layer']:<28} {r['config']:<18} {str(tuple(r['input'])):<18} {r['choice']:<7} "
                     f"{r.get('native_ms', float('nan')):>9.1f} {r.get('gemm_ms', float('nan')):>8.1f} "
                     f"{r.get('extra_mb', 0.0):>8.1f}  {r['reason']}")
    return "\n".join(lines)
