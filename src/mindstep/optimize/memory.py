"""How much memory the composed conv forms may add to a training step: per-layer upper bounds read
off the forms' geometry (`extra_mb`), the compile-time memory of a configuration (`config_mb`), and
the measured fraction of the bounds that a whole step keeps (`RETAINED`). The pass's budget
(`pass_.apply_budget`) and `mindstep bench`'s calibration rest on these."""
from __future__ import annotations

from mindspore import nn

from .conv import Form, geometry, matmul_only, pointwise


def extra_mb(conv: nn.Conv2d, shape: tuple, form: str = "batched", input_grad: bool = True) -> float:
    """Extra memory (MB, fp32) a composed form may add to a training step, as an upper bound.

    The sum of the layer's temporaries, read off `_ConvFn`'s geometry: the forward's columns and
    GEMM operands, the weight-gradient GEMM's operands (with the recomputed columns of x where it does
    not take the input gradient's columns of dY, see `_ConvFn.dw_from_dy`), the stride-dilated
    and padded output gradient, the picked (flipped, transposed) kernel, and the input gradient's
    columns and GEMM outputs. Not all of them are alive at once (`_ConvFn.bprop` orders its work so
    that a layer's backward temporaries are freed before the next layer's backward), so the sum is
    what a layer may cost at most; how much a step really keeps is measured (tests/test_optimize.py
    checks the bound; docs/design/measurements.md), and a fraction over whole networks (`RETAINED`).
    Layers that become a plain matmul
    (`conv.matmul_only`; MindSpore's own autodiff) add only their operands' copies: the broadcast
    kernel, or the batch-folded input and output gradient; ~0 on a 1x1 input.

    `input_grad=False` (the layer's input is the batch, e.g. a stem): the input gradient's
    temporaries are left out, since MindSpore drops the backward's unused input-gradient branch. They
    dominate a strided stem's bound: ResNet-18's 3->64 7x7 stride-2 stem at batch 16, 32 px, counted
    211 of its 218 MB (batched; one-gemm 406 of 419) for a gradient that is never computed, and so
    took over half of `optimize=True`'s default budget and kept the stem, 35x faster composed, native
    (`tests/test_optimize.py` measures a stem against this bound).
    """
    n, c, h, w = shape
    # A form with MindSpore's own weight-gradient kernel (NATIVE_DW) is counted as its base form: it
    # keeps no recomputed columns, but the kernel's own workspace is not known from the shapes, and
    # whole steps measured both ways differed little (docs/design/measurements.md).
    parsed = Form.parse(form)
    if parsed.native == "fwd-dx":
        return _weight_gradient_mb(conv, shape, form)
    parsed = parsed.base
    form = str(parsed)
    if conv.group != 1:
        return _grouped_extra_mb(conv, shape, input_grad)
    if pointwise(conv, (h, w)):
        k, l = conv.out_channels, h * w
        if not parsed.one_gemm:
            return 4.0 * 2 * n * k * c / 2**20  # the kernel broadcast over the batch, per-sample dW products
        # x and dY folded, y and dX unfolded
        return 0.0 if l == 1 else 4.0 * n * l * (c + 2 * k + (c if input_grad else 0)) / 2**20
    if matmul_only(conv, (h, w)):
        return 0.0
    fn = geometry(conv, (h, w), form, input_grad)
    k, kk = conv.out_channels, fn.kh * fn.kw
    l, ldx = fn.ho * fn.wo, fn.dxh * fn.dxw
    one = parsed.one_gemm
    # forward: the columns (one-gemm: and their batch-folded copy, and the unfolded output; batched:
    # the kernel broadcast over the batch)
    total = n * c * kk * l + (c * kk * n * l + 2 * n * k * l if one else n * k * c * kk + n * k * l)
    total += _dw_path_elements(fn, n, c, k, c, kk, l, ldx, one)  # backward: the weight gradient
    if not input_grad:
        return 4.0 * total / 2**20
    if fn.by_phase:  # dX by stride phases: per phase a padded dY, its columns and a GEMM; then interleave
        m = fn.mh * fn.mw
        for th, tw in fn.phase_taps:
            taps = th * tw
            if taps == 0:
                total += n * c * m
                continue
            total += n * k * (fn.mh + th - 1) * (fn.mw + tw - 1)
            total += 3 * k * c * taps + n * k * taps * m * (2 if one else 1)
            total += 2 * n * c * m if one else n * c * k * taps + n * c * m
        total += 2 * n * c * m * fn.sh * fn.sw + n * c * h * w  # two stacks, the crop
        return 4.0 * total / 2**20
    if fn.strided:
        total += n * k * fn.ho * fn.sh * fn.wo * fn.sw + n * k * fn.zh * fn.zw  # zero-inserted dY, cropped
    if fn.z_pre_needed:
        total += n * k * fn.zp_hw[0] * fn.zp_hw[1]            # padded dY
    total += k * kk * kk + k * kk * c                         # tap map broadcast over K, picked kernel
    total += n * k * kk * ldx * (2 if one else 1)             # dX columns (one-gemm: and their transpose)
    total += 2 * n * c * ldx if one else n * c * k * kk + n * c * ldx  # dX GEMM (batched: broadcast kernel)
    if fn.cropped:
        total += n * c * h * w
    return 4.0 * total / 2**20


def _dw_elements(n: int, c: int, k: int, cg: int, kk: int, l: int, one: bool) -> int:
    """Elements of the weight gradient's GEMM in the backward of every `_ConvFn` form: the recomputed
    columns of x, the operands (one-gemm: dY and the columns batch-folded; batched: the per-sample
    (per-group) products) and dW itself (C/G = `cg` input channels per group)."""
    return n * c * kk * l + ((k * n * l + c * kk * n * l) if one else n * k * cg * kk) + k * cg * kk


def _dw_path_elements(fn, n, c, k, cg, kk, l, ldx, one: bool) -> int:
    """The weight gradient's temporaries on the path `fn` takes, with x explicitly padded where the
    layer pads it (the forward's copy, and the backward's when it recomputes the columns of x).
    From dY's columns (`fn.dw_from_dy`; the columns themselves are the input gradient's, counted with
    it): the GEMM's operand beside them (one-gemm: x batch-folded; batched: the per-sample (per-group)
    products), the (K*taps, C/G) result, the tap map over K and dW in kernel order; otherwise
    `_dw_elements`."""
    if fn.dw_from_dy:
        total = (c * n * ldx if one else n * k * kk * cg) + 2 * k * kk * cg + k * kk * kk
    else:
        total = _dw_elements(n, c, k, cg, kk, l, one)
    if fn.pre_needed:
        total += (1 if fn.dw_from_dy else 2) * n * c * fn.xp_hw[0] * fn.xp_hw[1]
    return total


def _weight_gradient_mb(conv: nn.Conv2d, shape: tuple, form: str) -> float:
    """`extra_mb` for a NATIVE_FWD_DX form: MindSpore's own forward and input gradient add nothing over
    the native layer; the weight gradient's GEMM adds the recomputed columns (after explicit padding),
    its operands (one-gemm: both batch-folded; batched: the per-sample products; grouped: per sample
    and group) and the gradient itself."""
    n, c, h, w = shape
    fn = geometry(conv, (h, w), form)
    k, cg, kk, l = conv.out_channels, c // conv.group, fn.kh * fn.kw, fn.ho * fn.wo
    total = _dw_elements(n, c, k, cg, kk, l, Form.parse(form).one_gemm)
    if fn.pre_needed:
        total += n * c * fn.xp_hw[0] * fn.xp_hw[1]            # explicitly padded x, backward only
    return 4.0 * total / 2**20


def _grouped_extra_mb(conv: nn.Conv2d, shape: tuple, input_grad: bool) -> float:
    """`extra_mb` for a grouped or depthwise layer (`conv._GroupedFn`): its temporaries, summed, as an
    upper bound (K output channels, C input channels, C/G per group; without the input gradient's
    where `input_grad` is False)."""
    n, c, h, w = shape
    fn = geometry(conv, (h, w), "batched", input_grad)
    k, cg = conv.out_channels, c // conv.group
    kk, l, ldx = fn.kh * fn.kw, fn.ho * fn.wo, fn.dxh * fn.dxw  # the input gradient uses all kk taps
    total = n * c * kk * l + n * k * cg * kk + n * k * l     # forward: columns, broadcast kernel, output
    total += _dw_path_elements(fn, n, c, k, cg, kk, l, ldx, one=False)  # backward: the weight gradient
    if not input_grad:
        return 4.0 * total / 2**20
    if fn.strided:
        total += n * k * fn.ho * fn.sh * fn.wo * fn.sw + n * k * fn.zh * fn.zw  # zero-inserted dY, cropped
    if fn.z_pre_needed:
        total += n * k * fn.zp_hw[0] * fn.zp_hw[1]            # padded dY
    total += k * kk * kk + k * kk * cg + n * k * kk * cg      # tap map over K, picked kernel, over the batch
    total += n * k * kk * ldx + n * c * ldx                   # dX columns and GEMM output
    if fn.cropped:
        total += n * c * h * w
    return 4.0 * total / 2**20


# The share of `extra_mb`'s upper bound a whole step keeps (measured 0-0.19); the bench calibrates by
# measuring instead.
# Measurements: docs/design/composed-pass.md#retained
RETAINED = 0.25

# Compile-time memory of one distinct composed configuration (each `_ConvFn` instance is compiled into
# graphs of its own; layers sharing a configuration share them). Measured on CPU with 8 stride-2
# layers of one configuration under ms.grad: native 35 MB, composed 49 MB, composed with phases 72 MB.
CONFIG_MB = 15.0
PHASE_MB = 6.0  # per stride phase cell


def config_mb(conv: nn.Conv2d, form: str, input_hw) -> float:
    """Compile-time memory of the first layer of a configuration in `form` at this input size (see
    CONFIG_MB); layers that become a plain matmul compile no `_ConvFn`."""
    if form == "native" or matmul_only(conv, input_hw):
        return 0.0
    phases = conv.stride[0] * conv.stride[1] if Form.parse(form).phases else 0
    return CONFIG_MB + PHASE_MB * phases


# A lower bound of what a native step adds to the process's memory, for `optimize=True`'s budget when
# nothing measured it.
# Measurements: docs/design/composed-pass.md#native_floor_mb
NATIVE_FLOOR_MB = 60.0
NATIVE_CALL_MB = 2.0


def native_growth_mb(calls: int = 0, activation_mb: float = 0.0, param_mb: float = 0.0) -> float:
    """A lower bound (MB) of the memory a native training step adds (see NATIVE_FLOOR_MB), from the
    shape probe's counts (`pass_.record_inputs(stats=...)`): leaf-layer calls, their outputs' size,
    the trainable parameters' size."""
    return NATIVE_FLOOR_MB + NATIVE_CALL_MB * calls + activation_mb + param_mb
