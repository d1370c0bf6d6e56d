"""Where `fit` reads its training batches, epoch after epoch, from any position.

Three kinds of `train_data`, each resumed at the exact batch a checkpoint recorded:

- a `mindspore.dataset` pipeline: one iterator serves every epoch (so each epoch gets its own
  shuffle, as `Model.train` has it); a resume seeks with MindSpore's own `Dataset.set_init_step`.
  Under data parallel it must be sharded already (`**mindstep.shard_args()` on its source).
- a callable `epoch -> batches`: called at the start of every epoch. When it returns a
  `mindspore.dataset` pipeline, a resume seeks with `.skip(n)`; any other iterable is read as below.
- any re-iterable of batches (a list, a class with `__iter__`): a sequence (`len` and indexing)
  resumes by indexing; anything else is replayed up to the position, with a warning that says how
  many batches were read again. Under data parallel rank r keeps batch r of every W consecutive
  batches (W ranks; an incomplete last group is dropped), so every rank takes the same number of
  steps.

A batch is a tuple or list of arrays/Tensors (the step's positional inputs) or a single array.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence

from .._errors import bad_type


def is_dataset(data) -> bool:
    try:
        import mindspore.dataset as ds
    except ImportError:  # pragma: no cover - MindSpore is a dependency
        return False
    return isinstance(data, ds.Dataset)


def as_args(batch) -> tuple:
    """A batch as the step's positional inputs."""
    if isinstance(batch, (tuple, list)):
        return tuple(batch)
    if isinstance(batch, dict):
        raise bad_type("a batch of train_data", batch, "a tuple of arrays/Tensors (the step's inputs, in order)",
                       "Use create_tuple_iterator's order (pass the Dataset itself), or yield tuple(batch.values()).")
    return (batch,)


class Source:
    """`train_data` (or `eval_data`) read epoch by epoch for one rank of `world`."""

    def __init__(self, data, *, rank: int = 0, world: int = 1, arg: str = "train_data"):
        self.data, self.rank, self.world, self.arg = data, rank, world, arg
        if is_dataset(data):
            self.kind = "dataset"
            self._check_sharded(data)
        elif callable(data):
            self.kind = "callable"
        elif hasattr(data, "__iter__"):
            if iter(data) is data:
                raise bad_type(arg, data, "a re-iterable (a list, a mindspore Dataset, a class with __iter__) or a "
                               "callable epoch -> batches",
                               "A generator or iterator can be read only once, so neither a second epoch nor a resume "
                               f"can read it again: pass e.g. `lambda epoch: make_batches(epoch)` as {arg}.")
            self.kind = "iterable"
        else:
            raise bad_type(arg, data, "a mindspore Dataset, a re-iterable of batches, or a callable epoch -> batches",
                           "Example: fit(step, [(x0, y0), (x1, y1)], epochs=2).")
        self._iterator = None

    def _check_sharded(self, dataset) -> None:
        if self.world > 1 and not dataset.is_sharded():
            raise ValueError(f"{self.arg} is a mindspore Dataset that is not sharded, but this job has {self.world} "
                             "data-parallel ranks: each would train on every sample. Build its source with "
                             "`**mindstep.shard_args()` (num_shards and shard_id), e.g. "
                             "ds.ImageFolderDataset(path, shuffle=True, **mindstep.shard_args()).")

    def epochs(self, epoch: int, skip: int, epochs: int | None):
        """Yield (epoch, index in the epoch, batch) from batch `skip` of `epoch` on, through epoch
        `epochs - 1` (None: forever). Indices count this rank's batches."""
        if self.kind == "dataset":
            yield from self._dataset_epochs(epoch, skip, epochs)
            return
        while epochs is None or epoch < epochs:
            yield from ((epoch, i, b) for i, b in self._one_epoch(epoch, skip))
            epoch, skip = epoch + 1, 0

    def _dataset_epochs(self, epoch: int, skip: int, epochs: int | None):
        data = self.data
        per_epoch = data.get_dataset_size()
        epoch, skip = epoch + skip // per_epoch, skip % per_epoch
        if epochs is not None and epoch >= epochs:
            return
        if epoch or skip:
            data.set_init_step(epoch * per_epoch + skip)
        # num_epochs counts from epoch 0 also after set_init_step (measured on MindSpore 2.10)
        self._iterator = data.create_tuple_iterator(num_epochs=-1 if epochs is None else epochs)
        try:
            while epochs is None or epoch < epochs:
                yield from ((epoch, i, b) for i, b in enumerate(self._iterator, start=skip))
                epoch, skip = epoch + 1, 0
        finally:
            self.close()

    def _one_epoch(self, epoch: int, skip: int):
        """(index, batch) of this rank in `epoch` from index `skip`."""
        data = self.data(epoch) if self.kind == "callable" else self.data
        if is_dataset(data):
            self._check_sharded(data)
            it = (data.skip(skip) if skip else data).create_tuple_iterator(num_epochs=1)
            return enumerate(it, start=skip)
        if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
            return self._indexed(data, skip)
        return self._replayed(data, epoch, skip)

    def _indexed(self, data: Sequence, skip: int):
        groups = len(data) // self.world
        for i in range(skip, groups):
            yield i, data[i * self.world + self.rank]

    def _replayed(self, data, epoch: int, skip: int):
        if skip:
            warnings.warn(f"resuming: reading {skip * self.world} batches of epoch {epoch} again to reach the "
                          f"checkpoint's position, since {self.arg} cannot seek. A mindspore Dataset, a sequence, or a "
                          "callable returning one of them resumes without reading them.", ResumeWarning, stacklevel=4)
        group, i = [], 0
        for batch in data:
            group.append(batch)
            if len(group) < self.world:
                continue
            if i >= skip:
                yield i, group[self.rank]
            group, i = [], i + 1

    def close(self) -> None:
        if self._iterator is not None:
            stop = getattr(self._iterator, "stop", None)
            if stop is not None:
                stop()
            self._iterator = None


class ResumeWarning(UserWarning):
    """A resume had to read batches again to reach its position."""


def one_pass(data, *, rank: int = 0, world: int = 1, arg: str = "eval_data"):
    """This rank's batches of `data`, once (evaluation): a Dataset's shard, or batches rank,
    rank + W, ... of anything else. Nothing is dropped (ranks may evaluate unequal numbers of
    batches; their results are merged once, after)."""
    source = Source(data, rank=rank, world=world, arg=arg)
    data = data(0) if source.kind == "callable" else data
    if is_dataset(data):
        source._check_sharded(data)
        it = data.create_tuple_iterator(num_epochs=1)
        try:
            yield from it
        finally:
            getattr(it, "stop", lambda: None)()
        return
    for i, batch in enumerate(data):
        if i % world == rank:
            yield batch
