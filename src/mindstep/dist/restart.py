"""Restarts: a job whose worker died, or that stopped on a signal asking for a restart, is started
again with resume on, up to N times (`mindstep launch --max-restarts N`, `mindstep train
--max-restarts N`).

Each attempt ends in an `Ending`: the exit status, the rank that ended it, why, and the Python
exception it raised, if any. What is retried and what is not (`decide`):

- retried: a worker killed by a signal (SIGKILL from the OOM killer, a node reboot), a worker that
  exited with `mindstep.loop.faults.EXIT_RESTART` (75: it saved on SIGTERM and asks to continue),
  any other failure the first time it happens;
- not retried: the launcher itself told to stop (SIGTERM or Ctrl-C to `mindstep launch`: it
  passes the signal on, the workers save, and the job ends with their status, 75 after SIGTERM, so
  a scheduler can requeue it), an interrupt (status 130), status 2 (a usage or config error: the same
  command fails the same way), and the same exception from the same rank in two attempts in a row
  (a bug in the step or the data, not a fault of the machine).

A restart runs the same command with `MINDSTEP_RESUME=1`, which makes `mindstep.fit` (and so
`mindstep train`) continue from the newest complete checkpoint, or start over when there is none
yet; `fit` prints the checkpoint it resumes from on rank 0.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

NOT_RETRIED = {2: "exit status 2 (a usage or config error: a restart would fail the same way)",
               130: "interrupted (exit status 130): stopping was asked for"}


@dataclass
class Ending:
    """How one attempt of the job ended."""

    code: int
    rank: int | None = None
    why: str = ""
    error: str | None = None
    interrupted: bool = False  # the launcher itself was told to stop


def decide(ending: Ending, previous: Ending | None) -> str | None:
    """Why `ending` must not be retried, or None to retry it."""
    if ending.interrupted:
        return (f"{ending.why}: the job stops here (run the same command again to continue; "
                "mindstep.fit resumes with MINDSTEP_RESUME=1, mindstep train with --resume)")
    if ending.code in NOT_RETRIED:
        return NOT_RETRIED[ending.code]
    if ending.error and previous is not None and previous.error == ending.error and previous.rank == ending.rank:
        return f"rank {ending.rank} raised the same exception in two attempts in a row ({ending.error[:200]})"
    return None


def supervise(attempt, max_restarts: int, delay_s: float, say) -> int:
    """Run `attempt(number, env) -> Ending` until it succeeds, cannot be retried, or `max_restarts`
    restarts are spent; returns the exit status."""
    previous = None
    for number in range(max_restarts + 1):
        env = {"MINDSTEP_RESUME": "1"} if number else {}
        ending = attempt(number, env)
        if ending.code == 0:
            return 0
        where = f"rank {ending.rank} " if ending.rank is not None else ""
        reason = decide(ending, previous)
        if reason is not None:
            say(f"not restarting: {reason}")
            return ending.code
        if number == max_restarts:
            say(f"gave up after {max_restarts} restart(s); the last cause: {where}{ending.why}")
            return ending.code
        say(f"restart {number + 1} of {max_restarts} in {delay_s:g} s: {where}{ending.why}; the job starts again "
            "with MINDSTEP_RESUME=1 (mindstep.fit resumes from the newest complete checkpoint)")
        time.sleep(delay_s)
        previous = ending
    return 1  # pragma: no cover - the loop always returns


def one_process(cmd: list, max_restarts: int, delay_s: float, say=None) -> int:
    """`cmd` (a Python command) in a child process, restarted as `supervise` decides."""
    say = say or (lambda text: print(f"mindstep: {text}", file=sys.stderr, flush=True))
    status_dir = tempfile.mkdtemp(prefix="mindstep_restart_")

    def attempt(number, extra_env):
        record = os.path.join(status_dir, f"attempt{number}.exit")
        env = {**os.environ, **extra_env, "MINDSTEP_EXIT_RECORD": record}
        child = subprocess.Popen([sys.executable, "-m", "mindstep.dist._run", status_dir, *cmd], env=env,
                                 preexec_fn=_stop_with_parent if sys.platform.startswith("linux") else None)
        told = []  # SIGTERM or SIGINT to this supervisor: passed on, and the job is not restarted

        def pass_on(signum, frame):
            told.append(signum)
            child.send_signal(signum)

        previous = {s: signal.signal(s, pass_on) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            code = child.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        ending = ending_of(code, record)
        if told:
            ending.interrupted, ending.why = True, f"the supervisor got {signal.Signals(told[0]).name}"
        return ending

    try:
        return supervise(attempt, max_restarts, delay_s, say)
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)  # the attempts' exit records


def _stop_with_parent() -> None:
    """In the child, before it runs: SIGTERM it when its supervisor dies (Linux `PR_SET_PDEATHSIG`),
    so a killed supervisor leaves no training running on (it saves and exits as on any SIGTERM)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def ending_of(code: int, record_path: str, rank: int | None = None) -> Ending:
    """The Ending of a process that exited with `code` (negative: killed by that signal) and may have
    left an exit record (`mindstep.dist._run`)."""
    import json

    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return Ending(128 - code, rank, f"was killed by {name}")
    error = None
    try:
        with open(record_path) as fh:
            error = json.load(fh).get("error")
    except (OSError, ValueError):
        pass
    return exited(code, error, rank)


def exited(code: int, error: str | None, rank: int | None = None) -> Ending:
    """The Ending of a process that returned `code`, with the exception it recorded, if any."""
    from ..loop.faults import EXIT_RESTART

    lines = (error or "").strip().splitlines()
    why = f"exited with status {code}" + (" (stopped on a signal and saved)" if code == EXIT_RESTART else
                                          f" ({lines[0][:200]})" if lines else "")
    return Ending(code, rank, why, error)
