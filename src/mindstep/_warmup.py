"""How many untimed calls a step timing starts after, and when that warm-up may end early.

Light on purpose (no MindSpore import): the command line's help text reads it.
"""
from __future__ import annotations

# The bench's default warm-up: the compiling call, then the 5 calls each MindSpore CPU kernel runs on
# one thread before it searches its thread count.
# Measurements: docs/benchmarks.md#method
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
