"""`nn.GELU` as a few elementwise kernels, with a backward that recomputes from the input.

Why: MindSpore 2.10's CPU `GeLU` and `GeLUGrad` kernels run near 0.1 G elements/s; on this project's
AMD EPYC they were 36 % of the bench BERT's `jit` step (`mindstep bench --model bert --profile`: GeLUGrad
18.9 %, GeLU 17.2 %). The same function written as elementwise kernels MindSpore runs fast:

- `approximate=True` (MindSpore's default, the tanh form): `0.5 x (1 + tanh(z)) = x * sigmoid(2 z)`,
  `z = sqrt(2/pi) (x + 0.044715 x^3)`; the two sides are the same function, the sigmoid side is the
  cheaper one (the tanh side differed from native by 2e-3 of the gradient's scale here, the sigmoid
  side by 2e-6);
- `approximate=False` (the erf form): `0.5 x (1 + erf(x / sqrt 2))`.

Each is a Cell with its own `bprop`, which recomputes the derivative from `x` alone (as `GeLUGrad`
does), so a training step keeps the input only, like the native layer. Forward + backward on one
(16, 64, 512) float32 input in GRAPH_MODE, medians of 9 calls on the AMD EPYC (AVX2, AVX-512): tanh
form native 12.7 ms, composed 3.5 ms; erf form native 11.7 ms, composed 9.8 ms. `decide`'s measurement
chooses per shape; float16/bfloat16 inputs stay native (the derivative's `x^2` overflows float16 above
|x| = 256, where the native kernel saturates).
"""
from __future__ import annotations

from mindspore import nn, ops

FORMS = ("composed",)

_C2 = 2.0 * 0.7978845608028654  # 2 sqrt(2/pi)
_A = 0.044715
_RSQRT2 = 0.7071067811865476
_RSQRT2PI = 0.3989422804014327


class _TanhGelu(nn.Cell):
    """x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)), and its derivative recomputed from x."""

    def construct(self, x):
        return x * ops.sigmoid(_C2 * (x + _A * x * x * x))

    def bprop(self, x, out, dout):
        x2 = x * x
        s = ops.sigmoid(_C2 * (x + _A * x2 * x))
        # d/dx x s(u) = s + x s (1 - s) u',  u' = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        return (dout * (s + x * (s - s * s) * (_C2 + (3.0 * _A * _C2) * x2)),)


class _ErfGelu(nn.Cell):
    """0.5 x (1 + erf(x / sqrt 2)), and its derivative Phi(x) + x phi(x) recomputed from x."""

    def construct(self, x):
        return (0.5 * x) * (1.0 + ops.erf(x * _RSQRT2))

    def bprop(self, x, out, dout):
        cdf = 0.5 * (1.0 + ops.erf(x * _RSQRT2))
        pdf = _RSQRT2PI * ops.exp(-0.5 * x * x)
        return (dout * (cdf + x * pdf),)


class ComposedGELU(nn.Cell):
    """An `nn.GELU` (either `approximate`) as elementwise kernels with a recomputing backward; the same
    function within float tolerance. Has no parameters (the layer it replaces has none)."""

    def __init__(self, gelu: nn.GELU, form: str = "composed"):
        super().__init__()
        if form not in FORMS:
            raise ValueError(f"form={form!r}: expected one of {FORMS}")
        self.approximate = gelu.approximate
        self.form = form
        self.fn = _TanhGelu() if gelu.approximate == "tanh" else _ErfGelu()

    def construct(self, x):
        return self.fn(x)


def is_gelu(cell) -> bool:
    """The exact `nn.GELU` class: a subclass may compute something else in its `construct`."""
    return type(cell) is nn.GELU


def supported(gelu: nn.GELU, dtype) -> tuple[bool, str]:
    import mindspore as ms

    if gelu.approximate not in ("tanh", "none"):
        return False, f"approximate={gelu.approximate!r} has no composed form"
    if dtype != ms.float32:
        return False, f"{dtype} input: the composed GeLU is built for float32 (its derivative's x^2 overflows float16)"
    return True, ""


def config(gelu: nn.GELU) -> str:
    return f"gelu {gelu.approximate}"


def extra_mb(shape: tuple) -> float:
    """Extra memory (MB, fp32) the composed form may add to a step, as an upper bound: the backward's
    temporaries (x^2, the sigmoid or cdf, their product) alive at once, three arrays of the input's
    size; the forward keeps nothing beyond the input, as the native layer does."""
    n = 1
    for d in shape:
        n *= int(d)
    return 4.0 * 3 * n / 2**20
