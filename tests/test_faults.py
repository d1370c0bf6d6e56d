"""Fault tolerance: a job that loses workers restarts by itself and ends with the bits of a run never
interrupted; SIGTERM stops every rank at the same step with a checkpoint; a checkpoint resumes on
another number of ranks; a failed save keeps the previous checkpoint.

The two-worker jobs are real (`mindstep launch` over msrun, the module-level script
tests/dp_faults.py), one module fixture for all of them: a reference run, a chaos run under
`--max-restarts 5` (two SIGKILLs at seeded moments, a SIGTERM to one rank, a SIGKILL in the middle
of a save), and the two elastic cases (2 ranks -> 1 process, 1 process -> 2 ranks).
"""
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn

import mindstep
from mindstep.dist.restart import Ending, decide
from mindstep.loop import faults

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "dp_faults.py")
LAUNCH = [sys.executable, "-m", "mindstep", "launch", "--nproc", "2"]
pytestmark = pytest.mark.xdist_group("faults")


def _run(cmd, cwd, timeout=300):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="session")  # once per test process, also if xdist interleaves other modules' tests
def jobs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("faults"))
    logs = ["--log-dir", os.path.join(out, "logs")]
    _run(LAUNCH + logs + ["--", "python", SCRIPT, out, "reference"], out)
    chaos = _run(LAUNCH + logs + ["--max-restarts", "5", "--restart-delay", "0", "--", "python", SCRIPT, out, "chaos"],
                 out, timeout=600)
    _run(LAUNCH + logs + ["--", "python", SCRIPT, out, "half:elastic-1"], out)
    _run([sys.executable, SCRIPT, out, "rest:elastic-1", "2"], out)
    _run([sys.executable, SCRIPT, out, "half:elastic-2", "2"], out)
    _run(LAUNCH + logs + ["--", "python", SCRIPT, out, "rest:elastic-2"], out)
    return out, chaos


def _state(out, name):
    return np.load(os.path.join(out, f"{name}.npz"))


def test_a_job_killed_three_times_finishes_by_itself_with_the_uninterrupted_bits(jobs):
    out, chaos = jobs
    ref = _state(out, "reference_reference_rank0")
    for rank in (0, 1):
        got = _state(out, f"chaos_chaos_rank{rank}")
        assert sorted(got.files) == sorted(ref.files)  # weights, optimizer moments and counters
        for name in ref.files:
            assert np.array_equal(got[name], ref[name]), name
    err = chaos.stderr
    assert [f"restart {i} of 5" in err for i in (1, 2, 3, 4)] == [True] * 4 and "restart 5 of 5" not in err
    causes = [line.split(": ", 2)[2] for line in err.splitlines() if line.startswith("mindstep launch: restart ")]
    kinds = ["killed" if "was killed" in c else "75" if "exited with status 75" in c else c for c in causes]
    assert kinds == ["killed", "75", "killed", "killed"] and all(c.startswith("rank ") for c in causes)
    # after the kill before the first checkpoint it started over; the torn save at 9 was skipped
    resumed = [line for line in chaos.stdout.splitlines() if "mindstep.fit: resuming from" in line]
    assert len(resumed) == 3 and all("batch-0000006.ckpt" in line for line in resumed)
    assert "batch-0000009.ckpt: it has no manifest" in chaos.stdout + chaos.stderr


def test_sigterm_to_one_rank_stops_both_at_the_same_step_with_one_checkpoint(jobs):
    out, _ = jobs
    ends = [Path(out, f"chaos_end_rank{r}_1").read_text() for r in (0, 1)]
    assert ends == ["6 signal SIGTERM"] * 2  # rank 1 got it after step 5; both stopped at the check after 6


def test_a_checkpoint_resumes_on_another_number_of_ranks_with_the_same_global_batch(jobs):
    out, _ = jobs
    ref = _state(out, "reference_reference_rank0")
    for name in ("elastic-1_rest_rank0", "elastic-2_rest_rank0", "elastic-2_rest_rank1"):
        got = _state(out, name)
        for key in ref.files:
            np.testing.assert_allclose(got[key], ref[key], rtol=1e-6, atol=1e-7, err_msg=f"{name} {key}")


def _step(accumulate=1):
    ms.set_seed(0)
    net = nn.Dense(4, 1)
    return mindstep.TrainStep.from_net(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), accumulate=accumulate)


RNG = np.random.default_rng(0)
BATCHES = [(RNG.standard_normal((4, 4)).astype(np.float32), RNG.standard_normal((4, 1)).astype(np.float32))
           for _ in range(8)]


def test_resuming_on_another_world_size_is_refused_when_the_global_batch_or_position_cannot_carry_over(tmp_path):
    mindstep.fit(_step(), BATCHES, steps=4, out=tmp_path, save_every=4, progress=False)
    manifest = mindstep.checkpoint.latest(tmp_path / "ckpt")
    meta_path = mindstep.checkpoint.manifest_path(manifest)
    meta = json.loads(meta_path.read_text())
    meta["extra"]["loop"]["world"] = 2  # as if two ranks had written it
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="build the step with accumulate=2"):
        mindstep.fit(_step(), BATCHES, steps=8, out=tmp_path, resume=True, progress=False)
    data = ds.NumpySlicesDataset({"x": np.concatenate([b[0] for b in BATCHES]),
                                  "y": np.concatenate([b[1] for b in BATCHES])}, shuffle=False).batch(4)
    with pytest.raises(ValueError, match="orders its samples by the number of shards"):
        mindstep.fit(_step(2), data, steps=8, out=tmp_path, resume=True, progress=False)
    s = mindstep.fit(_step(2), BATCHES, steps=16, out=tmp_path, resume=True, progress=False)
    assert s["resumed_from"] == 8 and s["steps"] == 16


def test_a_save_that_fails_names_the_path_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    real = mindstep.checkpoint.ms.save_checkpoint
    calls = []

    def disk_full(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(mindstep.checkpoint.ms, "save_checkpoint", disk_full)
    with pytest.raises(mindstep.checkpoint.CheckpointError) as err:
        mindstep.fit(_step(), BATCHES, steps=6, out=tmp_path, save_every=2, progress=False)
    assert "batch-0000004.ckpt" in str(err.value) and "No space left on device" in str(err.value)
    assert mindstep.checkpoint.latest(tmp_path / "ckpt").name == "batch-0000002.ckpt"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["batch-0000002.ckpt", "batch-0000002.ckpt.json"]
    # on_save_error="warn": the run goes on, and the next save is complete
    calls.clear()
    with pytest.warns(mindstep.checkpoint.CheckpointWarning, match="Training goes on"):
        s = mindstep.fit(_step(), BATCHES, steps=6, out=tmp_path / "w", save_every=2, progress=False,
                         on_save_error="warn")
    assert s["steps"] == 6 and mindstep.checkpoint.latest(tmp_path / "w" / "ckpt").name == "batch-0000006.ckpt"


def test_a_manifest_that_cannot_be_written_leaves_no_payload_behind(tmp_path, monkeypatch):
    step = _step()
    step(*BATCHES[0])
    first = step.save(tmp_path / "a.ckpt")

    def fails(path, value):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(mindstep.checkpoint, "_write_json_atomic", fails)
    with pytest.raises(mindstep.checkpoint.CheckpointError, match="b.ckpt: Permission denied"):
        step.save(tmp_path / "b.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "a.ckpt.json"]
    assert mindstep.checkpoint.latest(tmp_path) == first


def test_signals_during_the_step_and_the_save_stop_after_a_complete_checkpoint(tmp_path, monkeypatch):
    real = mindstep.checkpoint._write_json_atomic

    def signalled(path, value):  # a second SIGTERM arrives while the checkpoint is written
        os.kill(os.getpid(), signal.SIGTERM)
        real(path, value)

    def cb(event, loop, value):
        if event == "step_end" and loop.done == 3:
            os.kill(os.getpid(), signal.SIGTERM)
            monkeypatch.setattr(mindstep.checkpoint, "_write_json_atomic", signalled)

    s = mindstep.fit(_step(), BATCHES, epochs=1, out=tmp_path, progress=False, callbacks=[cb], on_signal="return")
    assert s["stopped"] == "signal SIGTERM" and s["steps"] == 3
    assert mindstep.checkpoint.latest(tmp_path / "ckpt").name == "batch-0000003.ckpt"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone after fit
    with pytest.raises(SystemExit) as stop:
        mindstep.fit(_step(), BATCHES, epochs=1, out=tmp_path / "x", progress=False, callbacks=[cb])
    assert stop.value.code == faults.EXIT_RESTART


@pytest.mark.parametrize("ending, previous, retried", [
    (Ending(137, 1, "was killed"), None, True),
    (Ending(75, 0, "exited with status 75"), Ending(75, 0, "exited with status 75"), True),
    (Ending(1, 0, "exited with status 1", "ValueError: x"), None, True),
    (Ending(1, 0, "exited with status 1", "ValueError: x"), Ending(1, 0, "", "ValueError: x"), False),
    (Ending(1, 0, "exited with status 1", "ValueError: x"), Ending(1, 1, "", "ValueError: x"), True),
    (Ending(2, 0, "exited with status 2"), None, False),
    (Ending(130, None, "interrupted"), None, False),
    (Ending(75, None, "the launcher got SIGTERM", interrupted=True), None, False),
])
def test_what_is_restarted(ending, previous, retried):
    assert (decide(ending, previous) is None) == retried


TINY = ["model.widths=[4, 8]", "model.blocks=[1, 1]", "data.batch_size=240", "data.workers=1",
        "train.eval_every=100", "train.save_every=2", "train.log_every=4", "schedule.total_steps=16"]


def test_one_process_killed_twice_restarts_by_itself_to_the_uninterrupted_result(tmp_path):
    train = [sys.executable, "-m", "mindstep", "train", "--recipe", "resnet", "--steps", "16"]
    _run(train + ["--out", str(tmp_path / "full")] + TINY, str(tmp_path))
    out = tmp_path / "killed"
    job = subprocess.Popen(train + ["--out", str(out), "--max-restarts", "2", "--restart-delay", "0"] + TINY,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    kills = []

    def killer():
        for marker in ("batch-0000004.ckpt.json", "batch-0000010.ckpt.json"):
            deadline = time.time() + 240
            while not (out / "ckpt" / marker).exists() and time.time() < deadline and job.poll() is None:
                time.sleep(0.01)
            for p in psutil.Process(job.pid).children():  # the supervised process, not its data workers
                if "mindstep.dist._run" in " ".join(p.cmdline()):
                    p.kill()  # SIGKILL, as the OOM killer would
                    kills.append(marker)
                    while p.is_running() and p.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
                        time.sleep(0.01)

    thread = threading.Thread(target=killer)
    thread.start()
    _, err = job.communicate(timeout=300)
    thread.join()
    assert job.returncode == 0, err[-3000:]
    assert len(kills) == 2 and "restart 1 of 2" in err and "restart 2 of 2" in err
    full = mindstep.checkpoint.read_manifest(tmp_path / "full" / "ckpt" / "batch-0000016.ckpt")
    again = mindstep.checkpoint.read_manifest(out / "ckpt" / "batch-0000016.ckpt")
    assert full["payload"]["sha256"] == again["payload"]["sha256"]


def test_restarts_stop_after_n_naming_the_last_cause_and_set_resume_on_restarts():
    from mindstep.dist.restart import supervise

    said, envs = [], []

    def attempt(number, env):
        envs.append(env)
        return Ending(137, number % 2, "was killed")

    assert supervise(attempt, 2, 0.0, said.append) == 137
    assert envs == [{}, {"MINDSTEP_RESUME": "1"}, {"MINDSTEP_RESUME": "1"}]
    assert said[-1] == "gave up after 2 restart(s); the last cause: rank 0 was killed"
    assert said[0].startswith("restart 1 of 2 in 0 s: rank 0 was killed")
    said.clear()
    assert supervise(lambda n, env: Ending(1, 0, "exited with status 1", "KeyError: 'x'"), 5, 0.0, said.append) == 1
    assert len(said) == 2 and said[1].startswith("not restarting: rank 0 raised the same exception in two attempts")


def test_a_killed_supervisor_leaves_no_training_running(tmp_path):
    code = ("import sys; from mindstep.dist.restart import one_process; "
            "sys.exit(one_process(['-c', 'import time; time.sleep(120)'], 1, 0.0))")
    supervisor = subprocess.Popen([sys.executable, "-c", code], cwd=str(tmp_path))
    deadline = time.time() + 60
    children = []
    while not children and time.time() < deadline:
        children = [p for p in psutil.Process(supervisor.pid).children() if "mindstep.dist._run" in " ".join(p.cmdline())]
        time.sleep(0.05)
    assert children
    supervisor.kill()
    supervisor.wait()
    gone, alive = psutil.wait_procs(children, timeout=10)  # SIGTERMed by the kernel when its parent died
    assert not alive
