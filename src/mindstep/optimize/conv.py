"""`nn.Conv2d` as im2col + GEMM, with a backward pass written as GEMMs too.

Why: MindSpore 2.10's CPU `Conv2D` and `Conv2DBackpropInput` kernels run near 1 GFLOP/s while a GEMM
runs near 150 GFLOP/s on the same machine. The composed form:

- forward: `y = W(K, C*k*k) @ unfold(pad(x))`, one (batched) GEMM;
- weight gradient: where the layer's input gradient is taken (every layer but one whose input is the
  batch), from the columns the input gradient unfolds from dY anyway: `dW~ = unfold(dY~)(K*k*k, N*L)
  @ x(C, N*L)^T`, one GEMM, its taps put back in place (`_ConvFn._dx_dw_from_dy`); otherwise, and in the
  "+phases" forms, `dW = dY(K, N*L) @ unfold(pad(x))^T` with the columns of x recomputed in the
  backward instead of being kept from the forward;
- input gradient: the transposed convolution written as a *forward* im2col + GEMM: dY is dilated by
  the stride, padded so that the correlation yields exactly the input positions, and correlated with
  the spatially flipped, channel-transposed kernel; or, in the "+phases" forms of strided layers,
  one stride-1 correlation per stride phase with that phase's sub-kernel. This avoids `col2im`,
  whose CPU kernel is what made naive swaps slow.

Padding is explicit (`Pad` primitives) for every pad mode, including TF-style asymmetric "same"
padding with stride > 1. Grouped convolutions (RegNet's, ResNeXt's) and depthwise ones (MobileNet's,
`group == channels`) have their GEMMs batched over the groups (`_GroupedFn`: per sample and group,
the group's (K/G, C/G*k*k) kernel times its columns).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.ops.operations._grad_ops import Conv2DBackpropFilter
from mindspore.ops.operations.array_ops import Im2Col


# "+phases": strided, undilated layers compute the input gradient by stride phases (see _PhaseGrad)
FORMS = ("batched", "one-gemm", "batched+phases", "one-gemm+phases")
# A form + NATIVE_DW takes the weight gradient from MindSpore's own kernel, fast on some CPUs whose
# native forward is slow.
# Measurements: docs/design/composed-pass.md#native_dw
NATIVE_DW = "+native-dw"
# A form + NATIVE_FWD_DX keeps MindSpore's forward and input gradient and takes only the weight
# gradient by GEMM.
# Measurements: docs/design/composed-pass.md#native_fwd_dx-forms
NATIVE_FWD_DX = "+native-fwd-dx"
ALL_FORMS = FORMS + tuple(f + NATIVE_DW for f in FORMS) + tuple(f + NATIVE_FWD_DX for f in FORMS[:2])
_NO_PHASES = f"the input gradient is native in the '{NATIVE_FWD_DX}' forms: they have no '+phases'"


@dataclass(frozen=True)
class Form:
    """A composed conv form as a value, parsed once from its name (`Form.parse("one-gemm+phases")`),
    so a combination no layer can run cannot be written: `gemm` is ``"batched"`` (the kernel
    broadcast over the batch) or ``"one-gemm"`` (one GEMM over the folded batch); `phases`: the input
    gradient by stride phases; `native`: None, ``"dw"`` (MindSpore's weight-gradient kernel,
    `NATIVE_DW`) or ``"fwd-dx"`` (MindSpore's forward and input gradient, `NATIVE_FWD_DX`, which
    leaves no input gradient for phases to change). `str(form)` is its name."""

    gemm: str
    phases: bool = False
    native: str | None = None

    GEMMS = ("batched", "one-gemm")
    NATIVE = {None: "", "dw": NATIVE_DW, "fwd-dx": NATIVE_FWD_DX}

    def __post_init__(self):
        if self.gemm not in self.GEMMS or self.native not in self.NATIVE:
            raise ValueError(f"no such conv form: gemm={self.gemm!r}, native={self.native!r}")
        if self.phases and self.native == "fwd-dx":
            raise ValueError(_NO_PHASES)

    @classmethod
    def parse(cls, name: str) -> "Form":
        """The form named `name`, one of `ALL_FORMS`."""
        if name not in ALL_FORMS:
            raise ValueError(f"no conv form named {name!r}; the forms are {ALL_FORMS}")
        native = "dw" if name.endswith(NATIVE_DW) else "fwd-dx" if name.endswith(NATIVE_FWD_DX) else None
        return cls(gemm=name.split("+")[0], phases="+phases" in name, native=native)

    @property
    def one_gemm(self) -> bool:
        return self.gemm == "one-gemm"

    @property
    def base(self) -> "Form":
        """The same GEMMs without MindSpore's kernels (`native` dropped)."""
        return Form(self.gemm, self.phases)

    def __str__(self) -> str:
        return self.gemm + ("+phases" if self.phases else "") + self.NATIVE[self.native]


_BMM_NT = ops.BatchMatMul(transpose_b=True)
_BMM = ops.BatchMatMul()
_MM = ops.MatMul()
_MM_NT = ops.MatMul(transpose_b=True)
_RESHAPE = ops.Reshape()
_SUM = ops.ReduceSum()
_SLICE = ops.Slice()
_MM_TN = ops.MatMul(transpose_a=True)
_BMM_TN = ops.BatchMatMul(transpose_a=True)
# `_ConvFn.bprop`'s two ordering dependences (see there). Read when a graph is compiled; only the
# memory test turns them off, to measure what they save on the machine it runs on.
_ORDERED_BPROP = True


def forms_for(conv) -> tuple:
    """The composed forms that apply to this layer, weight gradient by GEMM (phases only for strided,
    undilated layers; a grouped one has one, "batched": its per-group GEMMs are batched over samples
    and groups). Each has a variant with the native weight gradient where `dw_forms` says so."""
    if conv.group != 1:
        return FORMS[:1]
    if max(conv.stride) > 1 and conv.dilation == (1, 1):
        return FORMS
    return FORMS[:2]


def dw_forms(conv, input_hw) -> tuple:
    """The per-direction forms (`NATIVE_DW`) of this layer at this input size: one per `forms_for`
    form for a layer that runs a `_ConvFn` (grouped ones included); none for one that becomes a plain
    matmul (`matmul_only`: MindSpore's autodiff already gives its weight gradient as a GEMM)."""
    if matmul_only(conv, input_hw):
        return ()
    return tuple(f + NATIVE_DW for f in forms_for(conv))


def fx_forms(conv, input_hw) -> tuple:
    """The per-direction forms (`NATIVE_FWD_DX`) of this layer at this input size: the native forward
    and input gradient with the weight gradient by one of its GEMMs ("batched", and "one-gemm" for an
    ungrouped layer); none for one that becomes a plain matmul (`matmul_only`)."""
    if matmul_only(conv, input_hw):
        return ()
    return tuple(f + NATIVE_FWD_DX for f in forms_for(conv) if "+" not in f)


def layer_forms(conv, input_hw) -> tuple:
    """Every composed form of this layer at this input size: `forms_for`, `dw_forms` and `fx_forms`."""
    return forms_for(conv) + dw_forms(conv, input_hw) + fx_forms(conv, input_hw)


def same_pads(size: int, k: int, s: int, d: int) -> tuple[int, int]:
    """MindSpore/TF 'same' padding (before, after) along one axis."""
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def conv_pads(conv: nn.Conv2d, h: int, w: int) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) padding that `conv` applies to an h x w input."""
    kh, kw = conv.kernel_size
    sh, sw = conv.stride
    dh, dw = conv.dilation
    if conv.pad_mode == "same":
        return same_pads(h, kh, sh, dh) + same_pads(w, kw, sw, dw)
    if conv.pad_mode == "pad":
        p = conv.padding
        return (p, p, p, p) if isinstance(p, int) else tuple(p)
    return (0, 0, 0, 0)


def _out_len(padded: int, k: int, s: int, d: int) -> int:
    """Output length of a convolution along one axis of an already padded input."""
    return (padded - d * (k - 1) - 1) // s + 1


def out_shape(conv: nn.Conv2d, shape: tuple) -> tuple[int, int, int, int]:
    """The (N, K, Ho, Wo) output shape of `conv` on an input of `shape` (N, C, H, W)."""
    n, _, h, w = shape
    t, b, l, r = conv_pads(conv, h, w)
    (kh, kw), (sh, sw), (dh, dw) = conv.kernel_size, conv.stride, conv.dilation
    return n, conv.out_channels, _out_len(h + t + b, kh, sh, dh), _out_len(w + l + r, kw, sw, dw)


def _pad_op(pads):
    """A `Pad` primitive for (top, bottom, left, right) zero padding of NCHW tensors, or None.

    A primitive instance built on the host, because `ops.pad` (and any branching in helpers called
    from a custom bprop) fails to compile inside a custom bprop in MindSpore 2.10 ("func graph is
    empty"); slice assignment into zeros works but expands to a large graph per call site (measured:
    strided layers, which needed two, cost ~3x the compile-time memory of stride-1 layers).
    """
    t, b, l, r = pads
    if pads == (0, 0, 0, 0):
        return None
    return ops.Pad(((0, 0), (0, 0), (t, b), (l, r)))


def _pair(p):
    return (p, p) if isinstance(p, int) else tuple(p)


def _split_pads(pads):
    """(explicit pads to apply first, padding for unfold): unfold can pad symmetric cases itself.

    Decided on the host: branching on the pads inside graph code called from a custom bprop makes
    MindSpore 2.10 fail ("func graph is empty").
    """
    t, b, l, r = pads
    if t == b and l == r:
        return (0, 0, 0, 0), (t, l)
    return pads, 0


def _fold(x):
    """(n, A, L) -> (A, n*L): the batch moved next to the positions, as split + concat.

    Not a `Transpose`: in MindSpore 2.10 CPU graphs the memory of a Transpose's input and output is
    never reused within the step (measured: a chain of transposes of a 37 MB tensor grows RSS by
    ~2x37 MB per transpose; split + concat runs as fast and the memory is reused). The one-gemm
    form transposes column-sized tensors, so this decides its memory. Primitives created here
    (their output count is the batch size); functional wrappers fail inside a custom bprop.
    """
    n, a, l = x.shape
    return _RESHAPE(ops.Concat(2)(ops.Split(0, n)(x)), (a, n * l))


def _unfold_batch(y, n):
    """(A, n*L) -> (n, A, L), the inverse of `_fold`."""
    a, nl = y.shape
    return ops.Concat(0)(ops.Split(2, n)(_RESHAPE(y, (1, a, nl))))


def _tap_map(kernel, stride=(1, 1), phase=(0, 0)) -> Tensor | None:
    """(taps, kh*kw) one-hot rows: row a*tw + b picks the kernel tap that the input gradient's
    correlation uses at (a, b), i.e. the (stride-phase sub-)kernel flipped along both spatial axes.
    None for a 1x1 kernel (nothing to pick or flip)."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, phase
    if (kh, kw) == (1, 1):
        return None
    th, tw = len(range(ph, kh, sh)), len(range(pw, kw, sw))
    m = np.zeros((th * tw, kh * kw), np.float32)
    for a in range(th):
        for b in range(tw):
            m[a * tw + b, (ph + sh * (th - 1 - a)) * kw + pw + sw * (tw - 1 - b)] = 1.0
    return Tensor(m)


def _input_grad_kernel(w, tap_map):
    """The input gradient's kernel, transposed: (K*taps, C), row k*taps + t holding the flipped
    (sub-)kernel's tap t of output channel k; a GEMM contracts it with transpose_a.

    One batched GEMM with the one-hot `tap_map` picks, flips and lays out the taps, exactly (for
    finite weights). It replaces a `StridedSlice` (the stride-phase sub-kernel), a `ReverseV2` (the
    flip) and a `Transpose` (channels), which MindSpore 2.10's CPU kernels run far slower than their
    size suggests: profiled in a ResNet-50 step (32 px, batch 32), 18.8 ms to slice a 1024x512x1x1
    kernel, 11.8 ms to transpose a 2048x1024 one; ReverseV2 took 30 ms for 512x512x3x3.
    """
    k, c, kh, kw = w.shape
    if tap_map is None:  # a 1x1 kernel: (K, C) is already the layout
        return _RESHAPE(w, (k, c))
    taps = tap_map.shape[0]
    picks = ops.BroadcastTo((k, taps, kh * kw))(ops.cast(tap_map, w.dtype))
    return _RESHAPE(_BMM_NT(picks, _RESHAPE(w, (k, c, kh * kw))), (k * taps, c))


def _taps_to_kernel(dwt, tap_map, w_shape):
    """A weight gradient computed in the input gradient's tap order, (K*taps, Cg) with row k*taps + t
    for the flipped tap t (`_tap_map`), put back in kernel order (w_shape: K, Cg, kh, kw) by a batched
    GEMM with the one-hot tap map (the inverse of `_input_grad_kernel`'s pick)."""
    k, cg = w_shape[0], w_shape[1]
    if tap_map is None:  # a 1x1 kernel: one tap, nothing flipped
        return _RESHAPE(dwt, w_shape)
    taps, kk = tap_map.shape
    picks = ops.BroadcastTo((k, taps, kk))(ops.cast(tap_map, dwt.dtype))
    return _RESHAPE(_BMM_TN(_RESHAPE(dwt, (k, taps, cg)), picks), w_shape)


def _dw_dx_batched(cols, x, wt):
    """The weight gradient in the input gradient's tap order, ([G,] K*taps, C) summed over the samples,
    and the input gradient (n, [G,] C, L), by GEMMs batched over the samples (and the groups: the G
    axis, for a grouped layer's per-group shapes), from the input gradient's columns `cols`
    (n, [G,] K*taps, L), x (n, [G,] C, L) and the picked kernel `wt` ([G,] K*taps, C). The input
    gradient waits for the weight gradient (see `_ConvFn._dx_dw_from_dy`)."""
    dwt = _SUM(_BMM_NT(cols, x), 0)
    if _ORDERED_BPROP:
        cols = ops.depend(cols, dwt)
    return dwt, _BMM_TN(ops.BroadcastTo((cols.shape[0],) + wt.shape)(wt), cols)


def _crop(x, box):
    """x[:, :, top:top+h, left:left+w] for box (top, left, h, w), with the `Slice` primitive:
    MindSpore 2.10's CPU `StridedSlice` (what indexing becomes) copied a 32x128x10x10 tensor in
    5.9 ms, `Slice` in 0.5 ms."""
    top, left, h, w = box
    return _SLICE(x, (0, 0, top, left), (x.shape[0], x.shape[1], h, w))


def _correlate(im2col, xp, w2, ho, wo, one_gemm):
    """Cross-correlation of x with w2 (K, C*kh*kw) as im2col + GEMM; output (N, K, ho, wo).

    `one_gemm=False`: `W @ cols` batched over N (best at large spatial sizes).
    `one_gemm=True`: one GEMM over (C*k*k, N*L) (best at small spatial sizes, where broadcasting W
    across the batch would copy it N times).
    Primitive instances, not `ops.unfold`/tensor methods: every functional wrapper adds validation
    nodes to the graph at each call site, and compile-time memory grows with the graph.
    """
    n = xp.shape[0]
    k = w2.shape[0]
    l = ho * wo
    cols = _RESHAPE(im2col(xp), (n, -1, l))
    if one_gemm:
        y = _MM(w2, _fold(cols))
        return _RESHAPE(_unfold_batch(y, n), (n, k, ho, wo))
    return _RESHAPE(ops.matmul(w2, cols), (n, k, ho, wo))


def _correlate_t(im2col, xp, w2t, ho, wo, one_gemm):
    """`_correlate` with the kernel given transposed, (C*kh*kw, K), and contracted with transpose_a
    (see `_input_grad_kernel`). A function of its own: a flag, a conditional expression or GEMM
    primitives passed as arguments all fail to compile inside a custom bprop in MindSpore 2.10
    ("func graph is empty"; tried)."""
    n = xp.shape[0]
    k = w2t.shape[1]
    l = ho * wo
    cols = _RESHAPE(im2col(xp), (n, -1, l))
    if one_gemm:
        y = _MM_TN(w2t, _fold(cols))
        return _RESHAPE(_unfold_batch(y, n), (n, k, ho, wo))
    return _RESHAPE(_BMM_TN(ops.BroadcastTo((n,) + w2t.shape)(w2t), cols), (n, k, ho, wo))


class _PhaseGrad(nn.Cell):
    """One stride phase of a strided convolution's input gradient (see `_ConvFn`).

    The input positions j = phase + s*m receive only the kernel taps i = phase + s*a, so their
    gradient is a stride-1 correlation of dY with that sub-kernel, flipped and channel-transposed.
    Computing the s*s phases separately needs s*s times fewer columns than correlating a zero-inserted
    dY, and no zero insertion.
    """

    def __init__(self, kernel, phase_h, phase_w, stride, taps_hw, dy_pads, out_hw, one_gemm):
        super().__init__()
        self.mh, self.mw = out_hw
        self.one_gemm = one_gemm
        self.taps = taps_hw
        self.tap_map = _tap_map(kernel, stride, (phase_h, phase_w))
        self.padded = tuple(dy_pads) != (0, 0, 0, 0)
        self.pad = ops.Pad(((0, 0), (0, 0), (dy_pads[0], dy_pads[1]), (dy_pads[2], dy_pads[3])))
        self.im2col = Im2Col(ksizes=taps_hw, strides=(1, 1), dilations=(1, 1), pads=(0, 0))

    def construct(self, dout, w):
        wt = _input_grad_kernel(w, self.tap_map)
        if self.padded:
            dout = self.pad(dout)
        return _correlate_t(self.im2col, dout, wt, self.mh, self.mw, self.one_gemm)


class _PhaseZero(nn.Cell):
    """A stride phase that no kernel tap reaches (e.g. the odd positions of a 1x1 stride-2 conv)."""

    taps = (0, 0)

    def __init__(self, out_hw):
        super().__init__()
        self.mh, self.mw = out_hw

    def construct(self, dout, w):
        return ops.zeros((dout.shape[0], w.shape[1], self.mh, self.mw), dout.dtype)


def _phase_cells(kernel, stride, ho_wo, padded_hw, one_gemm):
    """The s_h*s_w phase cells, row-major, and the per-phase output size (ceil(Hp/s), ceil(Wp/s))."""
    (kh, kw), (sh, sw), (ho, wo), (hp, wp) = kernel, stride, ho_wo, padded_hw
    mh, mw = -(-hp // sh), -(-wp // sw)
    cells = []
    for ph in range(sh):
        for pw in range(sw):
            th, tw = len(range(ph, kh, sh)), len(range(pw, kw, sw))
            if th == 0 or tw == 0:
                cells.append(_PhaseZero((mh, mw)))
            else:
                pads = (th - 1, mh - ho, tw - 1, mw - wo)
                cells.append(_PhaseGrad(kernel, ph, pw, stride, (th, tw), pads, (mh, mw), one_gemm))
    return cells, (mh, mw)


@dataclass(frozen=True)
class ConvGeometry:
    """The shapes a composed conv works with, from its configuration alone (no Cell is built):
    what `_ConvFn` fixes on the host, and what `memory.extra_mb` reads to bound a form's memory.

    The input gradient is the correlation of dY dilated by the stride (zh x zw), padded so that it
    yields exactly the h x w input positions (pads d*(k-1) - t before, h + t - zh after); padding it to
    the "full" correlation over the padded input and cropping afterwards needs (hp*wp)/(h*w) times more
    columns (1.6x at 8x8, 9x at 1x1 for 3x3/pad-1 layers), so the full form (`cropped`) is kept for the
    rare layers whose padding exceeds the kernel extent."""

    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    ho: int
    wo: int
    pre: tuple           # pads applied explicitly before unfolding x
    unfold_pad: tuple    # pads the unfold applies itself
    xp_hw: tuple         # x after `pre`
    pre_needed: bool
    zh: int              # dY dilated by the stride
    zw: int
    cropped: bool
    dxh: int             # the input gradient's positions before any crop
    dxw: int
    z_pre: tuple
    z_unfold_pad: tuple
    zp_hw: tuple         # dilated dY after `z_pre`
    z_pre_needed: bool
    strided: bool
    by_phase: bool       # the input gradient by stride phases ("+phases")
    mh: int              # each phase's output size (by_phase)
    mw: int
    phase_taps: tuple    # each phase's kernel taps (th, tw), row-major; (0, 0) for a phase with none
    dw_from_dy: bool     # the weight gradient from the input gradient's columns of dY

    @classmethod
    def of(cls, kernel, stride, dilation, pads, input_hw, by_phase: bool = False, input_grad: bool = True,
           native_dw: bool = False, native_fwd_dx: bool = False) -> "ConvGeometry":
        (kh, kw), (sh, sw), (dh, dw), (t, b, l, r), (h, w) = kernel, stride, dilation, pads, input_hw
        hp, wp = h + t + b, w + l + r
        ho, wo = _out_len(hp, kh, sh, dh), _out_len(wp, kw, sw, dw)
        pre, unfold_pad = _split_pads(pads)
        zh, zw = (ho - 1) * sh + 1, (wo - 1) * sw + 1
        eh, ew = dh * (kh - 1), dw * (kw - 1)
        exact = (eh - t, h + t - zh, ew - l, w + l - zw)
        cropped = min(exact) < 0
        z_pads, (dxh, dxw) = ((eh, hp - zh, ew, wp - zw), (hp, wp)) if cropped else (exact, (h, w))
        z_pre, z_unfold_pad = _split_pads(z_pads)
        mh, mw, taps = 0, 0, ()
        if by_phase:
            mh, mw = -(-hp // sh), -(-wp // sw)
            taps = tuple((th, tw) if th and tw else (0, 0) for th, tw in
                         ((len(range(ph, kh, sh)), len(range(pw, kw, sw))) for ph in range(sh) for pw in range(sw)))
        return cls(kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, dw=dw, ho=ho, wo=wo, pre=pre, unfold_pad=unfold_pad,
                   xp_hw=(h + pre[0] + pre[1], w + pre[2] + pre[3]), pre_needed=pre != (0, 0, 0, 0), zh=zh, zw=zw,
                   cropped=cropped, dxh=dxh, dxw=dxw, z_pre=z_pre, z_unfold_pad=z_unfold_pad,
                   zp_hw=(zh + z_pre[0] + z_pre[1], zw + z_pre[2] + z_pre[3]), z_pre_needed=z_pre != (0, 0, 0, 0),
                   strided=sh > 1 or sw > 1, by_phase=by_phase, mh=mh, mw=mw, phase_taps=taps,
                   dw_from_dy=bool(input_grad) and not (by_phase or cropped or native_dw or native_fwd_dx))


def geometry(conv: nn.Conv2d, input_hw, form: str, input_grad: bool = True) -> ConvGeometry:
    """The geometry of `conv` composed in `form` at this input size (a grouped layer has no phases)."""
    parsed = Form.parse(form)
    return ConvGeometry.of(conv.kernel_size, conv.stride, conv.dilation, conv_pads(conv, *input_hw), tuple(input_hw),
                           parsed.phases and conv.group == 1, input_grad, parsed.native == "dw",
                           parsed.native == "fwd-dx")


class _ConvFn(nn.Cell):
    """y = conv(x, w) with a hand-written backward; parameter-free so gradients flow to w as an input.

    Every shape-dependent choice (pads, output size, crops) is fixed here on the host.
    """

    def __init__(self, kernel, stride, dilation, pads, input_hw, one_gemm: bool, by_phase: bool = False,
                 native_dw: bool = False, group: int = 1, native_fwd_dx: bool = False, out_channel: int = 1,
                 input_grad: bool = True):
        super().__init__()
        geometry = ConvGeometry.of(kernel, stride, dilation, pads, input_hw, by_phase, input_grad, native_dw,
                                   native_fwd_dx)
        for field in dataclasses.fields(geometry):  # every shape this layer works with, fixed on the host
            setattr(self, field.name, getattr(geometry, field.name))
        self.one_gemm = one_gemm
        t, b, l, r = pads
        h, w = input_hw
        hp, wp = h + t + b, w + l + r
        self.pre_pad = _pad_op(geometry.pre)
        self.z_pad = _pad_op(geometry.z_pre)
        # zero insertion between dY's rows/columns: (n, k, ho, 1, wo, 1) padded to (.., sh, .., sw)
        self.dilate = ops.Pad(((0, 0), (0, 0), (0, 0), (0, self.sh - 1), (0, 0), (0, self.sw - 1)))
        self.im2col = Im2Col(ksizes=(self.kh, self.kw), strides=(self.sh, self.sw), dilations=(self.dh, self.dw),
                             pads=_pair(self.unfold_pad))
        self.z_im2col = Im2Col(ksizes=(self.kh, self.kw), strides=(1, 1), dilations=(self.dh, self.dw),
                               pads=_pair(self.z_unfold_pad))
        self.crop = (t, l, h, w)  # the input positions within the padded input gradient
        self.tap_map = _tap_map(kernel)
        self.z_sliced = (self.zh, self.zw) != (self.ho * self.sh, self.wo * self.sw)
        # strided, undilated (the "+phases" forms): the input gradient by stride phases (no zero
        # insertion, s*s fewer columns; more, smaller GEMMs, so it is measured against the other form)
        if self.by_phase:
            cells, _ = _phase_cells(kernel, stride, (self.ho, self.wo), (hp, wp), one_gemm)
            self.phases = nn.CellList(cells)
            self.phase_cropped = self.crop != (0, 0, self.mh * self.sh, self.mw * self.sw)
            self.stack_w = ops.Stack(axis=-1)
            self.stack_h = ops.Stack(axis=3)
        # the weight gradient by MindSpore's own kernel (NATIVE_DW); its out_channel attribute is not
        # read (the kernel takes the shapes from its inputs), so layers of any width share this cell;
        # its group is (a grouped layer's configuration includes it for this form)
        self.native_dw = native_dw
        self.dw_kernel = Conv2DBackpropFilter(out_channel=1, kernel_size=kernel, pad_mode="pad", pad=tuple(pads),
                                              pad_list=tuple(pads), stride=stride, dilation=dilation, group=group)
        # the forward and input gradient by MindSpore's own kernels (NATIVE_FWD_DX): `Conv2D` checks its
        # out_channel against the weights, so for this form the output width is part of the configuration
        # (`Conv2DBackpropInput` does not read it)
        self.native_fwd_dx = native_fwd_dx
        self.fwd_kernel = ops.Conv2D(out_channel=out_channel, kernel_size=kernel, mode=1, pad_mode="pad",
                                     pad=tuple(pads), stride=stride, dilation=dilation, group=group)
        self.dx_kernel = ops.Conv2DBackpropInput(out_channel=out_channel, kernel_size=kernel, pad_mode="pad",
                                                 pad=tuple(pads), pad_list=tuple(pads), stride=stride,
                                                 dilation=dilation, group=group)
        # the weight gradient from the input gradient's columns of dY (`_dx_dw_from_dy`) where those are
        # unfolded anyway: the input gradient is taken (`input_grad`; a layer whose input is the batch
        # would unfold dY for its weight gradient alone, K/C times x's columns: 21x for a 3->64 stem),
        # by this form's GEMMs over the input positions themselves (not by phases, not cropped)
        # (`dw_from_dy`: set from the geometry above)

    def _pre(self, x):
        if self.pre_needed:
            return self.pre_pad(x)
        return x

    def _dilated_dy(self, dout, n, k):
        """dY (n, k, ho, wo) as the input gradient's correlation reads it: zeros inserted between its
        rows and columns for a strided layer (cropped to zh x zw), then padded (see `__init__`)."""
        z = dout
        if self.strided:
            z = self.dilate(_RESHAPE(dout, (n, k, self.ho, 1, self.wo, 1)))
            z = _RESHAPE(z, (n, k, self.ho * self.sh, self.wo * self.sw))
            if self.z_sliced:
                z = _crop(z, (0, 0, self.zh, self.zw))
        if self.z_pre_needed:
            z = self.z_pad(z)
        return z

    def construct(self, x, w):
        if self.native_fwd_dx:
            return self.fwd_kernel(x, w)
        return _correlate(self.im2col, self._pre(x), _RESHAPE(w, (w.shape[0], -1)), self.ho, self.wo, self.one_gemm)

    def bprop(self, x, w, out, dout):
        n, c = x.shape[0], x.shape[1]
        k = w.shape[0]
        l = self.ho * self.wo
        # Order, not maths: MindSpore 2.10 runs a kernel once its inputs exist, so without these two
        # dependences a layer's backward temporaries outlive it.
        # Measurements: docs/design/composed-pass.md#the-backwards-order
        if _ORDERED_BPROP:
            x = ops.depend(x, dout)
        if self.native_dw:
            return self._dx(dout, w, n, c, k), self.dw_kernel(dout, x, w.shape)
        if self.dw_from_dy:
            return self._dx_dw_from_dy(dout, x, w, n, c, k)
        cols = _RESHAPE(self.im2col(self._pre(x)), (n, -1, l))
        if self.one_gemm:
            # one GEMM over the whole batch: dY(K, N*L) @ cols(C*k*k, N*L)^T. Its temporaries are the
            # size of the columns; the batched form's per-sample products below are N*K*C*k*k, which
            # at small spatial sizes (L << K) is far larger (ResNet-18's last stages at 32 px: 64-512x).
            dw = _MM_NT(_fold(_RESHAPE(dout, (n, k, l))), _fold(cols))
        else:
            # sum over the batch of dy_n @ cols_n^T: a batched GEMM with transpose_b instead of two
            # materialised transposes of the (large) column matrix (best at large spatial sizes)
            dw = _SUM(_BMM_NT(_RESHAPE(dout, (n, k, l)), cols), 0)
        dw = _RESHAPE(dw, w.shape)
        if _ORDERED_BPROP:
            dout = ops.depend(dout, dw)  # (2): the input gradient starts once the columns are consumed
        if self.native_fwd_dx:
            return self.dx_kernel(dout, w, x.shape), dw
        return self._dx(dout, w, n, c, k), dw

    def _dx(self, dout, w, n, c, k):
        """The input gradient (see the module docstring)."""
        if self.by_phase:
            return self._dx_by_phase(dout, w, n, c)
        z = self._dilated_dy(dout, n, k)
        wt = _input_grad_kernel(w, self.tap_map)
        dx = _correlate_t(self.z_im2col, z, wt, self.dxh, self.dxw, self.one_gemm)
        if self.cropped:
            dx = _crop(dx, self.crop)
        return dx

    def _dx_dw_from_dy(self, dout, x, w, n, c, k):
        """Both gradients from one unfolding of dY: the input gradient's columns `cols`, row k*taps + t
        holding dY~[k] (dilated and padded, `_dilated_dy`) at input position q shifted by the flipped
        tap t (t = the tap map's row for kernel tap tau). The input gradient contracts them with the
        flipped kernel (`_dx`); the weight gradient is the same sum read the other way:
        dW[k, c, tau] = sum_q cols[k*taps + t(tau), q] x[c, q], one GEMM with x itself (no columns of x:
        the im2col of x that the other path recomputes, C*k*k rows, is the costly kernel at large maps),
        its (K*taps, C) result put back in kernel order by a batched GEMM with the one-hot tap map.
        Measured: docs/design/measurements.md."""
        cols = self._dy_columns(dout, n, k)
        xl = _RESHAPE(x, (n, c, self.dxh * self.dxw))
        wt = _input_grad_kernel(w, self.tap_map)  # (K*taps, C)
        # the input gradient after the weight gradient, as in `bprop`: it feeds the previous layer's
        # backward, which would otherwise start (and unfold its own columns) while these wait for dW
        if self.one_gemm:
            folded = _fold(cols)
            dwt = _MM_NT(folded, _fold(xl))
            if _ORDERED_BPROP:
                folded = ops.depend(folded, dwt)
            dx = _unfold_batch(_MM_TN(wt, folded), n)
        else:
            dwt, dx = _dw_dx_batched(cols, xl, wt)
        return _RESHAPE(dx, (n, c, self.dxh, self.dxw)), _taps_to_kernel(dwt, self.tap_map, w.shape)

    def _dy_columns(self, dout, n, k):
        """The input gradient's columns: dY stride-dilated and padded (`_dilated_dy`), unfolded over the
        input positions, (n, K*taps, dxh*dxw)."""
        return _RESHAPE(self.z_im2col(self._dilated_dy(dout, n, k)), (n, -1, self.dxh * self.dxw))

    def _dx_by_phase(self, dout, w, n, c):
        outs = ()
        for cell in self.phases:
            outs = outs + (cell(dout, w),)
        rows = ()
        for i in range(self.sh):
            row = self.stack_w(outs[i * self.sw:(i + 1) * self.sw])         # (n, c, mh, mw, sw)
            rows = rows + (_RESHAPE(row, (n, c, self.mh, self.mw * self.sw)),)
        dxp = _RESHAPE(self.stack_h(rows), (n, c, self.mh * self.sh, self.mw * self.sw))  # interleaved
        if self.phase_cropped:
            dxp = _crop(dxp, self.crop)
        return dxp


def _group_correlate(im2col, xp, w4, ho, wo):
    """Grouped cross-correlation of x with w4 (G, Kg, Cg*kh*kw) as im2col + one GEMM batched over the
    samples and the groups: per sample and group, the group's (Kg, Cg*k*k) kernel times its
    (Cg*k*k, L) columns; output (N, G*Kg, ho, wo). For a depthwise layer (Cg = Kg = 1) that is each
    channel's taps times its columns, faster than native and than the other depthwise forms tried
    (docs/design/measurements.md)."""
    n = xp.shape[0]
    g, kg, ckk = w4.shape
    cols = _RESHAPE(im2col(xp), (n, g, ckk, ho * wo))
    y = _BMM(ops.BroadcastTo((n, g, kg, ckk))(w4), cols)
    return _RESHAPE(y, (n, g * kg, ho, wo))


def _group_correlate_t(im2col, xp, w4t, ho, wo):
    """`_group_correlate` with each group's kernel given transposed, w4t (G, Kg*taps, Cg), contracted
    with transpose_a (the input gradient; see `_input_grad_kernel`)."""
    n = xp.shape[0]
    g, kt, cg = w4t.shape
    cols = _RESHAPE(im2col(xp), (n, g, kt, ho * wo))
    y = _BMM_TN(ops.BroadcastTo((n, g, kt, cg))(w4t), cols)
    return _RESHAPE(y, (n, g * cg, ho, wo))


class _GroupedFn(_ConvFn):
    """`_ConvFn` for a grouped convolution (weights (K, C/G, kh, kw), depthwise included): the same
    geometry (pads, stride dilation of dY, crops), with every GEMM batched over the groups instead
    of contracting all the channels. The input gradient correlates the stride-dilated, padded dY
    with each group's kernel flipped and transposed by `_input_grad_kernel`, as `_ConvFn` does; the
    weight gradient is, per sample and group, those columns of dY (Kg*taps, L) times the group's x
    (Cg, L) transposed (`dw_from_dy`), or else dY (Kg, L) times the group's columns of x
    (Cg*k*k, L) transposed, summed over the samples."""

    def __init__(self, kernel, stride, dilation, pads, input_hw, native_dw: bool = False, group: int = 1,
                 native_fwd_dx: bool = False, out_channel: int = 1, input_grad: bool = True):
        super().__init__(kernel, stride, dilation, pads, input_hw, one_gemm=False, by_phase=False,
                         native_dw=native_dw, group=group, native_fwd_dx=native_fwd_dx, out_channel=out_channel,
                         input_grad=input_grad)

    def construct(self, x, w):
        if self.native_fwd_dx:
            return self.fwd_kernel(x, w)
        k, cg = w.shape[0], w.shape[1]
        g = x.shape[1] // cg
        return _group_correlate(self.im2col, self._pre(x), _RESHAPE(w, (g, k // g, cg * self.kh * self.kw)),
                                self.ho, self.wo)

    def bprop(self, x, w, out, dout):
        n = x.shape[0]
        k, cg = w.shape[0], w.shape[1]
        g = x.shape[1] // cg
        kk = self.kh * self.kw
        l = self.ho * self.wo
        if _ORDERED_BPROP:  # the same two ordering dependences as `_ConvFn.bprop`, for the same reasons
            x = ops.depend(x, dout)
        if self.native_dw:
            return self._dx(dout, w, n, g, k), self.dw_kernel(dout, x, w.shape)
        if self.dw_from_dy:  # both gradients from one unfolding of dY, per group (see `_ConvFn._dx_dw_from_dy`)
            ldx = self.dxh * self.dxw
            cols = _RESHAPE(self._dy_columns(dout, n, k), (n, g, -1, ldx))        # (n, G, Kg*taps, Ldx)
            wt = _RESHAPE(_input_grad_kernel(w, self.tap_map), (g, -1, cg))       # (G, Kg*taps, Cg)
            dwt, dx = _dw_dx_batched(cols, _RESHAPE(x, (n, g, cg, ldx)), wt)     # (G, Kg*taps, Cg), (n, G, Cg, Ldx)
            return (_RESHAPE(dx, (n, g * cg, self.dxh, self.dxw)),
                    _taps_to_kernel(_RESHAPE(dwt, (-1, cg)), self.tap_map, w.shape))
        cols = _RESHAPE(self.im2col(self._pre(x)), (n, g, cg * kk, l))
        dw = _RESHAPE(_SUM(_BMM_NT(_RESHAPE(dout, (n, g, k // g, l)), cols), 0), w.shape)
        if _ORDERED_BPROP:
            dout = ops.depend(dout, dw)
        if self.native_fwd_dx:
            return self.dx_kernel(dout, w, x.shape), dw
        return self._dx(dout, w, n, g, k), dw

    def _dx(self, dout, w, n, g, k):
        """The input gradient: dY stride-dilated and padded, correlated with each group's flipped,
        transposed kernel."""
        cg = w.shape[1]
        z = self._dilated_dy(dout, n, k)
        wt = _input_grad_kernel(w, self.tap_map)  # (K * taps, Cg)
        dx = _group_correlate_t(self.z_im2col, z, _RESHAPE(wt, (g, -1, cg)), self.dxh, self.dxw)
        if self.cropped:
            dx = _crop(dx, self.crop)
        return dx


_FNS: dict = {}


def _grouped_fn(*config) -> _GroupedFn:
    """One shared `_GroupedFn` per configuration (see `_conv_fn`; channels and groups come from the tensors)."""
    fn = _FNS.get(("grouped",) + config)
    if fn is None:
        fn = _FNS[("grouped",) + config] = _GroupedFn(*config)
    return fn


def _conv_fn(*config) -> _ConvFn:
    """One shared, parameter-free `_ConvFn` per configuration.

    MindSpore compiles each Cell instance's construct and bprop into graphs of their own: measured on
    this machine, every distinct instance added ~8 MB (stride 1) to ~17 MB (stride 2) of compile-time
    memory, while layers sharing one instance cost almost nothing extra (8 identical 3x3 layers:
    109 MB distinct vs 61 MB shared). Channels are not part of the configuration (they come from
    the tensors), so many layers of a ResNet share one.
    """
    fn = _FNS.get(config)
    if fn is None:
        fn = _FNS[config] = _ConvFn(*config)
    return fn


def pointwise(conv: nn.Conv2d, input_hw) -> bool:
    """A stride-1, unpadded 1x1 conv: a plain matmul over the channels. (Strided 1x1 convs go through
    `_ConvFn`: differentiating x[:, :, ::s, ::s] hits a PyNative StridedSliceGrad bug in MindSpore
    2.10, "input memory out of bounds".) Grouped convolutions never are."""
    return (conv.group == 1 and conv.kernel_size == (1, 1) and conv.stride == (1, 1)
            and conv_pads(conv, *input_hw) == (0, 0, 0, 0))


def matmul_only(conv: nn.Conv2d, input_hw) -> bool:
    """Whether `GemmConv2d` makes this layer, at this input size, a plain matmul differentiated by
    MindSpore's own autodiff (no `_ConvFn`: nothing extra is compiled)."""
    return pointwise(conv, input_hw) or single_tap(conv, input_hw) is not None


def single_tap(conv: nn.Conv2d, input_hw) -> int | None:
    """The flattened index of the only kernel tap that ever sees the input, for a 1x1 input whose
    output is 1x1 (e.g. a 3x3/pad-1 conv on ResNet's last 1x1 maps at 32 px: the other 8 taps see
    only padding); None otherwise, and for a `pointwise` layer (its own plain-matmul forms)."""
    if tuple(input_hw) != (1, 1) or pointwise(conv, input_hw) or conv.group != 1:
        return None
    t, b, l, r = conv_pads(conv, 1, 1)
    (kh, kw), (sh, sw), (dh, dw) = conv.kernel_size, conv.stride, conv.dilation
    if (_out_len(1 + t + b, kh, sh, dh), _out_len(1 + l + r, kw, sw, dw)) != (1, 1) or t % dh or l % dw:
        return None
    i, j = t // dh, l // dw
    return i * kw + j if i < kh and j < kw else None


class GemmConv2d(nn.Cell):
    """Drop-in for an `nn.Conv2d` at one input size: the same Parameter objects, GEMM arithmetic;
    an input of another spatial size runs the native layer it replaced.

    Stride-1 1x1 convolutions become a plain matmul ("batched": the kernel broadcast over the batch;
    "one-gemm": one GEMM over the batch folded next to the positions, which at ResNet-50's 1x1 and
    2x2 maps ran 5-37x faster than the broadcast and 3-6x faster than native), and so do layers
    whose 1x1 input only ever meets one kernel tap (`single_tap`; the tap is picked by a GEMM with a
    one-hot vector, so its weight gradient lands in that tap and the others get exact zeros), both
    differentiated by MindSpore's own autodiff; the others use `_ConvFn`'s hand-written backward,
    and grouped (depthwise included) layers `_GroupedFn`'s, whose GEMMs are batched over the groups.

    `input_grad=False` for a layer whose input gradient is never taken (its input is the batch): its
    weight gradient then unfolds x rather than dY (see `_ConvFn.dw_from_dy`); the gradients are the
    same either way, so this only decides which is cheaper.
    """

    def __init__(self, conv: nn.Conv2d, input_hw: tuple[int, int], form: str = "batched", input_grad: bool = True):
        super().__init__(auto_prefix=False)
        if form not in layer_forms(conv, input_hw):
            if form not in ALL_FORMS:
                why = _NO_PHASES if "+phases" in form and NATIVE_FWD_DX in form else f"the forms are {ALL_FORMS}"
            elif conv.group != 1:
                why = (f"a grouped layer has the batched form, alone, with '{NATIVE_DW}' or with "
                       f"'{NATIVE_FWD_DX}'")
            elif Form.parse(form).native is not None:
                why = f"the '{NATIVE_DW}' and '{NATIVE_FWD_DX}' forms are for layers that do not become a plain matmul"
            else:
                why = "the '+phases' forms need a stride > 1 and no dilation"
            raise ValueError(f"`form` must be one of {layer_forms(conv, input_hw)} for this layer at input size "
                             f"{tuple(input_hw)}, but got {form!r} ({why}).")
        self.form = form
        shape = Form.parse(form)
        self.one_gemm = shape.one_gemm
        # the layer's mixed-precision flags (`to_float`): under O2 the composed form must cast its
        # inputs and weights as the native conv does (without them fp16 inputs met fp32 weights:
        # "For primitive[MatMulExt], the input type must be same")
        precision = {k: v for k, v in conv.get_flags().items() if k in ("fp16", "fp32", "bf16")}
        if precision:
            self.add_flags_recursive(**precision)
        self.weight = conv.weight
        # the layer it replaces, for inputs of another size (evaluation on whole images, a last
        # smaller batch is fine: only the spatial size is fixed); kept out of the Cell tree, so its
        # (shared) Parameters are not listed twice
        object.__setattr__(self, "_native", conv)
        self.input_hw = tuple(int(v) for v in input_hw)
        self.has_bias = conv.has_bias
        if conv.has_bias:
            self.bias = conv.bias
        self.out_channels = conv.out_channels
        self.kernel_size = conv.kernel_size
        self.stride = conv.stride
        pads = conv_pads(conv, *input_hw)
        self.pointwise = pointwise(conv, input_hw)
        self.tap = single_tap(conv, input_hw)
        if self.tap is not None:
            kk = conv.kernel_size[0] * conv.kernel_size[1]
            self.select = Tensor(np.eye(kk, dtype=np.float32)[:, self.tap:self.tap + 1].copy())  # (kk, 1)
        native_dw, native_fwd_dx = shape.native == "dw", shape.native == "fwd-dx"
        # the width is part of the configuration only where a native forward reads it (see `_ConvFn`)
        width = conv.out_channels if native_fwd_dx else 1
        if conv.group != 1:
            # a native kernel in the form: then the group is part of the configuration
            self.fn = _grouped_fn(conv.kernel_size, conv.stride, conv.dilation, pads, tuple(input_hw),
                                  native_dw, conv.group if native_dw or native_fwd_dx else 1, native_fwd_dx, width,
                                  bool(input_grad))
        else:
            self.fn = None if self.pointwise or self.tap is not None else _conv_fn(
                conv.kernel_size, conv.stride, conv.dilation, pads, tuple(input_hw), self.one_gemm,
                shape.phases, native_dw, 1, native_fwd_dx, width, bool(input_grad))

    def construct(self, x):
        if x.shape[2:] != self.input_hw:  # a Python constant in a graph: no branch is compiled
            return self._native(x)
        # mixed precision: MindSpore casts the flagged Cell's inputs, not the Parameters this one
        # reads itself; the weights follow the input's dtype here, as native Conv2D's do (a Python
        # constant comparison: nothing is added in float32)
        weight = self.weight if self.weight.dtype == x.dtype else ops.cast(self.weight, x.dtype)
        if self.pointwise:
            n, c, h, w = x.shape
            k, l = self.out_channels, h * w
            w2 = _RESHAPE(weight, (k, c))
            if not self.one_gemm:  # W broadcast over the batch (best at large spatial sizes)
                y = ops.matmul(w2, _RESHAPE(x, (n, c, l)))
            elif l == 1:  # one (N, C) x (C, K) GEMM, nothing to move
                y = _MM_NT(_RESHAPE(x, (n, c)), w2)
            else:  # one GEMM over (C, N*L), the batch folded next to the positions
                y = _unfold_batch(_MM(w2, _fold(_RESHAPE(x, (n, c, l)))), n)
            y = _RESHAPE(y, (n, k, h, w))
        elif self.tap is not None:
            n, c = x.shape[0], x.shape[1]
            k, kk = self.out_channels, self.kernel_size[0] * self.kernel_size[1]
            w2 = _RESHAPE(_MM(_RESHAPE(weight, (k * c, kk)), ops.cast(self.select, weight.dtype)), (k, c))
            y = _RESHAPE(_MM_NT(_RESHAPE(x, (n, c)), w2), (n, k, 1, 1))
        else:
            y = self.fn(x, weight)
        if self.has_bias:
            bias = self.bias if self.bias.dtype == y.dtype else ops.cast(self.bias, y.dtype)
            y = y + bias.reshape(1, -1, 1, 1)
        return y


def supported(conv) -> tuple[bool, str]:
    """Whether the pass can rewrite this layer, and why not."""
    if type(conv) is not nn.Conv2d:
        return False, f"{type(conv).__name__} is not a plain nn.Conv2d"
    if conv.data_format != "NCHW":
        return False, f"data_format={conv.data_format}"
    return True, ""


__all__ = ["ALL_FORMS", "ConvGeometry", "FORMS", "Form", "NATIVE_DW", "NATIVE_FWD_DX", "GemmConv2d", "conv_pads", "dw_forms", "forms_for",
           "fx_forms", "geometry", "layer_forms",
           "matmul_only", "out_shape", "pointwise", "same_pads", "single_tap", "supported"]
