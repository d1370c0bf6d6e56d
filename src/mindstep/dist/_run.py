"""The program `mindstep launch` gives msrun: runs the user's Python command in this process and
leaves a record of how it ended, which msrun's own logs do not give reliably.

    python -m mindstep.dist._run STATUS_DIR python train.py --lr 0.1
    python -m mindstep.dist._run STATUS_DIR -m mypackage.train

A worker writes `rank<R>.pid` when it starts and `rank<R>.exit` (JSON: code, error) when it ends
by returning, `sys.exit` or an exception; a worker killed by a signal leaves no `.exit`, which is
how the launcher tells it died. msrun's scheduler runs the same command (and exits inside
`init()`); it writes nothing. A single process supervised by `mindstep train --max-restarts` writes
its record where `MINDSTEP_EXIT_RECORD` says.
"""
from __future__ import annotations

import json
import os
import runpy
import shutil
import sys
import traceback


def _target(cmd: list[str]) -> tuple[str, str, list[str]]:
    """(kind, what, argv) for `python x.py ...`, `python -m mod ...`, `python -c code`, `x.py ...`
    or a Python console script on PATH (`mindstep bench ...`)."""
    if cmd and os.path.basename(cmd[0]).startswith("python"):
        cmd = cmd[1:]
    if not cmd:
        raise SystemExit("mindstep launch: give the command to run after --, e.g. -- python train.py")
    if cmd[0] == "-m" and len(cmd) > 1:
        return "module", cmd[1], [cmd[1]] + cmd[2:]
    if cmd[0] == "-c" and len(cmd) > 1:
        return "code", cmd[1], ["-c"] + cmd[2:]
    path = cmd[0] if os.path.exists(cmd[0]) else shutil.which(cmd[0])
    if path is None:
        raise SystemExit(f"mindstep launch: no such file or command: {cmd[0]}")
    return "path", path, [path] + cmd[1:]


def main(argv: list[str]) -> int:
    status_dir, cmd = argv[0], argv[1:]
    worker = os.environ.get("MS_ROLE") == "MS_WORKER"
    rank = os.environ.get("RANK_ID", os.environ.get("MS_NODE_ID", "x"))
    # one process under `mindstep train --max-restarts` (mindstep.dist.restart): its record's path
    record = os.environ.pop("MINDSTEP_EXIT_RECORD", None)
    if worker:
        with open(os.path.join(status_dir, f"rank{rank}.pid"), "w") as fh:
            fh.write(str(os.getpid()))
        record = os.path.join(status_dir, f"rank{rank}.exit")
    kind, what, sys.argv = _target(cmd)
    code, error = 0, None
    try:
        if kind == "module":
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        elif kind == "code":
            exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(what)))
            runpy.run_path(what, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            error = str(stop.code)
            print(error, file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - recorded, and printed as Python would
        code, error = 1, "".join(traceback.format_exception_only(type(exc), exc)).strip()
        tb = exc.__traceback__
        while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                                  or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
            tb = tb.tb_next  # the user's frames only, as `python train.py` shows them
        traceback.print_exception(type(exc), exc, tb)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if record is not None:
            with open(record, "w") as fh:
                json.dump({"code": code, "error": error}, fh)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
