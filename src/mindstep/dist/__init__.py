"""Data-parallel training on MindSpore's own engine (msrun; HCCL on Ascend, NCCL on GPU, mccl on CPU).

What lives here: `context` (is this process one of several workers, which rank, the dataset
shard), `reduce` (the step's stage 7: one all-reduce of the gradients per applied update) and
`launch` (`mindstep launch`, a wrapper around msrun that ends a broken job fast). This package
imports MindSpore and the step's error helpers (`mindstep._errors`), never the step itself.
"""
from .context import init_distributed, is_main, rank, shard_args, world_size

__all__ = ["init_distributed", "is_main", "rank", "shard_args", "world_size"]
