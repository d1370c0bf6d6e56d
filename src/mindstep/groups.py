"""Optimizer parameter groups: weight decay off for biases and norms, LR multipliers by name.

`param_groups(net, ...)` returns the list of group dicts that MindSpore optimizers accept:
`nn.Adam`, `nn.AdamWeightDecay`, `nn.Momentum`, ... and `mindspore.experimental.optim.*`.
"""
from __future__ import annotations

import fnmatch

from mindspore import nn

from ._errors import bad_type, bad_value, check_float

NORM_CELLS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm2d)


def _owners(net: nn.Cell) -> dict:
    """Parameter name -> the Cell that directly owns it."""
    owners = {}
    for _, cell in net.cells_and_names():
        for param in cell.get_parameters(expand=False):
            owners[param.name] = cell
    return owners


def _no_decay(name: str, owner, patterns) -> bool:
    parts = name.lower().split(".")
    return isinstance(owner, NORM_CELLS) or any(p in part for p in patterns for part in parts)


def param_groups(net: nn.Cell, *, weight_decay: float = 0.0, no_decay=("bias", "norm", "bn", "ln"),
                 lr: float | None = None, lr_scale: dict | None = None, order_params: bool = True) -> list:
    """Group `net.trainable_params()` for a MindSpore optimizer.

    Args:
        net: the network.
        weight_decay: decay for every parameter except the no-decay ones.
        no_decay: substrings of a name component (`fc.bias`, `bn1.gamma`, `ln_f.beta`) whose
            parameters get weight_decay 0; parameters owned by a norm Cell (BatchNorm, LayerNorm,
            GroupNorm) are always no-decay.
        lr: the base LR; required with `lr_scale`. Groups carry `lr = lr * scale`.
        lr_scale: `{name pattern: multiplier}`, fnmatch patterns on parameter names
            (`"head.*": 10.0`); the first matching pattern wins.
        order_params: append `{"order_params": net.trainable_params()}`, which `nn` optimizers use
            to keep the network's parameter order (set False for `mindspore.experimental.optim`,
            which does not accept that key).

    Returns:
        A list of dicts `{"params": [...], "weight_decay": wd[, "lr": lr]}` (empty groups dropped).

    Example:
        `opt = nn.AdamWeightDecay(param_groups(net, weight_decay=1e-4, lr=1e-3, lr_scale={"head.*": 10.0}),
        learning_rate=1e-3)`.
    """
    if not isinstance(net, nn.Cell):
        raise bad_type("net", net, "a mindspore.nn.Cell", "Pass your network.")
    weight_decay = check_float("weight_decay", weight_decay, low=0.0)
    if isinstance(no_decay, str):
        no_decay = (no_decay,)
    if not all(isinstance(p, str) for p in no_decay):
        raise bad_type("no_decay", no_decay, "a tuple of name substrings", "Example: no_decay=('bias', 'norm').")
    lr_scale = dict(lr_scale or {})
    if lr_scale and lr is None:
        raise bad_value("lr", lr, "the base learning rate when lr_scale is given",
                        "Pass lr=<the optimizer's learning rate>, e.g. param_groups(net, lr=1e-3, lr_scale={...}).")
    if lr is not None:
        lr = check_float("lr", lr, low=0.0)
    for pattern, scale in lr_scale.items():
        if not isinstance(pattern, str):
            raise bad_type("lr_scale", pattern, "name patterns (str) as keys", "Example: lr_scale={'head.*': 10.0}.")
        check_float(f"lr_scale[{pattern!r}]", scale, low=0.0, low_open=True)
    params = net.trainable_params()
    names = [p.name for p in params]
    for pattern in lr_scale:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise bad_value("lr_scale", pattern, f"a pattern matching some parameter, e.g. one of {names[:4]}",
                            "Check the pattern against [p.name for p in net.trainable_params()].")
    owners = _owners(net)
    groups: dict = {}
    for p in params:
        scale = next((s for pat, s in lr_scale.items() if fnmatch.fnmatchcase(p.name, pat)), 1.0)
        wd = 0.0 if _no_decay(p.name, owners.get(p.name), no_decay) else weight_decay
        groups.setdefault((wd, scale), []).append(p)
    out = []
    for (wd, scale), ps in groups.items():
        group = {"params": ps, "weight_decay": wd}
        if lr is not None:
            group["lr"] = lr * scale
        out.append(group)
    if order_params:
        out.append({"order_params": params})
    return out


def lr_parameters(optimizer) -> list:
    """The LR Parameter of each group of `optimizer` (one when it has no groups)."""
    if hasattr(optimizer, "lrs"):  # mindspore.experimental.optim
        return list(optimizer.lrs)
    if getattr(optimizer, "dynamic_lr", False):
        raise bad_value("optimizer learning_rate", optimizer.learning_rate,
                        "a float (mindstep's lr_schedule sets it every update)",
                        "Build the optimizer with a float learning rate and pass the schedule as "
                        "TrainStep(..., lr_schedule=...).")
    if getattr(optimizer, "is_group_lr", False):
        return list(optimizer.learning_rate)
    return [optimizer.learning_rate]


def lr_scales(optimizer, lr_params) -> list:
    """Each group's LR relative to the optimizer's default LR (1.0 for every group without its own)."""
    default = getattr(optimizer, "defaults", {}).get("lr") if hasattr(optimizer, "lrs") else \
        getattr(optimizer, "init_learning_rate", None)
    try:
        default = float(default)
    except (TypeError, ValueError):
        return [1.0] * len(lr_params)
    if default <= 0:
        return [1.0] * len(lr_params)
    return [float(p.asnumpy()) / default for p in lr_params]


def labelled_groups(optimizer) -> list:
    """[(label, [param names])] for the optimizer's parameter groups (`("all", ...)` when ungrouped).

    `mindspore.experimental.optim` optimizers list their groups; an `nn.Optimizer` built from group
    dicts keeps one LR Parameter and weight decay per parameter (`group_lr`, `group_weight_decay`),
    shared within a group, so parameters are grouped by those, in order of first appearance."""
    groups = getattr(optimizer, "param_groups", None)  # mindspore.experimental.optim
    if groups:
        return [(f"group{i}", [p.name for p in g["params"]]) for i, g in enumerate(groups)]
    params = list(optimizer.parameters)
    if not getattr(optimizer, "is_group", False):
        return [("all", [p.name for p in params])]
    lrs = list(getattr(optimizer, "group_lr", None) or [None] * len(params))
    wds = list(getattr(optimizer, "group_weight_decay", None) or [None] * len(params))
    keyed: dict = {}
    for p, lr, wd in zip(params, lrs, wds):
        keyed.setdefault((id(lr), repr(wd)), []).append(p.name)
    return [(f"group{i}", names) for i, names in enumerate(keyed.values())]
