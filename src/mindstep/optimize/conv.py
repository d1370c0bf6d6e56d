"""`nn.Conv2d` as im2col + GEMM, with a backward pass written as GEMMs too.

Why: MindSpore 2.10's CPU `Conv2D` and `Conv2DBackpropInput` kernels run near 1 GFLOP/s while a GEMM
runs near 150 GFLOP/s on the same machine (shared notes). The composed form:

- forward: `y = W(K, C*k*k) @ unfold(pad(x))`, one (batched) GEMM;
- weight gradient: `dW = dY(K, N*L) @ unfold(pad(x))^T`, one GEMM (the columns are recomputed in the
  backward instead of being kept from the forward, so the forward stores nothing extra);
- input gradient: the transposed convolution written as a *forward* im2col + GEMM: dY is dilated by
  the stride, padded by `dilation*(k-1)`, and correlated with the spatially flipped, channel-
  transposed kernel. This avoids `col2im`, whose CPU kernel is what made naive swaps slow.

Padding is explicit (zeros + slice assignment) for every pad mode, including TF-style asymmetric
"same" padding with stride > 1. Only `group=1` convolutions are rewritten.
"""
from __future__ import annotations


from mindspore import nn, ops


FORMS = ("batched", "one-gemm")
_BMM_NT = ops.BatchMatMul(transpose_b=True)


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


def _padded(x, t, b, l, r):
    # ops.pad fails to compile inside a custom bprop in MindSpore 2.10 ("func graph is empty"), and so
    # does any branching in helpers called from it: callers decide on the host whether to pad, and
    # padding is written as zeros + slice assignment.
    n, c, h, w = x.shape
    out = ops.zeros((n, c, h + t + b, w + l + r), x.dtype)
    out[:, :, t:t + h, l:l + w] = x
    return out


def _split_pads(pads):
    """(explicit pads to apply first, padding for unfold): unfold can pad symmetric cases itself.

    Decided on the host: branching on the pads inside graph code called from a custom bprop makes
    MindSpore 2.10 fail ("func graph is empty").
    """
    t, b, l, r = pads
    if t == b and l == r:
        return (0, 0, 0, 0), (t, l)
    return pads, 0


def _correlate(xp, unfold_pad, w2, kh, kw, dh, dw, sh, sw, ho, wo, one_gemm):
    """Cross-correlation of x with w2 (K, C*kh*kw) as unfold + GEMM; output (N, K, ho, wo).

    `one_gemm=False`: `W @ cols` batched over N (best at large spatial sizes).
    `one_gemm=True`: one GEMM over (C*k*k, N*L) (best at small spatial sizes, where broadcasting W
    across the batch would copy it N times).
    """
    n = xp.shape[0]
    k = w2.shape[0]
    cols = ops.unfold(xp, kernel_size=(kh, kw), dilation=(dh, dw), padding=unfold_pad, stride=(sh, sw))
    if one_gemm:
        y = ops.matmul(w2, cols.transpose(1, 0, 2).reshape(cols.shape[1], -1))
        return y.reshape(k, n, ho * wo).transpose(1, 0, 2).reshape(n, k, ho, wo)
    return ops.matmul(w2, cols).reshape(n, k, ho, wo)


class _ConvFn(nn.Cell):
    """y = conv(x, w) with a hand-written backward; parameter-free so gradients flow to w as an input.

    Every shape-dependent choice (pads, output size, crops) is fixed here on the host.
    """

    def __init__(self, kernel, stride, dilation, pads, input_hw, one_gemm: bool):
        super().__init__()
        self.kh, self.kw = kernel
        self.sh, self.sw = stride
        self.dh, self.dw = dilation
        self.one_gemm = one_gemm
        t, b, l, r = pads
        h, w = input_hw
        hp, wp = h + t + b, w + l + r
        self.hp, self.wp = hp, wp  # the input gradient's correlation yields the padded input size
        self.ho = (hp - self.dh * (self.kh - 1) - 1) // self.sh + 1
        self.wo = (wp - self.dw * (self.kw - 1) - 1) // self.sw + 1
        self.pre, self.unfold_pad = _split_pads(pads)
        self.pre_needed = self.pre != (0, 0, 0, 0)
        # input gradient: dY dilated by the stride (zh x zw), padded to a "full" correlation
        self.zh, self.zw = (self.ho - 1) * self.sh + 1, (self.wo - 1) * self.sw + 1
        eh, ew = self.dh * (self.kh - 1), self.dw * (self.kw - 1)
        self.z_pre, self.z_unfold_pad = _split_pads((eh, hp - self.zh, ew, wp - self.zw))
        self.z_pre_needed = self.z_pre != (0, 0, 0, 0)
        self.strided = self.sh > 1 or self.sw > 1
        self.crop = (t, t + h, l, l + w)
        self.cropped = pads != (0, 0, 0, 0)

    def _pre(self, x):
        if self.pre_needed:
            return _padded(x, self.pre[0], self.pre[1], self.pre[2], self.pre[3])
        return x

    def construct(self, x, w):
        return _correlate(self._pre(x), self.unfold_pad, w.reshape(w.shape[0], -1), self.kh, self.kw, self.dh,
                          self.dw, self.sh, self.sw, self.ho, self.wo, self.one_gemm)

    def bprop(self, x, w, out, dout):
        n, c = x.shape[0], x.shape[1]
        k = w.shape[0]
        xp = self._pre(x)
        cols = ops.unfold(xp, kernel_size=(self.kh, self.kw), dilation=(self.dh, self.dw),
                          padding=self.unfold_pad, stride=(self.sh, self.sw))
        dy = dout.reshape(n, k, self.ho * self.wo)
        # sum over the batch of dy_n @ cols_n^T: a batched GEMM with transpose_b instead of two
        # materialised transposes of the (large) column matrix
        dw = _BMM_NT(dy, cols).sum(axis=0).reshape(w.shape)
        z = dout
        if self.strided:
            z = ops.zeros((n, k, self.zh, self.zw), dout.dtype)
            z[:, :, ::self.sh, ::self.sw] = dout
        wf = ops.flip(w, (2, 3)).transpose(1, 0, 2, 3).reshape(c, -1)
        if self.z_pre_needed:
            z = _padded(z, self.z_pre[0], self.z_pre[1], self.z_pre[2], self.z_pre[3])
        dxp = _correlate(z, self.z_unfold_pad, wf, self.kh, self.kw, self.dh, self.dw, 1, 1,
                         self.hp, self.wp, self.one_gemm)
        dx = dxp
        if self.cropped:
            dx = dxp[:, :, self.crop[0]:self.crop[1], self.crop[2]:self.crop[3]]
        return dx, dw


class GemmConv2d(nn.Cell):
    """Drop-in for an `nn.Conv2d` at one input size: the same Parameter objects, GEMM arithmetic.

    Stride-1 1x1 convolutions become a plain matmul, differentiated by MindSpore's own autodiff;
    the others use `_ConvFn`'s hand-written backward.
    """

    def __init__(self, conv: nn.Conv2d, input_hw: tuple[int, int], form: str = "batched"):
        super().__init__(auto_prefix=False)
        if form not in FORMS:
            raise ValueError(f"`form` must be one of {FORMS}, but got {form!r}.")
        self.form = form
        if conv.group != 1:
            raise ValueError(f"GemmConv2d rewrites group=1 convolutions only; this one has group={conv.group}.")
        self.weight = conv.weight
        self.has_bias = conv.has_bias
        if conv.has_bias:
            self.bias = conv.bias
        self.out_channels = conv.out_channels
        self.kernel_size = conv.kernel_size
        self.stride = conv.stride
        pads = conv_pads(conv, *input_hw)
        # strided 1x1 convs go through _ConvFn: differentiating x[:, :, ::s, ::s] hits a PyNative
        # StridedSliceGrad bug in MindSpore 2.10 ("input memory out of bounds")
        self.pointwise = conv.kernel_size == (1, 1) and pads == (0, 0, 0, 0) and conv.stride == (1, 1)
        self.fn = None if self.pointwise else _ConvFn(conv.kernel_size, conv.stride, conv.dilation, pads,
                                                       input_hw, form == "one-gemm")

    def construct(self, x):
        if self.pointwise:
            n, c, h, w = x.shape
            y = ops.matmul(self.weight.reshape(self.out_channels, c), x.reshape(n, c, h * w))
            y = y.reshape(n, self.out_channels, h, w)
        else:
            y = self.fn(x, self.weight)
        if self.has_bias:
            y = y + self.bias.reshape(1, -1, 1, 1)
        return y


def supported(conv) -> tuple[bool, str]:
    """Whether the pass can rewrite this layer, and why not."""
    if type(conv) is not nn.Conv2d:
        return False, f"{type(conv).__name__} is not a plain nn.Conv2d"
    if conv.group != 1:
        return False, f"group={conv.group} (grouped/depthwise convs stay native)"
    if conv.data_format != "NCHW":
        return False, f"data_format={conv.data_format}"
    return True, ""


__all__ = ["GemmConv2d", "conv_pads", "same_pads", "supported"]
