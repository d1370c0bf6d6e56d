"""`nn.GELU` as a few elementwise kernels, with a backward that recomputes from the input.

Why: MindSpore 2.10's CPU `GeLU` and `GeLUGrad` kernels run near 0.1 G elements/s, a third of the
bench BERT's step on some CPUs (docs/design/measurements.md). The same function written as
elementwise kernels MindSpore runs fast:

- `approximate=True` (MindSpore's default, the tanh form): `0.5 x (1 + tanh(z)) = x * sigmoid(2 z)`,
  `z = sqrt(2/pi) (x + 0.044715 x^3)`; the two sides are the same function, the sigmoid side is the
  cheaper one (the tanh side differed from native by 2e-3 of the gradient's scale here, the sigmoid
  side by 2e-6);
- `approximate=False` (the erf form): `0.5 x (1 + erf(x / sqrt 2))`.

Each is a Cell with its own `bprop`, which recomputes the derivative from `x` alone (as `GeLUGrad`
does), so a training step keeps the input only, like the native layer. `decide`'s measurement
chooses per shape. A float16 input (mixed precision) is computed in float32 inside the layer and
the result cast back (float16's `x^3` would overflow above |x| = 40, its `x^2` above 256); it is
also nearer the float64 result than native's. bfloat16 stays native.
"""
from __future__ import annotations

from mindspore import dtype as mstype
from mindspore import nn, ops
from mindspore.ops.operations._grad_ops import SigmoidGrad

from .._errors import bad_value

FORMS = ("composed",)
FORMULATION = "gelu-3"  # bumped whenever the composed form changes (see `decide.FORMULATION`)

_C2 = 2.0 * 0.7978845608028654  # 2 sqrt(2/pi)
_A = 0.044715
_C2A = _C2 * _A
_RSQRT2 = 0.7071067811865476
_RSQRT2PI = 0.3989422804014327

_sigmoid_grad = SigmoidGrad()  # (s, dy) -> dy * s * (1 - s), one kernel


class _TanhGelu(nn.Cell):
    """x * sigmoid(u), u = 2 sqrt(2/pi) (x + 0.044715 x^3), and its derivative recomputed from x; both in
    float32 whatever the input's float type, the result in the input's. Written with as few kernels as
    the function allows (constants folded, `t = c x^2` shared, `s (1 - s) v` as one `SigmoidGrad`): each
    is a pass over the whole activation (docs/design/measurements.md)."""

    def construct(self, x):
        x32 = ops.cast(x, mstype.float32)
        u = x32 * (_C2A * (x32 * x32) + _C2)
        return ops.cast(x32 * ops.sigmoid(u), x.dtype)

    def bprop(self, x, out, dout):
        x32 = ops.cast(x, mstype.float32)
        t = _C2A * (x32 * x32)
        s = ops.sigmoid(x32 * (t + _C2))
        # d/dx x s(u) = s + x u' s (1 - s),  x u' = x (2 sqrt(2/pi) + 3 t)
        w = _sigmoid_grad(s, x32 * (3.0 * t + _C2))
        return (ops.cast(ops.cast(dout, mstype.float32) * (s + w), x.dtype),)


class _ErfGelu(nn.Cell):
    """0.5 x (1 + erf(x / sqrt 2)), and its derivative Phi(x) + x phi(x) recomputed from x; in
    float32 like `_TanhGelu`."""

    def construct(self, x):
        x32 = ops.cast(x, mstype.float32)
        return ops.cast((0.5 * x32) * (1.0 + ops.erf(x32 * _RSQRT2)), x.dtype)

    def bprop(self, x, out, dout):
        x32 = ops.cast(x, mstype.float32)
        cdf = 0.5 * (1.0 + ops.erf(x32 * _RSQRT2))
        pdf = _RSQRT2PI * ops.exp(-0.5 * x32 * x32)
        return (ops.cast(ops.cast(dout, mstype.float32) * (cdf + x32 * pdf), x.dtype),)


class ComposedGELU(nn.Cell):
    """An `nn.GELU` (either `approximate`) as elementwise kernels with a recomputing backward; the same
    function within float tolerance. Has no parameters (the layer it replaces has none)."""

    def __init__(self, gelu: nn.GELU, form: str = "composed"):
        super().__init__()
        if form not in FORMS:
            raise bad_value("form", form, f"one of {FORMS}", "Omit `form`: the layer has one composed form.")
        self.approximate = gelu.approximate
        self.form = form
        self.fn = _TanhGelu() if gelu.approximate == "tanh" else _ErfGelu()

    def construct(self, x):
        return self.fn(x)


def matches(cell) -> bool:
    """The exact `nn.GELU` class: a subclass may compute something else in its `construct`."""
    return type(cell) is nn.GELU


def supported(gelu: nn.GELU, shape: tuple, dtype) -> tuple[bool, str]:
    import mindspore as ms

    if gelu.approximate not in ("tanh", "none"):
        return False, f"approximate={gelu.approximate!r} has no composed form"
    if dtype not in (ms.float32, ms.float16):
        return False, f"{dtype} input: the composed GeLU is built for float32 and float16"
    return True, ""


def config(gelu: nn.GELU) -> str:
    return f"gelu {gelu.approximate}"


def build(gelu: nn.GELU, form: str) -> nn.Cell:
    return ComposedGELU(gelu, form)


def extra_mb(shape: tuple) -> float:
    """Extra memory (MB, fp32) the composed form may add to a step, as an upper bound: the backward's
    temporaries (x^2, the sigmoid or cdf, their product) alive at once, three arrays of the input's
    size; the forward keeps nothing beyond the input, as the native layer does."""
    n = 1
    for d in shape:
        n *= int(d)
    return 4.0 * 3 * n / 2**20
