"""Swapping a sub-Cell of a network in place, for the passes that rewrite layers (the composed
operators, resumable dropout). A base module: it imports nothing from mindstep."""
from __future__ import annotations

from mindspore import nn


def replace_cell(root: nn.Cell, name: str, new: nn.Cell) -> None:
    """Put `new` where `root`'s sub-Cell `name` (a `cells_and_names()` name) is.

    The new Cell's Parameters keep the names they have: the parent's `_cells` is written directly,
    because `Cell.__setattr__` would re-prefix them (a replacement that reuses the old layer's
    Parameters must keep their names, so checkpoints and optimizers still match)."""
    parent_name, _, attr = name.rpartition(".")
    parent = root if not parent_name else dict(root.cells_and_names())[parent_name]
    parent._cells[attr] = new
    if isinstance(parent, (nn.SequentialCell, nn.CellList)) and hasattr(parent, "cell_list"):
        parent.cell_list = list(parent._cells.values())
