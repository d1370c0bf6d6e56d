"""Dropout whose random state is a Parameter, so a checkpoint resumes it exactly.

MindSpore 2.10's `nn.Dropout` (and `ops.dropout`, `ops.rand`, `ops.bernoulli`, ...) on CPU draw
from a generator that lives inside the compiled kernel: `mindspore.get_rng_state()` does not see
it (it stayed all zeros while the masks changed), and a fresh process restarts the sequence from
the seed; the generator-based `mint.nn.Dropout` has no CPU kernel (`Unsupported op [DropoutExt]`).
So no checkpoint can make `nn.Dropout` continue identically after a restart.

`mindstep.Dropout` computes its mask from a counter-based hash instead: element `i` of call `t` is
kept when `hash(hash(seed ^ hash(t)) ^ i * 0x9E3779B9) / 2**32 < 1 - p` (the 32-bit `lowbias32`
mixer, in int32 arithmetic that wraps exactly like uint32: tested against numpy), and the call
counter `t` and the `seed` are Parameters of the layer. They are saved with the network's weights,
so a step restored from a checkpoint draws the same masks as the run that was never interrupted.
It costs a dozen integer ops per element, and it runs on every device.

`resumable_dropout(net)` swaps the `nn.Dropout` layers of a network for it in place.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ._cells import replace_cell
from ._errors import bad_type, check_float, check_int

_GOLDEN = int(np.array(0x9E3779B9, np.uint32).astype(np.int32))
_M1 = 0x7FEB352D
_M2 = int(np.array(0x846CA68B, np.uint32).astype(np.int32))


def _shift_xor(x, bits: int):
    """x ^ (x >>> bits) on int32 holding uint32 bits: the arithmetic shift's sign bits are masked off."""
    shifted = ops.bitwise_right_shift(x, ms.Tensor(bits, ms.int32))
    return ops.bitwise_xor(x, ops.bitwise_and(shifted, ms.Tensor((1 << (32 - bits)) - 1, ms.int32)))


def mix32(x):
    """The `lowbias32` integer hash of each int32 element (uint32 arithmetic, wrapping)."""
    x = _shift_xor(x, 16) * ms.Tensor(_M1, ms.int32)
    x = _shift_xor(x, 15) * ms.Tensor(_M2, ms.int32)
    return _shift_xor(x, 16)


def mix32_reference(x: np.ndarray) -> np.ndarray:
    """`mix32` in numpy uint32, the reference the tests compare against."""
    x = np.asarray(x).astype(np.uint32)
    x = (x ^ (x >> 16)) * np.uint32(0x7FEB352D)
    x = (x ^ (x >> 15)) * np.uint32(0x846CA68B)
    return x ^ (x >> 16)


def _next_seed() -> int:
    """A seed from numpy's global generator, which `mindspore.set_seed` seeds: layers built after the
    same `set_seed` get the same seeds, in build order."""
    return int(np.random.randint(-(2 ** 31), 2 ** 31 - 1))


class Dropout(nn.Cell):
    """Drop-in for `nn.Dropout(p=...)` whose random state checkpoints and resumes exactly.

    Args:
        p: probability of zeroing an element, in [0, 1); kept elements are scaled by 1 / (1 - p).
        seed: an int for the mask sequence; by default drawn from numpy's global generator, which
            `mindspore.set_seed` seeds, so two builds after the same `set_seed` draw the same masks.

    Example:
        `net = nn.SequentialCell(nn.Dense(8, 8), mindstep.Dropout(0.1))`.

    Note:
        Unlike `nn.Dropout`, whose generator lives inside MindSpore's kernel, its state is two
        Parameters (`<name>.seed`, `<name>.calls`) that `TrainStep.save` checkpoints with the net.
    """

    def __init__(self, p: float = 0.5, seed: int | None = None):
        super().__init__()
        self.p = check_float("p", p, low=0.0, high=1.0, high_open=True, fix="Pass a drop probability, e.g. p=0.1.")
        if seed is None:
            seed = _next_seed()
        seed = check_int("seed", seed, minimum=-(2 ** 31), fix="Pass an int32 seed, e.g. seed=0.")
        self.seed = ms.Parameter(ms.Tensor(int(np.array(seed).astype(np.int32)), ms.int32), name="seed",
                                 requires_grad=False)
        self.calls = ms.Parameter(ms.Tensor(0, ms.int32), name="calls", requires_grad=False)

    def construct(self, x):
        if not self.training or self.p == 0.0:
            return x
        key = mix32(ops.bitwise_xor(self.seed, mix32(self.calls)))
        index = ops.arange(0, x.size, dtype=ms.int32).reshape(x.shape)
        bits = mix32(ops.bitwise_xor(index * ms.Tensor(_GOLDEN, ms.int32), key))
        uniform = ops.bitwise_and(ops.bitwise_right_shift(bits, ms.Tensor(8, ms.int32)),
                                  ms.Tensor(0xFFFFFF, ms.int32)).astype(ms.float32) * (1.0 / 2 ** 24)
        keep = (uniform < (1.0 - self.p)).astype(x.dtype)
        x = ops.depend(x, ops.assign_add(self.calls, ms.Tensor(1, ms.int32)))
        return x * keep * (1.0 / (1.0 - self.p))

    def extend_repr(self):
        return f"p={self.p}"


def resumable_dropout(net: nn.Cell) -> list[str]:
    """Replace every `nn.Dropout` in `net` by a `mindstep.Dropout` with the same `p`, in place.

    Returns:
        The names of the replaced layers. Their state Parameters are named `<layer>.seed` and
        `<layer>.calls`.

    Example:
        `mindstep.resumable_dropout(net)` returns the swapped layers' names, e.g.
        `['encoder.0.drop', 'encoder.1.drop']`.
    """
    if not isinstance(net, nn.Cell):
        raise bad_type("net", net, "a mindspore.nn.Cell", "Pass the network whose nn.Dropout layers to replace.")
    replaced = []
    for name, cell in list(net.cells_and_names()):
        if name and type(cell) is nn.Dropout:
            p = cell.p if cell.p is not None else 1.0 - cell.keep_prob
            new = Dropout(float(p))
            new.seed.name, new.calls.name = f"{name}.seed", f"{name}.calls"
            replace_cell(net, name, new)
            replaced.append(name)
    return replaced
