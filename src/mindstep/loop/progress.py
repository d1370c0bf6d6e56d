"""The progress bar `fit` shows on rank 0: batches, loss, data-wait share and time left (rich)."""
from __future__ import annotations


class Progress:
    def __init__(self, total: int | None, start: int, enabled: bool):
        self.bar = None
        if not enabled:
            return
        from rich.progress import BarColumn, Progress as _Bar, TextColumn, TimeRemainingColumn

        self.bar = _Bar(TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TextColumn("loss {task.fields[loss]}"), TextColumn("data wait {task.fields[wait]}"),
                        TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=total, completed=start, loss="-", wait="-")
        self.bar.start()

    def update(self, done: int, loss: float, wait_share: float) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done, loss=f"{loss:.4f}", wait=f"{wait_share:.0%}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
