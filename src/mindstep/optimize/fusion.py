"""MindSpore's graph-kernel fusion for a step's compile: `optimize={"fuse": True}`.

Why: what is left of a transformer step once its GEMMs are fast is elementwise work (GELU, LayerNorm,
softmax, residual adds), one memory-bound kernel per op on CPU. MindSpore 2.10 can fuse such chains
into one generated kernel each (graph-kernel fusion, its AKG compiler; `enable_graph_kernel`). It ships
in the CPU wheel, but its compiler imports the `decorator` package, which the wheel does not install
(without it the compile fails with "Response is empty"); mindstep's dependencies include it.

Experimental, and off by default, because its speed is not yet dependable. Measured on an Intel
Xeon family 6 model 167 (AVX-512, AMX; 2 cores), the bench BERT (hidden 128, batch 16, seq 64,
momentum), each in its own process, medians of 15-30 steps: the pass's step unfused 60.7-62.7 ms;
fused 39.2-48.8 ms in seven runs, but 98.5-202.8 ms in five others (min 58.9-125.8 within them;
`mindstep bench --model bert --modes jit,jit-opt,jit-opt-fuse --repeat 3`: 177.3 ms +-11 % against
jit-opt's 90.4, where a single run had given 49.6 against 85.7). The slow runs were those whose
decisions came from the cache rather than being measured in the same process, but not always (one
such bench run was fast), so the cause is open; the results were the same either way (the tests
compare parameters). Fused, the pass's own measurements choose differently (native GELU 1.6 ms
against its composed form's 3.2; the composed LayerNorm 1.8 against native's 3.7), which is why the
decisions are keyed by the fusion (`key_device`). On the same CPU the native BERT step ran slower
fused (133-142 ms against 90) and the pass's ResNet-18 step level (119 vs 117 ms). Measure it on
your model with `mindstep bench --modes jit-opt,jit-opt-fuse --repeat 3` before relying on it.

Each process compiles its fused kernels afresh (BERT's first call 10.9-20.8 s against 5.9 unfused)
into a temporary directory of its own, removed at exit (MindSpore keeps them under
`MS_COMPILER_CACHE_PATH`; one you set yourself is used as it is). MindSpore's kernel-compile process,
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
import os
import shutil
import tempfile

from mindspore.context import _context, ms_ctx_param

# set through MindSpore's own context parameter: `set_context(enable_graph_kernel=...)` sets the same
# one but logs a deprecation warning each time (for Ascend, where `jit_level="O1"` replaces it; on CPU
# that level does not fuse in 2.10)
_FLAG = ms_ctx_param.enable_graph_kernel
CACHE_ENV = "MS_COMPILER_CACHE_PATH"
_STARTED = False  # a `fused` block ran in this process (MindSpore's kernel-compile process may exist)


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
    global _STARTED
    before, here, first = active(), os.getcwd(), not _STARTED
    if first:
        os.chdir(kernels)  # MindSpore starts its kernel-compile process on the first fused compile, here
    try:
        _context().set_param(_FLAG, True)
        yield
    finally:
        _context().set_param(_FLAG, before)
        if first:
            _STARTED = True
            os.chdir(here)


def maybe(on: bool):
    """`fused()` when `on`, else a block that changes nothing."""
    return fused() if on else contextlib.nullcontext()
