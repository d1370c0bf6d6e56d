"""How many untimed calls a step timing starts after, and when that warm-up may end early.

Light on purpose (no MindSpore import): the command line's help text reads it.
"""
from __future__ import annotations

# `mindstep bench --warmup`'s default: the compiling call, then MindSpore's CPU kernels' search for
# their thread count. A CPU kernel that splits its work over threads by `ParallelLaunchAutoSearch`
# (elementwise arithmetic, GeLU and its gradient, BiasAddGrad, Transpose, reductions; not MatMul or
# oneDNN's convolutions) runs its first 5 calls as one block, on one thread, then times 2, 4, ... blocks
# 5 calls each and keeps the fastest (MindSpore's `cpu_kernel.cc`, AVG_COUNT = 5; each kernel of a graph
# counts its own calls). Measured on an Intel Xeon family 6 model 167 (2 cores; per call, the step
# compiled apart first): the bench BERT `jit` step 105-112 ms for calls 2-5 and 69-80 ms from call 6,
# `jit-opt` 68-69 then 43-54 ms; ResNet-18 `jit-opt` 118-131 then 90-94 ms, `jit` (native convs) 1135-1170
# then 1083-1130 ms. Profiled over calls 2-5 against 7-10 (`jit`): GeLUGrad 78.6 -> 38.2 ms, GeLU 66.0 ->
# 36.0, BiasAddGrad 19.1 -> 11.5, Transpose 17.3 -> 10.5, MatMul 62.7 -> 62.3, LayerNormGrad 36.2 ->
# 33.1. With one warm-up call a run timed that first phase, and the modes by how much of each step those
# kernels are, not as a training run's later steps run.
KERNEL_SEARCH_CALLS = 5
DEFAULT_WARMUP = 1 + KERNEL_SEARCH_CALLS


def warmup_ends(times: list, k: int, max_seconds: float | None) -> bool:
    """Whether the warm-up may end early after these calls (seconds each): the calls after the first
    (the compiling one) add up to `max_seconds`, and they end a whole window of `k` calls, at least
    one. A step that takes minutes (ResNet-50 at 224 px natively) would otherwise spend
    `DEFAULT_WARMUP` of them before its first timed call; its kernels' search is small beside it."""
    return (max_seconds is not None and len(times) >= max(k, 2) and len(times) % k == 0
            and sum(times[1:]) >= max_seconds)


def warmup_why(done: int, asked: int, times: list, max_seconds: float) -> str:
    return (f"{done} of {asked} warm-up calls: the {done - 1} after the first took {sum(times[1:]):.1f} s, "
            f"over --max-seconds {max_seconds:g}")


def warmup_after(times: list, warmup: int, k: int, max_seconds: float | None, settings: dict) -> int:
    """The warm-up (leading calls left untimed) after these calls: `warmup`, or the calls so far once
    `warmup_ends`, in which case `settings["warmup_why"]` says so."""
    if len(times) < warmup and warmup_ends(times, k, max_seconds):
        settings["warmup_why"] = warmup_why(len(times), warmup, times, max_seconds)
        return len(times)
    return warmup
