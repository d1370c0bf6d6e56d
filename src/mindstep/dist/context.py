"""Which worker this process is: `init_distributed()` under msrun, and what follows from it.

msrun (and `mindstep launch`, which wraps it) starts every worker with `MS_ROLE=MS_WORKER` and a
scheduler with `MS_ROLE=MS_SCHED`, all running the same script. `init_distributed()` joins them:
MindSpore's `communication.init()` (the backend follows the device: HCCL, NCCL, or mccl on CPU)
and the data-parallel context. Run plainly (`python train.py`) it does nothing and says rank 0 of
1, so one script serves both.
"""
from __future__ import annotations

import os


def _launched() -> bool:
    return os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED")


def _initialized() -> bool:
    from mindspore.communication.management import GlobalComm

    return bool(GlobalComm.INITED)


def init_distributed() -> tuple[int, int]:
    """Join the data-parallel job this process was launched into; returns `(rank, world_size)`.

    Under msrun / `mindstep launch`: initialises MindSpore's communication (once; a second call
    returns the same answer) and sets `ParallelMode.DATA_PARALLEL` with `gradients_mean=True`, so
    MindSpore's own wrappers (`Model`, `TrainOneStepCell`) average too. Started any other way it
    does nothing and returns `(0, 1)`. msrun's scheduler process runs the script as well and exits
    inside this call, so code before it runs once more than the workers.

    Example:
        `rank, world = mindstep.init_distributed()` at the top of the script; a
        `mindstep.TrainStep(forward, opt)` built after it averages across the `world` ranks.
    """
    if not _launched():
        return 0, 1
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank, init

    if not _initialized():
        init()
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return get_rank(), get_group_size()


def rank() -> int:
    """This worker's rank (0 when not distributed)."""
    if not (_launched() and _initialized()):
        return 0
    from mindspore.communication import get_rank

    return get_rank()


def world_size() -> int:
    """How many workers train together (1 when not distributed)."""
    if not (_launched() and _initialized()):
        return 1
    from mindspore.communication import get_group_size

    return get_group_size()


def is_main() -> bool:
    """True on rank 0 (and when not distributed): the process that logs, shows progress and saves."""
    return rank() == 0


def shard_args(rank_: int | None = None, world: int | None = None) -> dict:
    """`num_shards`/`shard_id` for a `mindspore.dataset` source, so each rank reads its own part:
    `{}` when not distributed. The shards are disjoint and cover the data (MindSpore pads an
    uneven tail by wrapping around).

    Example:
        `ds.NumpySlicesDataset({"x": X, "y": Y}, shuffle=True, **mindstep.shard_args())`.
    """
    world = world_size() if world is None else world
    rank_ = rank() if rank_ is None else rank_
    if world == 1:
        return {}
    if not 0 <= rank_ < world:
        raise ValueError(f"`rank_` must be in [0, {world}), but got {rank_}. Pass this worker's rank.")
    return {"num_shards": world, "shard_id": rank_}
