"""MindSpore's graph-kernel fusion for a step's compile: `optimize={"fuse": True}`.

Why: what is left of a transformer step once its GEMMs are fast is elementwise work (GELU, LayerNorm,
softmax, residual adds), one memory-bound kernel per op on CPU. MindSpore 2.10 can fuse such chains
into one generated kernel each (graph-kernel fusion, its AKG compiler; `enable_graph_kernel`). It ships
in the CPU wheel, but its compiler imports the `decorator` package, which the wheel does not install
(without it the compile fails with "Response is empty"); mindstep's dependencies include it.

Off by default for now: it won in every measurement so far, but costs compile time (the generated
kernels compile in each process) and has been measured on one CPU only
(docs/design/measurements.md). Fused, the pass's own measurements choose differently, which is why
the decisions are keyed by the fusion (`key_device`).

The process's first `fused` block first runs a small fused graph `WARM_UP_CALLS` times (`_warm_up`).
Without it, a fused step whose process had run no fused graph before it compiled ran 3x slower, and
stayed so (docs/design/measurements.md; why is MindSpore's own matter).

Each process compiles its fused kernels afresh (BERT's first call 10.9-20.8 s against 5.9 unfused)
into a temporary directory of its own, removed at exit (MindSpore keeps them under
`MS_COMPILER_CACHE_PATH`; one you set yourself is used as it is). Reusing a directory an earlier
process had filled cut the compile to 6.2-7.0 s but the steps ran slower, alternating runs of the
same forced BERT step: fresh 50.1 and 54.9 ms (medians of 17 steps), reused 67.2 and 69.3. MindSpore's kernel-compile process,
started by the process's first fused compile, writes a log (`dsa_transfrom.log`) into its working
directory: the first `fused` block runs in the kernel directory (and changes back after), so the
process starts there and nothing lands in the user's directory. Only that first block moves the
working directory (code running in other threads meanwhile, such as a dataset reader opening
relative paths, would see it); later blocks do not.

The context flag is process-wide; `fused` turns it on only while the pass measures and while the step
compiles or runs, and restores what it was, so the user's other graphs compile as they would have.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import tempfile

from mindspore.context import _context, ms_ctx_param

# set through MindSpore's own context parameter: `set_context(enable_graph_kernel=...)` sets the same
# one but logs a deprecation warning each time (for Ascend, where `jit_level="O1"` replaces it; on CPU
# that level does not fuse in 2.10)
_FLAG = ms_ctx_param.enable_graph_kernel
CACHE_ENV = "MS_COMPILER_CACHE_PATH"
# AKG reads its own tiling repository (`repository_cpu.json`, in its package) only from under this
# directory (default: the working directory), and otherwise prints "Please set tiling repo path ..."
# once per generated kernel (62 lines for the bench BERT's step) and goes on without it; pointed at
# its package, the lines are gone and the step timed the same (50.2-54.7 vs 52.6-52.7 ms).
WHITE_LIST_ENV = "AKG_WHITE_LIST_PATH"
_STARTED = False  # a `fused` block ran in this process (MindSpore's kernel-compile process may exist)
WARM_UP_CALLS = 5  # see the module docstring: 3 sufficed in the measurements, 1 did not


def active() -> bool:
    """Whether MindSpore compiles with graph-kernel fusion now (by `fused`, or the user's own setting)."""
    return bool(_context().get_param(_FLAG))


def key_device(device: str) -> str:
    """The device part of a decision's cache key: fused layers time differently (see the module's
    docstring), so their decisions are kept apart."""
    return f"{device}+graph-kernel" if active() else device


def check_available() -> None:
    """Raise a clear error when MindSpore's graph-kernel compiler cannot run here."""
    try:
        import decorator  # noqa: F401  (AKG imports it in its compile process)
    except ImportError:
        raise ImportError("optimize={'fuse': True} compiles with MindSpore's graph-kernel fusion, whose compiler "
                          "(AKG) imports the `decorator` package, which is not installed. Install it "
                          "(`pip install decorator`; mindstep's own dependencies include it), or drop 'fuse'.") from None


def availability() -> tuple[bool, str]:
    """(usable, why) for `mindstep env`: AKG in the MindSpore install and the `decorator` package."""
    if not os.path.isdir(_akg_config_dir()):
        return False, "this MindSpore install has no graph-kernel compiler (AKG)"
    try:
        check_available()
    except ImportError:
        return False, "MindSpore's graph-kernel compiler needs the `decorator` package: pip install decorator"
    return True, "MindSpore's AKG with the decorator package: optimize={'fuse': True} can fuse"


@contextlib.contextmanager
def fused():
    """Compile (and run) with graph-kernel fusion inside the block; the flag is restored after."""
    check_available()
    if not os.environ.get(CACHE_ENV):
        kernels = tempfile.mkdtemp(prefix="mindstep-graph-kernels-")
        atexit.register(shutil.rmtree, kernels, True)
        os.environ[CACHE_ENV] = kernels
    kernels = os.environ[CACHE_ENV]
    os.makedirs(kernels, exist_ok=True)
    os.environ.setdefault(WHITE_LIST_ENV, _akg_config_dir())
    global _STARTED
    before, here, first = active(), os.getcwd(), not _STARTED
    if first:
        os.chdir(kernels)  # MindSpore starts its kernel-compile process on the first fused compile, here
    try:
        _context().set_param(_FLAG, True)
        if first:
            _warm_up()
        yield
    finally:
        _context().set_param(_FLAG, before)
        if first:
            _STARTED = True
            os.chdir(here)


@functools.lru_cache(maxsize=None)
def _akg_config_dir() -> str:
    """AKG's config directory in the MindSpore install (computed once: `fused` runs around every call
    of a fused step)."""
    import mindspore

    return os.path.join(os.path.dirname(os.path.realpath(mindspore.__file__)), "_akg", "akg", "config")


def _warm_up() -> None:
    """Compile and run a two-op fused graph `WARM_UP_CALLS` times (see the module docstring)."""
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops

    from .._context import graph_mode

    class _Chain(nn.Cell):
        def construct(self, x):
            return ops.sigmoid(x * 2.0 + 1.0) * x

    chain, x = _Chain(), ms.Tensor(np.ones((1024, 512), np.float32))
    with graph_mode():
        for _ in range(WARM_UP_CALLS):
            chain(x).asnumpy()


def maybe(on: bool):
    """`fused()` when `on`, else a block that changes nothing."""
    return fused() if on else contextlib.nullcontext()


def for_settings(optimize: dict | None):
    """The block a step's pass, compiles and calls run in, from its `optimize=` settings (None: the
    pass is off): `fused()` with `{'fuse': True}`, else a block that changes nothing."""
    return maybe(bool(optimize and optimize.get("fuse")))
