"""Data parallel on msrun: two CPU workers end equal to one process on the full batch, with one
reduction per update; `mindstep launch` ends a broken job fast and leaves nothing running.

The jobs are real: `mindstep launch --nproc 2` over MindSpore's msrun (mccl on CPU), running the
module-level scripts tests/dp_cases.py and tests/dp_fail.py as a user would. They share one xdist
group so that only one job at a time competes for this machine's two cores.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCH = [sys.executable, "-m", "mindstep", "launch"]
CASES = ("plain", "accum", "overflow", "count")
pytestmark = pytest.mark.xdist_group("dist")


def _launch(args, out, timeout=120, **kw):
    return subprocess.run(LAUNCH + args, capture_output=True, text=True, timeout=timeout, cwd=out, **kw)


def _left_running(marker: str) -> list:
    """Processes whose command line mentions `marker` (this test's folder)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.fixture(scope="module")
def single_node(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dp"))
    done = _launch(["--nproc", "2", "--log-dir", os.path.join(out, "logs"), "--",
                    "python", os.path.join(HERE, "dp_cases.py"), out], out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ref = subprocess.run([sys.executable, os.path.join(HERE, "dp_cases.py"), out, "--reference"],
                         capture_output=True, text=True, timeout=120)
    assert ref.returncode == 0, ref.stderr[-3000:]
    return out, done


def _load(out, case, who):
    return np.load(os.path.join(out, f"{case}_{who}.npz"))


@pytest.mark.parametrize("case", CASES)
def test_two_workers_equal_one_process_on_the_full_batch(single_node, case):
    """plain; accumulate=2 (rank 1 starts its first micro-step only after rank 0 has finished its
    own, so a micro-step that communicated would have hung the job); dynamic loss scale with an
    overflow on rank 1 only; normalize="count" with 3 tokens per row on rank 0 and 5 on rank 1."""
    out, _ = single_node
    r0, r1, ref = (_load(out, case, w) for w in ("rank0", "rank1", "ref"))
    params = [k for k in ref.files if not k.startswith("metric_")]
    assert params
    for name in params:
        assert np.array_equal(r0[name], r1[name]), name  # every rank ends with the same bits
        np.testing.assert_allclose(r0[name], ref[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.array_equal(r0["metric_applied"], r1["metric_applied"])


def test_an_overflow_on_one_rank_skips_the_update_and_shrinks_the_scale_on_every_rank(single_node):
    out, _ = single_node
    for who in ("rank0", "rank1"):
        m = _load(out, "overflow", who)
        assert m["metric_applied"].tolist() == [1.0, 0.0, 1.0]
        assert m["metric_loss_scale"].tolist() == [65536.0, 32768.0, 32768.0]


def test_micro_steps_do_not_communicate(single_node):
    out, _ = single_node
    for who in ("rank0", "rank1"):
        assert _load(out, "accum", who)["metric_applied"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert os.path.exists(os.path.join(out, "accum_rank0_micro_done"))


def test_fit_shards_the_batches_and_merges_the_evaluation_over_every_ranks_samples(single_node):
    out, _ = single_node
    r0, r1, ref = (_load(out, "fit", w) for w in ("rank0", "rank1", "ref"))
    assert int(r0["steps"]) == int(r1["steps"]) == int(ref["steps"]) == 2
    for name in ref.files:
        np.testing.assert_allclose(r0[name], ref[name], rtol=1e-5, atol=1e-6, err_msg=name)
        assert np.array_equal(r0[name], r1[name]), name


def test_shards_are_disjoint_and_cover_the_data(single_node):
    out, _ = single_node
    r0, r1 = (np.load(os.path.join(out, f"shards_rank{r}.npy")) for r in (0, 1))
    assert not set(r0) & set(r1) and sorted(set(r0) | set(r1)) == list(range(10))


def test_every_output_line_carries_its_rank(single_node):
    _, done = single_node
    assert "[rank 0] rank 0 of 2: done" in done.stdout and "[rank 1] rank 1 of 2: done" in done.stdout


def test_two_nodes_on_one_machine_give_the_single_node_parameters(single_node, tmp_path):
    out, _ = single_node
    port = subprocess.run([sys.executable, "-c", "from mindstep.dist.launch import free_port; print(free_port())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    common = ["--nproc", "1", "--nnodes", "2", "--master-port", port, "--log-dir", str(tmp_path / "logs")]
    script = ["--", "python", os.path.join(HERE, "dp_cases.py"), str(tmp_path)]
    nodes = [subprocess.Popen(LAUNCH + common + ["--node-rank", str(r)] + script, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)) for r in (1, 0)]
    results = [n.communicate(timeout=120) for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], results
    for case in CASES:
        for rank in (0, 1):
            two, one = _load(str(tmp_path), case, f"rank{rank}"), _load(out, case, f"rank{rank}")
            for name in one.files:
                assert np.array_equal(two[name], one[name]), (case, rank, name)


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_launch_exits_fast_naming_the_rank_when_a_worker_dies(tmp_path, how):
    t0 = time.time()
    done = _launch(["--nproc", "2", "--log-dir", str(tmp_path / "logs"), "--", "python",
                    os.path.join(HERE, "dp_fail.py"), str(tmp_path), how], str(tmp_path))
    ended = time.time()
    failed_at = float((tmp_path / "failed_at").read_text())
    assert done.returncode != 0
    assert ended - failed_at < 20, f"{ended - failed_at:.1f} s from the failure to the launcher's exit"
    assert "rank 1" in done.stderr
    if how == "raise":
        assert "exited with status 1 (RuntimeError: rank 1 failed on purpose at step 3)" in done.stderr
        assert "Traceback" in done.stderr  # the rank's last log lines
    else:
        assert "was killed" in done.stderr
    assert not _left_running(str(tmp_path)), f"left running after {ended - t0:.0f} s"


def test_ctrl_c_stops_every_worker(tmp_path):
    job = subprocess.Popen(LAUNCH + ["--nproc", "2", "--log-dir", str(tmp_path / "logs"), "--", "python",
                                     os.path.join(HERE, "dp_fail.py"), str(tmp_path), "sleep"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    deadline = time.time() + 90
    while not all((tmp_path / f"sleeping_{r}").exists() for r in (0, 1)) and time.time() < deadline:
        time.sleep(0.2)
    assert time.time() < deadline, job.communicate(timeout=10)
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=30)
    assert job.returncode == 130 and "interrupted" in err
    assert not _left_running(str(tmp_path))


@pytest.mark.parametrize("args, message", [
    (["--nproc", "2", "--nnodes", "2", "--", "python", "x.py"], "--master-port is needed with --nnodes > 1"),
    (["--nproc", "2", "--nnodes", "2", "--node-rank", "2", "--master-port", "8118", "--", "python", "x.py"],
     "--node-rank must be in [0, 2)"),
    (["--nproc", "2"], "give the command each worker runs after --"),
], ids=["no-port", "node-rank", "no-command"])
def test_launch_refuses_bad_arguments_before_starting_anything(tmp_path, args, message):
    done = _launch(args, str(tmp_path), timeout=60)
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "launch_logs").exists()


def test_bench_nproc_reports_per_rank_and_total_throughput(tmp_path):
    out = tmp_path / "dp.json"
    done = subprocess.run([sys.executable, "-m", "mindstep", "bench", "--model", "mlp", "--nproc", "2", "--steps",
                           "3", "--warmup", "1", "--json", str(out)], capture_output=True, text=True, timeout=180,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [r["rank"] for r in result["ranks"]] == [0, 1] and result["baseline"]["world_size"] == 1
    assert all(r["world_size"] == 2 and r["reduce"] == "mean" and r["samples_per_s"] > 0 for r in result["ranks"])
    assert result["total_samples_per_s"] == pytest.approx(sum(r["samples_per_s"] for r in result["ranks"]))
    for line in ("rank 0", "rank 1", "total", "1 process", "scaling:", "CPU:"):
        assert line in done.stdout


def test_one_process_is_rank_0_of_1_and_reads_everything():
    import mindstep

    assert mindstep.init_distributed() == (0, 1)
    assert mindstep.shard_args() == {} and mindstep.is_main()


def test_shard_args_give_disjoint_shards_that_cover_the_data():
    import mindspore.dataset as ds

    import mindstep

    seen = []
    for rank in range(3):
        data = ds.NumpySlicesDataset({"id": np.arange(9, dtype=np.int32)}, shuffle=True,
                                     **mindstep.shard_args(rank, 3))
        seen.append({int(r["id"]) for r in data.create_dict_iterator(output_numpy=True)})
    assert sum(len(s) for s in seen) == 9 and set().union(*seen) == set(range(9))
    with pytest.raises(ValueError, match=r"must be in \[0, 3\)"):
        mindstep.shard_args(3, 3)


def test_reduce_is_validated_on_the_host():
    from mindspore import nn

    import mindstep

    net = nn.Dense(2, 1)
    loss_fn = nn.MSELoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    opt = nn.SGD(net.trainable_params(), 0.1)
    with pytest.raises(ValueError, match="mindstep launch --nproc N") as err:
        mindstep.TrainStep(forward, opt, reduce="mean")
    assert "'mean'" in str(err.value)
    with pytest.raises(ValueError, match="'auto', 'mean', 'sum'"):
        mindstep.TrainStep(forward, opt, reduce="max")
    for reduce in ("auto", None):
        step = mindstep.TrainStep(forward, opt, reduce=reduce)
        assert step.reduce is None and step.world_size == 1
        assert step.metric_scopes["loss"] == "this process"


def test_the_failing_rank_is_named_even_when_msrun_has_killed_the_others(tmp_path):
    """msrun SIGKILLs the surviving workers itself once one fails, so several workers can be gone
    without an exit record: a worker's own non-zero exit record wins, then the one msrun names."""
    from mindstep.dist.launch import Job, Launch

    dead = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    for p in dead:
        p.wait()
    launch = Launch(Job(cmd=["python", "x.py"], nproc=2, master_port=8118, log_dir=str(tmp_path)))
    os.makedirs(launch.status_dir)
    for rank, p in enumerate(dead):
        (tmp_path / ".mindstep" / "node0" / f"rank{rank}.pid").write_text(str(p.pid))
    (tmp_path / "msrun_node0.log").write_text(f"[ERROR] Worker process {dead[1].pid} exit with exception. "
                                              "Error code: -9.\n")
    assert launch._failure() == (1, "was killed (it ended without returning: a signal such as SIGKILL, or os._exit)")
    (tmp_path / ".mindstep" / "node0" / "rank0.exit").write_text(json.dumps({"code": 3, "error": "ValueError: bad"}))
    assert launch._failure() == (0, "exited with status 3 (ValueError: bad)")


def test_train_nproc_runs_the_resolved_config_on_every_rank_and_rank_0_writes(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "mindstep", "train", "--recipe", "resnet", "--nproc", "2",
                           "--out", str(out), "--steps", "4", "--json", str(tmp_path / "s.json"),
                           "model.widths=[4, 8]", "model.blocks=[1, 1]", "data.batch_size=16", "data.workers=1",
                           "train.eval_every=2", "train.save_every=2", "train.log_every=1"],
                          capture_output=True, text=True, timeout=180, cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[rank 0] resnet: 4 batches" in done.stdout and "[rank 1] resnet" not in done.stdout
    assert json.loads((tmp_path / "s.json").read_text())["steps"] == 4
    assert sorted(p.name for p in (out / "ckpt").glob("*.ckpt")) == ["batch-0000002.ckpt", "batch-0000004.ckpt"]
    assert "widths:\n  - 4\n  - 8" in (out / "launch.yaml").read_text()
