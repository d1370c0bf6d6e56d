"""Precision policies: what dtype parameters, computation and outputs use.

A `Precision` is a small frozen value (after jmp's `Policy`) with a short string form that parses
and prints back identically::

    >>> Precision.parse("p=f32,c=f16,o=f32")
    Precision(param='f32', compute='f16', output='f32')
    >>> str(Precision.parse("c=f16"))           # missing fields cascade: output follows compute
    'p=f32,c=f16,o=f16'

Named levels are aliases onto a policy plus which Cells run in the compute dtype:

======  =======================  ======================================================  ============
level   policy                   cells cast to the compute dtype (fp16)                   loss scale
======  =======================  ======================================================  ============
``O0``  ``p=f32,c=f32,o=f32``    none                                                     none
``O1``  ``p=f32,c=f16,o=f32``    only MindSpore's AMP white-list Cells (Conv*, Dense,     none
                                 LSTMCell/RNNCell/GRUCell); everything else fp32
``O2``  ``p=f32,c=f16,o=f32``    every Cell except MindSpore's AMP black-list             dynamic
                                 (BatchNorm1d/2d/3d, LayerNorm) and `keep_fp32`
``O3``  ``p=f32,c=f16,o=f32``    every Cell (BatchNorm too) except `keep_fp32`             dynamic
======  =======================  ======================================================  ============

How it is applied (`apply`): in place, with `Cell.to_float`, on the networks the step trains, so
the user's `forward` (which closes over the network object) runs the cast network. `to_float`
casts only floating inputs at each Cell's entry: integer labels, masks and token ids are never
cast. Parameters (the master weights) stay float32 at every level; the optimizer updates fp32.
Loss Cells that the forward closes over (they own no trainable parameters) get `to_float` of the
*output* dtype, so the loss is computed in float32. MindSpore's own O1 inserts casts for single
operators via its rewrite pass, which returns a *new* network object the forward would not see;
mindstep's O1 is Cell-level, which is why we list exactly what it casts.

On CPU, fp16 kernels run but are 2-3x slower than fp32 (MindSpore 2.10), and bf16 has no CPU kernels:
a bf16 policy on CPU is refused before compiling.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import mindspore as ms
from mindspore import nn

from ._errors import bad_type, bad_value

DTYPES = {"f32": ms.float32, "f16": ms.float16, "bf16": ms.bfloat16}
KEYS = {"p": "param", "c": "compute", "o": "output"}
WHITE_LIST = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Conv1dTranspose, nn.Conv2dTranspose, nn.Conv3dTranspose,
              nn.Dense, nn.LSTMCell, nn.RNNCell, nn.GRUCell)
BLACK_LIST = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm)
LEVELS = ("O0", "O1", "O2", "O3")
#: set on each network `apply` converts: a later step on the same network knows the `to_float` flags
#: are its own, not a conversion of the user's (`mindstep._porting.check_converted`)
MARK = "_mindstep_precision"


def _check_dtype(field: str, value) -> str:
    if value not in DTYPES:
        raise bad_value(f"Precision.{field}", value, f"one of {sorted(DTYPES)}",
                        "Write dtypes as f32, f16 or bf16, e.g. Precision.parse('p=f32,c=f16,o=f32').")
    return value


@dataclass(frozen=True)
class Precision:
    """A precision policy: dtypes of parameters, computation and outputs ('f32', 'f16', 'bf16').

    Args:
        param: dtype of the master weights (mindstep keeps 'f32').
        compute: dtype the cast Cells compute in; defaults to `param`.
        output: dtype of the network output handed to the loss; defaults to `compute`.
    """

    param: str = "f32"
    compute: str | None = None
    output: str | None = None

    def __post_init__(self):
        _check_dtype("param", self.param)
        compute = _check_dtype("compute", self.compute if self.compute is not None else self.param)
        output = _check_dtype("output", self.output if self.output is not None else compute)
        object.__setattr__(self, "compute", compute)
        object.__setattr__(self, "output", output)

    @classmethod
    def parse(cls, text: str) -> "Precision":
        """Read the short form `"p=f32,c=f16,o=f32"` (any subset of p, c, o; missing ones cascade)."""
        if not isinstance(text, str):
            raise bad_type("Precision.parse text", text, "a string such as 'p=f32,c=f16,o=f32'",
                           "Pass the policy as text.")
        fields = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in KEYS:
                raise bad_value("Precision.parse text", text, f"comma-separated key=dtype pairs with keys {sorted(KEYS)}",
                                "Example: 'p=f32,c=f16,o=f32'.")
            if KEYS[key] in fields:
                raise bad_value("Precision.parse text", text, f"each key at most once (got {key!r} twice)",
                                "Example: 'p=f32,c=f16,o=f32'.")
            fields[KEYS[key]] = value.strip()
        if not fields:
            raise bad_value("Precision.parse text", text, "at least one key=dtype pair", "Example: 'p=f32,c=f16,o=f32'.")
        return cls(**fields)

    def __str__(self) -> str:
        return f"p={self.param},c={self.compute},o={self.output}"

    @property
    def mixed(self) -> bool:
        return self.compute != "f32"


@dataclass(frozen=True)
class Plan:
    """What `apply` does: the policy, which Cells get the compute dtype, and the loss-scale default."""

    level: str
    policy: Precision
    scope: str  # "none" | "white-list" | "all"
    keep_fp32: tuple
    dynamic_loss_scale: bool


def plan(precision, keep_fp32=()) -> Plan:
    """Validate `precision=` and `keep_fp32=` (on the host, before compiling) and resolve a level."""
    keep = check_keep(keep_fp32)
    if isinstance(precision, str) and precision in LEVELS:
        fp16 = Precision("f32", "f16", "f32")
        return {
            "O0": Plan("O0", Precision("f32"), "none", keep, False),
            "O1": Plan("O1", fp16, "white-list", keep, False),
            "O2": Plan("O2", fp16, "all", BLACK_LIST + keep, True),
            "O3": Plan("O3", fp16, "all", keep, True),
        }[precision]
    if isinstance(precision, str):
        try:
            precision = Precision.parse(precision)
        except ValueError:
            raise bad_value("precision", precision, f"one of {LEVELS}, a policy string like 'p=f32,c=f16,o=f32', "
                            "or a mindstep.Precision", "For fp16 mixed precision use precision='O2'.") from None
    if not isinstance(precision, Precision):
        raise bad_type("precision", precision, f"one of {LEVELS}, a policy string, or a mindstep.Precision",
                       "For fp16 mixed precision use precision='O2'.")
    if precision.param != "f32":
        raise bad_value("precision", str(precision), "a policy with p=f32 (master weights stay float32)",
                        "Keep p=f32 and lower only the compute dtype, e.g. 'p=f32,c=f16,o=f32'.")
    return Plan("custom", precision, "all" if precision.mixed else "none", keep,
                precision.mixed and precision.compute == "f16")


def check_keep(keep_fp32) -> tuple:
    if isinstance(keep_fp32, (str, type)):
        keep_fp32 = (keep_fp32,)
    try:
        items = tuple(keep_fp32)
    except TypeError:
        raise bad_type("keep_fp32", keep_fp32, "a list of nn.Cell types and/or name patterns like 'head.*'",
                       "Example: keep_fp32=[nn.BatchNorm2d, 'head.*'].") from None
    for item in items:
        if not (isinstance(item, str) or (isinstance(item, type) and issubclass(item, nn.Cell))):
            raise bad_type("keep_fp32", item, "an nn.Cell subclass or a name pattern string",
                           "Example: keep_fp32=[nn.BatchNorm2d, 'head.*'].")
    return items


def check_device(p: Plan, device: str) -> None:
    """bf16 has no CPU kernels in MindSpore 2.10: refuse it here instead of a kernel-select traceback."""
    if "bf16" in (p.policy.compute, p.policy.output) and device == "CPU":
        raise bad_value("precision", str(p.policy), "a dtype with kernels on this device (CPU: f32 or f16)",
                        "bf16 kernels exist on Ascend/GPU only; on CPU use 'p=f32,c=f16,o=f32' or keep f32.")


def _kept(name: str, cell: nn.Cell, keep: tuple) -> bool:
    for item in keep:
        if isinstance(item, str):
            if fnmatch.fnmatchcase(name, item) or fnmatch.fnmatchcase(name, item.rstrip(".*")):
                return True
        elif isinstance(cell, item):
            return True
    return False


def apply(p: Plan, nets, loss_cells=()) -> dict:
    """Cast `nets` in place per the plan; return `{cell name: dtype}` for the Cells it changed."""
    compute, output = DTYPES[p.policy.compute], DTYPES[p.policy.output]
    changed = {}
    if p.scope != "none":
        for net in nets:
            setattr(net, MARK, str(p.policy))
            if p.scope == "all":
                net.to_float(compute)
                changed[type(net).__name__] = p.policy.compute
            for name, cell in net.cells_and_names():
                if not name:
                    continue
                if _kept(name, cell, p.keep_fp32):
                    cell.to_float(ms.float32)
                    changed[name] = "f32"
                elif p.scope == "white-list" and isinstance(cell, WHITE_LIST):
                    cell.to_float(compute)
                    changed[name] = p.policy.compute
    if p.policy.mixed:
        for cell in loss_cells:
            cell.to_float(output)
    return changed
