"""`mindstep launch`: start a data-parallel job with MindSpore's msrun, show it, and end it fast.

What it adds to msrun (measured on MindSpore 2.10, CPU: a SIGKILLed worker took msrun 33 s to
fail, an exception 45 s, both waiting for the scheduler's heartbeat timeout):
- a free master port when none is given (one node), and timeouts so a stuck collective fails
  (`MS_NODE_TIMEOUT=10`, `MS_CPU_COMM_OP_TIMEOUT=5`, `--cluster_time_out`), unless the user set them;
- every worker's output on this terminal, each line prefixed with its rank;
- the moment a worker ends badly (an exception, a non-zero exit, or a signal such as SIGKILL),
  every process of the job on this node is killed and the launcher exits non-zero, naming the
  rank and its last log lines, without waiting for msrun's timeouts;
- Ctrl-C or SIGTERM to the launcher is passed on to the workers, which get `grace_s` seconds to
  save (`mindstep.fit` does) before the job is stopped; restarts are `mindstep.dist.restart`'s;
- the same command line on several nodes (`--nnodes`, `--node-rank`, `--master-addr`,
  `--master-port`); a node with rank > 0 never starts msrun's scheduler, also when the master's
  address is this machine's (msrun decides by address, so two "nodes" on one machine would both
  try to bind the master port).

Each worker runs the user's Python command under `mindstep.dist._run`, which records how it
ended; that record, not a log line, is how a failure is told from a finish.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import psutil

TIMEOUTS = {"MS_NODE_TIMEOUT": "10", "MS_CPU_COMM_OP_TIMEOUT": "5"}
_MSRUN_FAILED = re.compile(r"Worker process (\d+) exit with exception")
POLL_S = 0.2
MSRUN_DONE_S = 1.0  # how long msrun may take to end by itself after every worker finished
TAIL_LINES = 20
# msrun's scheduler start is skipped on nodes other than 0 (see the module docstring)
_NO_SCHEDULER = ("import sys; from mindspore.parallel.cluster.process_entity import _api; "
                 "_api._ProcessManager.start_scheduler = lambda self: None; "
                 "from mindspore.parallel.cluster.run import main; sys.argv[0] = 'msrun'; sys.exit(main())")


@dataclass
class Job:
    """What one node of the job runs: validated on the host before anything starts."""
    cmd: list
    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    log_dir: str = "launch_logs"
    cluster_timeout_s: int = 60
    ranks: list = field(default_factory=list)

    def __post_init__(self):
        for name, low in (("nproc", 1), ("nnodes", 1), ("node_rank", 0), ("cluster_timeout_s", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"--{name.replace('_', '-')} must be an int >= {low}, but got {value!r}.")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"--node-rank must be in [0, {self.nnodes}) with --nnodes {self.nnodes}, but got "
                             f"{self.node_rank}. Number the nodes 0 .. {self.nnodes - 1}.")
        if not self.cmd:
            raise ValueError("give the command each worker runs after --, e.g. mindstep launch --nproc 2 -- "
                             "python train.py")
        if self.master_port is None:
            if self.nnodes > 1:
                raise ValueError("--master-port is needed with --nnodes > 1, so that every node finds the master: "
                                 "pick one free port on the master node and give it to every node's launch.")
            self.master_port = free_port(self.master_addr)
        if not 1024 <= self.master_port <= 65535:
            raise ValueError(f"--master-port must be in 1024..65535, but got {self.master_port}.")
        self.ranks = [self.node_rank * self.nproc + i for i in range(self.nproc)]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def free_port(addr: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the kernel's choice; free ports in TIME_WAIT are fine for msrun)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        return sock.getsockname()[1]


def msrun_command(job: Job, status_dir: str) -> list:
    head = [sys.executable, "-m", "mindspore.parallel.cluster.run"] if job.node_rank == 0 else \
        [sys.executable, "-c", _NO_SCHEDULER]
    return head + [
        f"--worker_num={job.nproc * job.nnodes}", f"--local_worker_num={job.nproc}",
        f"--master_addr={job.master_addr}", f"--master_port={job.master_port}", f"--node_rank={job.node_rank}",
        f"--log_dir={job.log_dir}", "--join=True", f"--cluster_time_out={job.cluster_timeout_s}",
        # a rank that does not exist: msrun tails no log (we read them, a line at a time, with its rank)
        f"--tail_worker_log={job.nproc * job.nnodes}",
        "python", "-m", "mindstep.dist._run", status_dir, *job.cmd]


def _environment() -> dict:
    env = dict(os.environ)
    for key, value in TIMEOUTS.items():
        env.setdefault(key, value)
    # msrun runs `python ...`: make it this interpreter
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("GLOG_v", "3")
    return env


class _Tail:
    """New complete lines of a growing file."""

    def __init__(self, path: str):
        self.path, self.offset, self.rest = path, 0, b""
        self.last = deque(maxlen=TAIL_LINES)

    def lines(self) -> list:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        parts = (self.rest + data).split(b"\n")
        self.rest = parts.pop()
        out = [p.decode("utf-8", errors="replace") for p in parts]
        self.last.extend(out)
        return out

    def flush(self) -> list:
        out = self.lines()
        if self.rest:
            out.append(self.rest.decode("utf-8", errors="replace"))
            self.last.append(out[-1])
            self.rest = b""
        return out


class Launch:
    def __init__(self, job: Job, out=sys.stdout, err=sys.stderr, env: dict | None = None, grace_s: float = 30.0):
        self.job, self.out, self.err = job, out, err
        self.env = dict(env or {})  # added to every worker's environment (a restart's MINDSTEP_RESUME=1)
        self.grace_s = grace_s      # how long workers may take to save after a forwarded SIGTERM/SIGINT
        self.ending = None          # how the attempt ended (mindstep.dist.restart.Ending)
        self.status_dir = os.path.join(job.log_dir, ".mindstep", f"node{job.node_rank}")
        self.tails = {r: _Tail(os.path.join(job.log_dir, f"worker_{r}.log")) for r in job.ranks}
        self.seen: dict[int, psutil.Process] = {}
        self.gone_at: dict[int, float] = {}  # rank -> when it was first seen gone without an exit record
        self.proc = None

    def _say(self, text: str) -> None:
        print(f"mindstep launch: {text}", file=self.err, flush=True)

    def _echo(self, final: bool = False) -> None:
        for rank, tail in self.tails.items():
            for line in (tail.flush() if final else tail.lines()):
                print(f"[rank {rank}] {line}", file=self.out)
        self.out.flush()

    def _track(self) -> None:
        """Remember every process of the job: msrun's descendants and each worker's process group
        (msrun starts workers in sessions of their own), so none outlives the launcher."""
        roots = [self.proc.pid] + [pid for pid in self._worker_pids().values()]
        for pid in roots:
            try:
                proc = psutil.Process(pid)
                for p in [proc] + proc.children(recursive=True):
                    self.seen.setdefault(p.pid, p)
            except psutil.NoSuchProcess:
                pass

    def _worker_pids(self) -> dict:
        pids = {}
        for rank in self.job.ranks:
            try:
                with open(os.path.join(self.status_dir, f"rank{rank}.pid")) as fh:
                    pids[rank] = int(fh.read().strip())
            except (FileNotFoundError, ValueError):
                pass
        return pids

    def _exit_record(self, rank: int):
        try:
            with open(os.path.join(self.status_dir, f"rank{rank}.exit")) as fh:
                return json.load(fh)
        except (FileNotFoundError, ValueError):
            return None

    def _msrun_culprit(self, pids: dict):
        """The rank msrun saw fail first ("Worker process <pid> exit with exception"), if it said so:
        msrun then SIGKILLs the other workers itself, so they too end without an exit record."""
        try:
            with open(os.path.join(self.job.log_dir, f"msrun_node{self.job.node_rank}.log"), errors="replace") as fh:
                text = fh.read()
        except OSError:
            return None
        by_pid = {pid: rank for rank, pid in pids.items()}
        for match in _MSRUN_FAILED.finditer(text):
            if int(match.group(1)) in by_pid:
                return by_pid[int(match.group(1))]
        return None

    def _failure(self):
        """(rank, why) of the worker whose failure ended the job, or None. A worker that reports a
        non-zero exit is that worker; among workers gone without a report (killed), the one msrun
        names, else the one seen gone first (the others may be msrun's own kills)."""
        pids = self._worker_pids()
        for rank in pids:
            record = self._exit_record(rank)
            if record is not None and record["code"] != 0:
                from .restart import exited

                self.ending = exited(record["code"], record["error"], rank)
                return rank, self.ending.why
        now = time.monotonic()
        for rank, pid in pids.items():
            if _gone(pid) and self._exit_record(rank) is None:
                self.gone_at.setdefault(rank, now)
        if not self.gone_at:
            return None
        rank = self._msrun_culprit(pids)
        if rank is None or rank not in self.gone_at:
            first = min(self.gone_at.values())
            rank = min(r for r, t in self.gone_at.items() if t == first)
        from .restart import Ending

        self.ending = Ending(137, rank, "was killed (it ended without returning: a signal such as SIGKILL, or os._exit)")
        return rank, self.ending.why

    def kill_all(self, patience_s: float = 3.0) -> None:
        """SIGTERM every process of the job on this node, then SIGKILL what is left after `patience_s`."""
        if self.proc is not None and self.proc.poll() is None:
            self._track()
        procs = [p for p in self.seen.values() if p.pid != os.getpid()]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                try:
                    os.killpg(os.getpgid(p.pid), sig)
                except (ProcessLookupError, PermissionError, OSError):
                    pass
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
            _, alive = psutil.wait_procs(procs, timeout=patience_s)
            if not alive:
                break
            procs = alive
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def run(self) -> int:
        job = self.job
        os.makedirs(self.status_dir, exist_ok=True)
        for name in os.listdir(self.status_dir):  # a previous run's records
            os.remove(os.path.join(self.status_dir, name))
        for rank in job.ranks:
            path = os.path.join(job.log_dir, f"worker_{rank}.log")
            if os.path.exists(path):
                os.remove(path)
        self._say(f"{job.nproc} worker(s) on node {job.node_rank} of {job.nnodes} (ranks {job.ranks[0]}.."
                  f"{job.ranks[-1]} of {job.nproc * job.nnodes}), master {job.master_addr}:{job.master_port}, "
                  f"logs in {job.log_dir}")
        interrupted = []
        previous = {s: signal.signal(s, lambda sig, frame: interrupted.append(sig)) for s in (signal.SIGINT, signal.SIGTERM)}
        msrun_log = open(os.path.join(job.log_dir, f"msrun_node{job.node_rank}.log"), "wb")
        try:
            self.proc = subprocess.Popen(msrun_command(job, self.status_dir), stdout=msrun_log,
                                         stderr=subprocess.STDOUT, env={**_environment(), **self.env},
                                         start_new_session=True)
            return self._watch(interrupted)
        finally:  # after a clean finish only msrun's own processes are left: they get less patience
            self.kill_all(0.5 if self.ending is None and self._all_finished() else 3.0)
            self._echo(final=True)
            msrun_log.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop_gracefully(self, signum: int) -> int:
        """The launcher was told to stop: the signal goes on to every worker (`mindstep.fit` finishes its
        step, saves and exits), which get `grace_s` seconds before the job is killed. Returns the
        workers' common exit status after SIGTERM (75 from `mindstep.fit`: saved, continue later; else
    128 + the signal), 130 after SIGINT."""
        from .restart import Ending

        name = signal.Signals(signum).name
        self._say(f"{name}{' (interrupted)' if signum == signal.SIGINT else ''}: passing it to every worker; "
                  f"they save and exit (up to {self.grace_s:g} s)")
        for pid in self._worker_pids().values():
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + self.grace_s
        records = []
        while time.monotonic() < deadline:
            self._echo()
            records = [self._exit_record(r) for r in self.job.ranks]
            if all(r is not None for r in records) or all(_gone(p) for p in self._worker_pids().values()):
                break
            time.sleep(POLL_S)
        codes = {r["code"] for r in records if r is not None}
        if signum == signal.SIGINT:
            code = 130
        else:  # the workers' common status (75: mindstep.fit saved and wants to continue), else 128 + signal
            code = codes.pop() if len(codes) == 1 and all(r is not None for r in records) else 128 + signum
        self.ending = Ending(code, None, f"the launcher got {name}", interrupted=True)
        return code

    def _all_finished(self) -> bool:
        return all((r := self._exit_record(rank)) is not None and r["code"] == 0 for rank in self.job.ranks)

    def _watch(self, interrupted) -> int:
        job = self.job
        while True:
            time.sleep(POLL_S)
            self._track()
            self._echo()
            if interrupted:
                return self._stop_gracefully(interrupted[0])
            failed = self._failure()
            if failed is not None:
                rank, why = failed
                self.kill_all()
                self._echo(final=True)
                last = "\n".join(f"    {line}" for line in self.tails[rank].last) or "    (no output)"
                self._say(f"rank {rank} {why}; stopped the job. Last lines of {self.tails[rank].path}:\n{last}")
                return 1
            if self._all_finished():
                try:  # every worker has finished: msrun and its scheduler have nothing left to do (they
                    # took ~6 s more to notice on one CPU; what is left of them is stopped in run())
                    self.proc.wait(timeout=MSRUN_DONE_S)
                except subprocess.TimeoutExpired:
                    pass
                return 0
            code = self.proc.poll()
            if code is not None:  # msrun ended before every worker reported
                failed = self._failure()
                self._echo(final=True)
                missing = [r for r in job.ranks if self._exit_record(r) is None]
                log = os.path.join(job.log_dir, f"msrun_node{job.node_rank}.log")
                self._say(f"msrun exited with status {code} before rank(s) {missing} finished"
                          + (f" (rank {failed[0]} {failed[1]})" if failed else "") + f"; see {log}")
                return code or 1


def launch(cmd, **settings) -> int:
    """Run `cmd` (a Python command: `["python", "train.py", ...]`) on `nproc` workers of this node
    through msrun; returns the exit status (0 when every local worker finished with status 0).

    Example:
        `launch(["python", "train.py"], nproc=2)`, what `mindstep launch --nproc 2 -- python train.py` runs.
    """
    return Launch(Job(cmd=list(cmd), **settings)).run()
