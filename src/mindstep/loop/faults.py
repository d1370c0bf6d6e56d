"""What `mindstep.fit` does when the job is told to stop, and how a restarted job finds its place.

Stop signals (SIGTERM and SIGINT by default; add e.g. SIGUSR1 for a scheduler that warns before it
preempts): the handler only records the signal, so the step in flight finishes, and a second signal
during the save that follows cannot tear it. At the next check the loop stops, saves a complete
checkpoint and, with ``on_signal="exit"`` (the default), exits with:

- `EXIT_RESTART` (75, `EX_TEMPFAIL`: "try again") after SIGTERM or a signal you added: the state is
  saved and the job wants to continue; `mindstep launch --max-restarts` / `mindstep train
  --max-restarts` start it again with resume on;
- `EXIT_INTERRUPTED` (130, as a shell reports Ctrl-C) after SIGINT: saved, and not restarted.

One process checks after every step. Under data parallel the ranks agree: every `log_every` steps
each rank adds its flag to one host all-reduce, so all ranks stop after the same step (a rank that
got the signal waits at most `log_every` steps), rank 0 writes the checkpoint, and no rank exits
before it is complete (a second all-reduce), so none is left waiting in a collective its peers left.

`MINDSTEP_RESUME=1` in the environment (what the restarts set) turns `fit(resume=False)` into
``resume="auto"``: continue from the newest complete checkpoint when there is one, else start.
"""
from __future__ import annotations

import os
import signal
import threading

import numpy as np

EXIT_RESTART = 75
EXIT_INTERRUPTED = 130
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RESUME_ENV = "MINDSTEP_RESUME"


def resume_mode(resume):
    """`resume` as given, or "auto" when it is False and the restarts set `MINDSTEP_RESUME=1`."""
    if resume is False and os.environ.get(RESUME_ENV) == "1":
        return "auto"
    return resume


def exit_code(signum: int) -> int:
    return EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_RESTART


class StopSignals:
    """Records the stop signals while `fit` runs (a context manager; the previous handlers come
    back after). `should_stop(done, world, check_every)` says whether every rank stops now."""

    def __init__(self, signals):
        self.signals = tuple(signals or ())
        for s in self.signals:
            if not isinstance(s, (int, signal.Signals)):
                from .._errors import bad_type

                raise bad_type("stop_signals", s, "signal numbers such as signal.SIGTERM",
                               "Example: stop_signals=(signal.SIGTERM, signal.SIGINT, signal.SIGUSR1).")
        self.received: list = []
        self.agreed: int | None = None
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._record)
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
        return False

    def _record(self, signum, frame):  # no exception here: the step and the save finish
        self.received.append(signum)

    def should_stop(self, done: int, world: int, check_every: int) -> bool:
        """Whether to stop after step `done`: this process's signal (one process), or any rank's,
        agreed by an all-reduce every `check_every` steps (data parallel)."""
        if world == 1:
            if self.received:
                self.agreed = self.received[0]
            return bool(self.received)
        if done % check_every:
            return False
        from .evaluate import _all_reduce

        mine = float(self.received[0]) if self.received else 0.0
        flags = np.zeros(world)
        from ..dist import context

        flags[context.rank()] = mine
        summed = _all_reduce(flags)
        raised = [int(v) for v in summed if v]
        if raised:
            self.agreed = raised[0]
        return bool(raised)

    @staticmethod
    def barrier(world: int) -> None:
        """Every rank waits here until all have arrived (after rank 0's save)."""
        if world > 1:
            from .evaluate import _all_reduce

            _all_reduce(np.zeros(1))
