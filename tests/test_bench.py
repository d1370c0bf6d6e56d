"""mindstep bench: JSON schema, failure reporting, ratios from one run, outputs. No timing thresholds."""
import json
import math
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindstep.bench import profile, report, runner
from mindstep.bench.zoo import MODELS, forward_flops
from mindstep.cli import main

ROW_KEYS = {"mode", "model", "batch_size", "throughput", "step_ms_p50", "step_ms_p90", "compile_s", "peak_mem_mb",
            "mem_source", "mfu", "loss_first", "loss_last"}


@pytest.fixture(scope="module")
def small_report():
    cfg = runner.BenchConfig(model="mlp", modes=("pynative", "jit", "seed"), batch_size=8, steps=2, warmup=1)
    return runner.run(cfg)


@pytest.mark.xdist_group("bench-report")  # shares the module fixture `small_report`
def test_report_follows_the_json_schema(small_report):
    rep = json.loads(json.dumps(small_report))  # JSON round-trip
    assert isinstance(rep["device"], str) and rep["mindspore"] == ms.__version__
    assert rep["peak_gflops"] > 0
    assert rep["cpu"]["model"] and isinstance(rep["cpu"]["simd"], list)
    assert f"CPU: {rep['cpu']['summary']}" in report.title(rep)  # the header names the CPU
    assert [r["mode"] for r in rep["results"]] == ["pynative", "jit", "seed"]
    for r in rep["results"]:
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert r["status"] == "ok" and r["model"] == "mlp" and r["batch_size"] == 8
        assert r["throughput"] > 0 and r["step_ms_p90"] >= r["step_ms_p50"] > 0 and r["compile_s"] > 0
        assert r["peak_mem_mb"] > 0 and r["mem_source"] in ("process peak RSS", "device max_memory_allocated")
        if sys.platform.startswith("linux"):  # RssAnon: the process's own memory, within its peak RSS
            assert 0 < r["anon_mem_mb"] < r["peak_mem_mb"]
        assert 0 < r["mfu"] < 1
        assert r["throughput"] == pytest.approx(8 / (r["step_ms_p50"] / 1000))


@pytest.mark.xdist_group("bench-report")  # shares the module fixture `small_report`
def test_same_init_and_data_give_the_same_first_loss_in_every_mode(small_report):
    first = [r["loss_first"] for r in small_report["results"]]
    assert max(first) - min(first) < 1e-4 * abs(first[0])
    last = [r["loss_last"] for r in small_report["results"]]
    assert max(last) - min(last) < 1e-3 * abs(last[0])


@pytest.mark.xdist_group("bench-report")  # shares the module fixture `small_report`
def test_ratios_come_from_the_same_run(small_report):
    rel = runner.ratios(small_report)
    rows = {r["mode"]: r for r in small_report["results"]}
    assert rel["pynative"] == 1.0
    assert rel["jit"] == rows["jit"]["throughput"] / rows["pynative"]["throughput"]


def test_a_failing_mode_is_reported_with_its_error_not_dropped(monkeypatch, capsys):
    real = runner.run_worker

    def flaky(spec, timeout_s, extra_env=None):
        if spec.get("mode") == "jit":
            return real({**spec, "model": "no-such-model"}, timeout_s, extra_env)
        return real(spec, timeout_s, extra_env)

    monkeypatch.setattr(runner, "run_worker", flaky)
    code = main(["bench", "--model", "mlp", "--modes", "pynative,jit", "--steps", "1", "--batch-size", "4"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED" in out and "jit failed" in out and "no-such-model" in out


def test_worker_error_carries_the_exception():
    out = runner.run_worker({"mode": "jit", "model": "no-such-model"}, timeout_s=120)
    assert "error" in out and "KeyError" in out["error"] and "no-such-model" in out["error"]


def test_worker_timeout_is_an_error():
    assert runner.run_worker({"mode": "peak"}, timeout_s=0.01)["error"].startswith("timed out")


def test_failed_rows_render_and_are_left_out_of_ratios():
    rep = {"device": "CPU", "mindspore": "2.10.0", "peak_gflops": 100.0,
           "config": {"model": "mlp", "batch_size": 4, "image_size": 32, "seq_len": 64, "steps": 2, "warmup": 1},
           "results": [runner._row(runner.BenchConfig(model="mlp", batch_size=4), "pynative", {"error": "boom"}, 100.0)]}
    assert runner.ratios(rep) == {}
    assert report.rows(rep)[0][:2] == ["pynative", "FAILED"]
    assert report.title(rep).endswith("CPU: not recorded")  # a report from before the CPU was recorded
    assert set(rep["results"][0]) >= ROW_KEYS and math.isnan(rep["results"][0]["throughput"])


@pytest.mark.xdist_group("bench-report")  # shares the module fixture `small_report`
def test_outputs_markdown_and_png(small_report, tmp_path):
    md, png = report.write_outputs(small_report, str(tmp_path))
    from pathlib import Path

    text = Path(md).read_text()
    assert "| pynative |" in text and "| jit |" in text and "process peak RSS" in text
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, words", [
    pytest.param(["--modes", "jit,warp"], ["`modes`", "'warp'", "'pynative'"], id="bad-mode"),
    pytest.param(["--modes", "jit,jit"], ["`modes`", "without repeats"], id="repeat-mode"),
    pytest.param(["--model", "vgg"], ["`model`", "'vgg'", "'resnet50'"], id="bad-model"),
    pytest.param(["--opt-memory-budget", "lots"], ["`opt_memory_budget`", "'none'"], id="bad-budget"),
    pytest.param(["--opt-memory-budget", "-3"], ["`opt_memory_budget`", ">= 0"], id="negative-budget"),
    pytest.param(["--image-size", "4"], ["`image_size`", "4"], id="tiny-image"),
])
def test_bad_bench_flags_exit_2_with_the_reason(argv, words, capsys):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err


def test_distinct_batches_is_validated_and_reaches_the_config():
    with pytest.raises(ValueError, match="`distinct_batches`.*>= 1"):
        runner.BenchConfig(model="mlp", distinct_batches=0).validate()
    from mindstep.cli import build_parser

    args = build_parser().parse_args(["bench", "--distinct-batches", "20"])
    assert args.distinct_batches == 20
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", "--distinct-batches", "0"])
    assert exit_.value.code == 2


def test_profile_top_ops_ranks_by_total_time(tmp_path):
    d = tmp_path / "jit" / "vm_1_ascend_ms" / "FRAMEWORK"
    d.mkdir(parents=True)
    (d / "cpu_op_type_info_0.csv").write_text(
        "op_type,type_occurrences,execution_frequency(per-step),total_compute_time,avg_time(ms),percent\n"
        "MatMul,6,2,30.0,5.0,0.6\nConv2D,3,1,15.0,5.0,0.3\nReLU,3,1,5.0,1.6,0.1\n")
    ops = profile.top_ops(str(tmp_path / "jit"), n=2)
    assert [o["op"] for o in ops] == ["MatMul", "Conv2D"]
    assert ops[0]["percent"] == pytest.approx(60.0) and ops[0]["calls"] == 6


def test_profile_top_ops_reads_only_the_newest_run(tmp_path):
    """A second `--profile` run into the same directory reports its own ops, not the sum of both."""
    import os

    header = "op_type,type_occurrences,execution_frequency(per-step),total_compute_time,avg_time(ms),percent\n"
    for i, (run, body) in enumerate([("vm_1_20261130010000_ascend_ms", "Conv2D,3,1,15.0,5.0,1.0\n"),
                                     ("vm_2_20261130020000_ascend_ms", "MatMul,6,2,30.0,5.0,1.0\n")]):
        d = tmp_path / "jit" / run / "FRAMEWORK"
        d.mkdir(parents=True)
        (d / "cpu_op_type_info_0.csv").write_text(header + body)
        os.utime(d / "cpu_op_type_info_0.csv", (1000 + i, 1000 + i))
    ops = profile.top_ops(str(tmp_path / "jit"))
    assert [(o["op"], o["calls"]) for o in ops] == [("MatMul", 6)]


def test_flops_of_dense_and_conv_match_the_formula():
    net = nn.SequentialCell(nn.Conv2d(3, 8, 3, pad_mode="same"), nn.Flatten(), nn.Dense(8 * 6 * 6, 5))
    flops = forward_flops(net, (ms.Tensor(np.ones((2, 3, 6, 6), np.float32)),))
    assert flops == 2 * (2 * 8 * 6 * 6) * 3 * 9 + 2 * 2 * (8 * 6 * 6) * 5
    # linear in the batch, which lets the bench count one sample and scale it
    assert forward_flops(net, (ms.Tensor(np.ones((1, 3, 6, 6), np.float32)),)) * 2 == flops


@pytest.mark.parametrize("model", ["bert", "resnet18"])
def test_a_bench_models_flops_are_linear_in_the_batch(model):
    spec = MODELS[model]
    ms.set_seed(0)
    net = spec.build(16, 8)
    x = ms.Tensor(spec.batch(np.random.default_rng(0), 3, 16, 8)[0])
    assert forward_flops(net, (x,)) == pytest.approx(3 * forward_flops(net, (x[:1],)), rel=1e-12)


def test_flop_count_leaves_weights_statistics_and_training_flags_alone():
    ms.set_seed(0)
    net = MODELS["resnet18"].build(16, 16)
    net.stages.set_train(True)  # a mixed state the probe must restore exactly
    flags = [(n, c.training) for n, c in net.cells_and_names()]
    before = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    assert forward_flops(net, (ms.Tensor(np.ones((2, 3, 16, 16), np.float32)),)) > 0
    assert [(n, c.training) for n, c in net.cells_and_names()] == flags
    for p in net.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), before[p.name], err_msg=p.name)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_bench_model_builds_and_its_batch_fits(name):
    spec = MODELS[name]
    ms.set_seed(0)
    net = spec.build(16, 16)
    batch = spec.batch(np.random.default_rng(0), 2, 16, 16)
    out = net(ms.Tensor(batch[0]))
    loss = spec.loss()(out, ms.Tensor(batch[1]))
    assert loss.ndim == 0 and np.isfinite(float(loss.asnumpy()))


def test_jit_opt_decisions_are_measured_in_a_process_of_their_own_and_budgeted_from_the_jit_row(tmp_path):
    cfg = runner.BenchConfig(model="mlp", modes=("jit-opt", "jit"), batch_size=4, steps=1, warmup=1,
                             extra_env={"MINDSTEP_CACHE_DIR": str(tmp_path)})
    rep = runner.run(cfg)
    assert rep["optimize_prepare"]["layers"] == 0 and rep["optimize_prepare"]["optimize_s"] >= 0
    assert [r["mode"] for r in rep["results"]] == ["jit-opt", "jit"]  # listed order, though jit ran first
    row, jit = rep["results"]
    assert row["status"] == "ok" and "composed-operator pass" in row["settings"]["opt"]
    # the budget is calibrated against the jit row's measured peak: no cap first, kept if within 1.25x
    cal = rep["optimize_calibration"]
    assert cal["native_peak_mb"] == jit["peak_mem_mb"] and cal["trials"][0]["memory_budget_mb"] is None
    first = cal["trials"][0]
    assert first["within"] == (first["peak_mem_mb"] <= 1.25 * jit["peak_mem_mb"])
    if first["within"]:
        assert cal["chosen"] is None and row["settings"]["memory_budget_from"].startswith("calibrated")


def test_opt_memory_budget_none_lifts_the_cap(tmp_path):
    cfg = runner.BenchConfig(model="mlp", modes=("jit-opt",), batch_size=4, steps=1, warmup=1,
                             opt_memory_budget="none", extra_env={"MINDSTEP_CACHE_DIR": str(tmp_path)})
    row = runner.run(cfg)["results"][0]
    assert row["status"] == "ok"
    assert row["settings"]["memory_budget_mb"] is None and row["settings"]["memory_budget_from"] == "no cap"


def test_calibration_bisects_to_the_largest_budget_within_the_peak_ratio(monkeypatch):
    from mindstep.optimize.memory import RETAINED

    cfg = runner.BenchConfig(model="mlp", modes=("jit", "jit-opt"), batch_size=4).validate()
    seen = []
    kept = 400.0  # what the no-cap run's layers would keep (upper-bound estimates)

    def run_worker(spec, timeout_s, extra_env=None):
        budget = spec["optimize"]["memory_budget_mb"]
        assert (spec["warmup"], spec["steps"]) == (0, 1)  # the compiling call alone
        seen.append(budget)
        peak = 1000 + (0.5 * kept if budget is None else budget / RETAINED * 0.5)  # a step keeps half
        return {"peak_mem_mb": peak, "mem_source": "process peak RSS",
                "settings": {"optimize_report": [{"extra_mb": kept}]}}

    monkeypatch.setattr(runner, "run_worker", run_worker)
    cal = runner.calibrate_budget(cfg, {"mode": "jit-opt"}, 1000.0)
    # no cap: 1200 > 1250? no -> within
    assert seen == [None] and cal["chosen"] is None
    kept = 800.0  # no cap: 1400 > 1250, so bisect between 0 and RETAINED * 800 MB
    seen.clear()
    cal = runner.calibrate_budget(cfg, {"mode": "jit-opt"}, 1000.0)
    assert len(seen) == 1 + runner.CALIBRATION_STEPS and seen[1] == pytest.approx(RETAINED * 800 / 2)
    within = [t["memory_budget_mb"] for t in cal["trials"] if t["within"]]
    assert cal["chosen"] == max(within)
    assert all((t["peak_mem_mb"] <= 1250) == t["within"] for t in cal["trials"])
    step = RETAINED * 800 / 2 ** runner.CALIBRATION_STEPS  # the bisection's final resolution
    assert 1000 + cal["chosen"] / RETAINED * 0.5 <= 1250 < 1000 + (cal["chosen"] + step) / RETAINED * 0.5


def test_calibration_falls_back_to_the_default_budget_when_nothing_fits(monkeypatch):
    cfg = runner.BenchConfig(model="mlp", modes=("jit", "jit-opt"), batch_size=4).validate()
    monkeypatch.setattr(runner, "run_worker", lambda spec, t, e=None: {
        "peak_mem_mb": 2000.0, "mem_source": "process peak RSS", "settings": {"optimize_report": [{"extra_mb": 100}]}})
    cal = runner.calibrate_budget(cfg, {"mode": "jit-opt"}, 1000.0)
    assert cal["chosen"] == "default" and not any(t["within"] for t in cal["trials"])


def test_jit_nocheck_is_jit_without_the_finite_check_and_nothing_else():
    from mindstep.bench.modes import build

    spec = MODELS["mlp"]
    batch = [ms.Tensor(b) for b in spec.batch(np.random.default_rng(0), 4, 16, 16)]
    losses = {}
    for mode in ("jit", "jit-nocheck"):
        ms.set_seed(0)
        net = spec.build(16, 16)
        run, settings = build(mode, net, spec.loss())
        losses[mode] = [float(run(*batch).asnumpy()) for _ in range(2)]
        assert settings.get("on_nonfinite") == ("apply" if mode == "jit-nocheck" else None)
    assert losses["jit"] == losses["jit-nocheck"]  # finite batches: the check changes no arithmetic


def test_first_window_holds_the_update_graphs_compile_and_only_one_steady_call():
    from mindstep.bench.worker import first_window_s

    # k = 1: the first call as it is; k = 2: calls 1-2 less one steady call (the mean of the measured ones)
    assert first_window_s([5.0, 1.0, 1.0, 1.0], warmup=1) == 5.0
    assert first_window_s([5.0, 3.0, 1.0, 2.0, 1.0, 2.0], warmup=2, k=2) == pytest.approx(5.0 + 3.0 - 1.5)


def test_an_accumulating_step_is_timed_per_call_over_whole_windows():
    from mindstep.bench.worker import per_call

    assert per_call([1.0, 2.0, 3.0], 1) == [1.0, 2.0, 3.0]
    # windows of k calls, the last one with the update: each window's mean, never a lone micro-step
    assert per_call([1.0, 1.0, 1.0, 5.0, 1.0, 1.0, 1.0, 9.0], 4) == [2.0, 3.0]


def test_jit_accum_accumulates_k_micro_batches_and_jit_big_runs_k_times_the_batch():
    from mindstep.bench import worker

    spec = {"model": "mlp", "batch_size": 4, "image_size": 16, "seq_len": 16, "seed": 0, "steps": 3, "warmup": 1,
            "distinct_batches": 2, "features": False, "accumulate": 3, "profile_dir": None}
    accum = worker.run({**spec, "mode": "jit-accum"})
    big = worker.run({**spec, "mode": "jit-big"})
    assert accum["settings"]["accumulate"] == 3 and accum["batch_size"] == 4
    assert "window of 3 calls" in accum["settings"]["timed_as"]
    assert big["batch_size"] == 12 and "accumulate" not in big["settings"]
    assert big["flops_per_step"] == pytest.approx(3 * accum["flops_per_step"])
    with pytest.raises(ValueError, match="`accumulate`.*>= 2"):
        runner.BenchConfig(model="mlp", accumulate=1).validate()
    from mindstep.cli import build_parser

    assert build_parser().parse_args(["bench", "--accumulate", "8"]).accumulate == 8


def test_repeat_interleaves_the_modes_and_reports_medians_spread_and_the_best_peak(monkeypatch):
    calls, peaks, p50s = [], iter([100.0, 150.0, 120.0]), {"jit": iter([10.0, 14.0]), "seed": iter([20.0, 12.0])}

    def fake_worker(spec, timeout_s, extra_env=None):
        calls.append(spec["mode"])
        if spec["mode"] == "peak":
            return {"peak_gflops": next(peaks)}
        p50 = next(p50s[spec["mode"]])
        return {"mode": spec["mode"], "model": "mlp", "batch_size": 8, "throughput": 8 / (p50 / 1000),
                "step_ms_p50": p50, "step_ms_p90": p50 + 1, "compile_s": p50 / 10, "peak_mem_mb": 400 + p50,
                "mem_source": "process peak RSS", "flops_per_step": 1e9, "loss_first": 1.0, "loss_last": 0.5,
                "settings": {}}

    monkeypatch.setattr(runner, "run_worker", fake_worker)
    rep = runner.run(runner.BenchConfig(model="mlp", modes=("jit", "seed"), repeat=2))
    assert calls == ["peak", "jit", "seed", "peak", "jit", "seed", "peak"]  # interleaved, peak between rounds
    assert rep["peak_gflops"] == 150.0 and rep["peak_runs_gflops"] == [100.0, 150.0, 120.0]
    jit, seed = rep["results"]
    assert jit["step_ms_p50"] == 12.0 and jit["runs"]["step_ms_p50"] == [10.0, 14.0]
    assert jit["step_ms_spread"] == pytest.approx(4 / 12) and seed["step_ms_spread"] == pytest.approx(8 / 16)
    assert jit["throughput"] == pytest.approx(8 / 0.012) and jit["mfu"] == pytest.approx(1e9 / 0.012 / 1e9 / 150)
    assert "±17%" in report.rows(rep)[0][3] and "median of 2 interleaved runs" in report.title(rep)
    with pytest.raises(ValueError, match="`repeat`"):
        runner.BenchConfig(model="mlp", repeat=0).validate()


def test_own_memory_is_a_median_over_runs_and_a_line_under_the_table():
    run = {"mode": "jit", "status": "ok", "step_ms_p50": 1.0, "step_ms_p90": 1.0, "compile_s": 1.0, "peak_mem_mb": 900.0,
           "mem_source": "process peak RSS", "batch_size": 1}
    row = runner.combine([dict(run, anon_mem_mb=600.0), dict(run, anon_mem_mb=640.0), dict(run, anon_mem_mb=610.0)])
    assert row["anon_mem_mb"] == 610.0 and row["runs"]["anon_mem_mb"] == [600.0, 640.0, 610.0]
    assert report.own_memory_lines({"results": [row]}) == [
        "anonymous memory at the end of each run (the process's own, without library pages): jit 610 MB"]
    # where psutil has no shared-page figure (not Linux): no figure, no line
    bare = runner.combine([dict(run, anon_mem_mb=None), dict(run, anon_mem_mb=None)])
    assert "anon_mem_mb" not in bare["runs"] and report.own_memory_lines({"results": [bare]}) == []


def test_a_failed_run_fails_the_repeated_row():
    ok = {"step_ms_p50": 1.0, "step_ms_p90": 1.0, "compile_s": 1.0, "peak_mem_mb": 1.0, "batch_size": 1}
    row = runner.combine([ok, {"error": "exit code 1: boom"}])
    assert row["error"] == "exit code 1: boom (run 2 of 2)"


def test_a_run_stops_timing_after_whole_windows_that_add_up_to_max_seconds():
    from mindstep.bench.worker import enough

    assert not enough([], 1, 1.0)  # at least one call is timed
    assert not enough([0.4, 0.5], 1, 1.0) and enough([0.4, 0.7], 1, 1.0)
    assert not enough([5.0], 2, 1.0) and enough([5.0, 1.0], 2, 1.0)  # only at the end of a window
    assert not enough([9.0, 9.0, 9.0], 2, 1.0) and enough([9.0] * 4, 2, 1.0)
    assert not enough([100.0] * 50, 1, None)  # None: every --steps step is timed


def test_a_first_call_after_compiling_apart_is_timed_only_when_it_alone_reaches_max_seconds():
    from mindstep.bench.worker import first_call_counts

    assert first_call_counts([60.0], 1, 60.0) and not first_call_counts([59.9], 1, 60.0)
    assert not first_call_counts([100.0], 2, 60.0)  # an accumulating step: its first window, not a call
    assert not first_call_counts([100.0], 1, None)  # --max-seconds none: every step is timed
    assert not first_call_counts([100.0], 1, 60.0, "prof")  # profiling starts after the warm-up
    assert not first_call_counts([100.0, 100.0], 1, 60.0)  # only the first call


@pytest.mark.parametrize("mode, timed, warmup, asked", [
    ("jit", 1, 0, 7), ("onestep", 1, 0, 7), ("model", 1, 0, 7),  # compiled apart: the first call is timed
    ("jit-accum", 3, 3, 9), ("seed", 1, 1, 7)])  # a window's update graph; an ms.jit function compiles in call 1
def test_max_seconds_cuts_a_slow_modes_timed_steps_and_the_row_says_so(mode, timed, warmup, asked):
    """A limit every call exceeds: one call is timed and the row says why; without a limit every step is.
    A step compiled apart (a GRAPH_MODE Cell) times its first call, which only executed, and stops there;
    one that compiles in its first call leaves it out (jit-accum a whole window, its warm-up)."""
    from mindstep.bench import worker

    spec = {"mode": mode, "model": "mlp", "batch_size": 4, "image_size": 16, "seq_len": 16, "seed": 0, "steps": 6,
            "warmup": 1, "distinct_batches": 2, "features": False, "accumulate": 3, "profile_dir": None}
    try:
        cut = worker.run({**spec, "max_seconds": 1e-9})
        full = worker.run({**spec, "max_seconds": None})
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)  # `model` runs in GRAPH_MODE
    assert cut["timed_calls"] == timed and full["timed_calls"] == 6
    assert cut["settings"]["timed_calls_why"].startswith(f"{timed} of 6 calls timed")
    assert "--max-seconds 1e-09" in cut["settings"]["timed_calls_why"]
    assert cut["settings"]["timed_calls_why"].endswith(f"loss last is that of call {warmup + timed}, not {asked}")
    assert ("(its first call, which ran after the step was compiled apart)" in cut["settings"]["timed_calls_why"]) \
        == (warmup == 0)
    assert ("compiled_apart_s" in cut["settings"]) == (mode != "seed")
    assert "timed_calls_why" not in full["settings"]
    # compiled_apart_s is kept to 2 decimals: compare the row's compile at that precision (rounding is
    # monotone, so a first call of 0.0 s after a 0.458 s compile reads 0.46 >= 0.46, not 0.458 < 0.46)
    assert round(cut["compile_s"], 2) >= cut["settings"].get("compiled_apart_s", 0)
    assert cut["loss_first"] == full["loss_first"] and cut["step_ms_p50"] > 0


def test_max_seconds_is_validated_and_short_runs_are_reported():
    from mindstep.cli import build_parser

    assert runner.BenchConfig(model="mlp").validate().max_seconds == 60.0
    assert runner.BenchConfig(model="mlp", max_seconds="none").validate().max_seconds is None
    assert runner.BenchConfig(model="mlp", max_seconds="2.5").validate().max_seconds == 2.5
    for bad in (0, -1, "soon", True):
        with pytest.raises(ValueError, match="`max_seconds`.*'none'"):
            runner.BenchConfig(model="mlp", max_seconds=bad).validate()
    assert build_parser().parse_args(["bench", "--max-seconds", "none"]).max_seconds == "none"
    assert runner.spec_for(runner.BenchConfig(model="mlp", max_seconds=9).validate(), "jit")["max_seconds"] == 9.0
    # repeated runs: the row keeps the run that timed fewest, and the output names it
    run = {"step_ms_p50": 1.0, "step_ms_p90": 1.0, "compile_s": 1.0, "peak_mem_mb": 1.0, "batch_size": 1}
    why = "1 of 5 calls timed: it took 70.0 s, over --max-seconds 60"
    row = runner.combine([{**run, "timed_calls": 5, "settings": {}},
                          {**run, "timed_calls": 1, "settings": {"timed_calls_why": why}}])
    assert row["timed_calls"] == 1 and row["settings"]["timed_calls_why"] == why
    rep = {"results": [{**row, "mode": "jit", "status": "ok"}, {**run, "mode": "seed", "status": "ok", "settings": {}}]}
    assert report.short_runs(rep) == [f"jit: {why} (the run that timed fewest)"]


def test_the_default_warmup_covers_the_compile_and_mindspores_cpu_kernel_search():
    """MindSpore's CPU kernels run their first 5 calls on one thread (`_warmup.KERNEL_SEARCH_CALLS`):
    the bench times from the 7th call unless --warmup says otherwise."""
    from mindstep import _warmup
    from mindstep.cli import build_parser

    assert _warmup.DEFAULT_WARMUP == 1 + _warmup.KERNEL_SEARCH_CALLS == 6
    assert runner.BenchConfig(model="mlp").validate().warmup == 6
    assert build_parser().parse_args(["bench"]).warmup == 6
    assert build_parser().parse_args(["bench", "--warmup", "2"]).warmup == 2
    assert "default 6" in " ".join(build_parser()._subparsers._group_actions[0].choices["bench"].format_help().split())


def test_warmup_ends_once_the_calls_after_the_first_reach_max_seconds_at_a_window_end():
    from mindstep._warmup import warmup_ends, warmup_why

    assert not warmup_ends([100.0], 1, 60.0)  # the compiling call alone never ends it
    assert warmup_ends([100.0, 60.0], 1, 60.0) and not warmup_ends([100.0, 59.9], 1, 60.0)
    assert warmup_ends([1.0, 30.0, 30.0], 1, 60.0)  # the calls after the first add up
    assert not warmup_ends([100.0, 100.0], 1, None)  # --max-seconds none: the whole warm-up
    assert not warmup_ends([1.0, 70.0], 3, 60.0) and warmup_ends([1.0, 70.0, 1.0], 3, 60.0)  # whole windows
    assert warmup_why(2, 6, [100.0, 70.0], 60.0) == \
        "2 of 6 warm-up calls: the 1 after the first took 70.0 s, over --max-seconds 60"


@pytest.mark.parametrize("mode, warmup, timed", [("seed", 2, 1), ("jit-accum", 3, 3), ("jit", 0, 1)])
def test_max_seconds_ends_a_slow_modes_warmup_and_the_row_says_so(mode, warmup, timed):
    """With --max-seconds that every call passes, a 6-call warm-up ends after the first call after the
    compiling one (a whole window for an accumulating step), the next calls are timed, and the row
    says how many warm-up calls ran; a step compiled apart times its first call instead (as before)."""
    from mindstep.bench import worker

    spec = {"mode": mode, "model": "mlp", "batch_size": 4, "image_size": 16, "seq_len": 16, "seed": 0, "steps": 2,
            "warmup": 6, "distinct_batches": 2, "features": False, "accumulate": 3, "profile_dir": None}
    cut = worker.run({**spec, "max_seconds": 1e-9})
    assert cut["timed_calls"] == timed
    why = cut["settings"].get("warmup_why", "")
    assert why.startswith(f"{warmup} of 6 warm-up calls") if warmup else why == ""
    if warmup:
        rep = {"results": [{**cut, "status": "ok"}]}
        assert report.short_runs(rep)[0] == f"{mode}: {why}"
    if mode == "seed":  # 2 warm-up + 1 timed call of the 6 + 2 asked
        assert cut["settings"]["timed_calls_why"].endswith("loss last is that of call 3, not 8")
    if mode == "jit-accum":  # one window (k = 3) timed: the 2 steps asked, rounded up to a window
        assert "timed_calls_why" not in cut["settings"]
    full = worker.run({**spec, "max_seconds": None, "steps": 1})
    assert "warmup_why" not in full["settings"] and full["timed_calls"] == (3 if mode == "jit-accum" else 1)


def test_the_ceiling_times_every_conv_and_dense_gemm_of_a_step_at_the_whole_batch(monkeypatch):
    from mindstep.bench import ceiling

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, stride=2, pad_mode="pad", padding=1)
            self.b = nn.Conv2d(8, 8, 3, group=2, pad_mode="same")
            self.fc = nn.Dense(8 * 4 * 4, 5)

        def construct(self, x):
            return self.fc(self.b(self.a(x)).reshape(x.shape[0], -1))

    net, x = Net(), ms.Tensor(np.ones((1, 3, 8, 8), np.float32))
    shapes = ceiling.gemm_shapes(net, (x,), batch=6)
    rows = 6 * 4 * 4  # output positions of the whole batch
    assert shapes[(8, 27, rows)] == 1 and shapes[(8, rows, 27)] == 1 and shapes[(27, 8, rows)] == 1
    assert shapes[(4, 36, rows)] == 2 and shapes[(36, 4, rows)] == 2  # two groups of 4 outputs, 4*3*3 inputs
    assert shapes[(6, 128, 5)] == 1 and shapes[(5, 6, 128)] == 1 and shapes[(6, 5, 128)] == 1
    counted = 3.0 * 6 * forward_flops(net, (x,))
    assert sum(2.0 * m * k * n * c for (m, k, n), c in shapes.items()) == pytest.approx(counted)
    calls = []
    monkeypatch.setattr(ceiling, "time_gemm", lambda m, k, n: calls.append((m, k, n)) or 1e-3)
    got = ceiling.measure(net, (x,), 6, counted)
    assert sorted(calls) == sorted(shapes) and got["shapes"] == len(shapes) == 9
    assert got["seconds"] == pytest.approx(1e-3 * sum(shapes.values())) and got["covered"] == pytest.approx(1.0)
    assert got["gflops"] == pytest.approx(counted / got["seconds"] / 1e9)
    monkeypatch.undo()
    assert ceiling.time_gemm(4, 8, 16, repeats=2) > 0


def test_the_ceiling_row_is_measured_once_after_the_peak_and_printed_with_each_rows_share(monkeypatch, capsys):
    calls = []

    def fake_worker(spec, timeout_s, extra_env=None):
        calls.append(spec["mode"])
        if spec["mode"] == "peak":
            return {"peak_gflops": 100.0}
        if spec["mode"] == "ceiling":
            assert spec["batch_size"] == 8 and spec["model"] == "mlp"
            return {"flops": 4e9, "seconds": 0.1, "gflops": 40.0, "shapes": 6, "covered": 1.0, "method": "m"}
        return {"mode": spec["mode"], "model": "mlp", "batch_size": 8, "throughput": 800.0, "step_ms_p50": 10.0,
                "step_ms_p90": 11.0, "compile_s": 1.0, "peak_mem_mb": 400.0, "mem_source": "process peak RSS",
                "flops_per_step": 2e8, "loss_first": 1.0, "loss_last": 0.5, "settings": {}}

    monkeypatch.setattr(runner, "run_worker", fake_worker)
    rep = runner.run(runner.BenchConfig(model="mlp", modes=("jit",), batch_size=8, ceiling=True))
    assert calls == ["peak", "ceiling", "jit", "peak"]
    assert rep["shape_ceiling"]["mfu"] == pytest.approx(0.4) and rep["results"][0]["mfu"] == pytest.approx(0.2)
    (line,) = report.ceiling_lines(rep)
    assert "6 shapes, 100% of the counted FLOPs" in line and "40.0 GFLOP/s = 40.0% of the peak" in line
    assert line.endswith("jit 50%")
    report.print_table(rep)
    assert "GEMM ceiling at mlp's own shapes" in capsys.readouterr().out
    calls.clear()
    rep = runner.run(runner.BenchConfig(model="mlp", modes=("jit",), batch_size=8))
    assert "ceiling" not in calls and rep["shape_ceiling"] is None and report.ceiling_lines(rep) == []


def test_the_ceiling_worker_covers_the_mlp_and_refuses_the_other_bench_kinds(capsys):
    from mindstep.bench import worker

    got = worker.run({"mode": "ceiling", "model": "mlp", "seed": 0, "batch_size": 4, "image_size": 32, "seq_len": 8})
    assert got["shapes"] == 6 and got["covered"] == pytest.approx(1.0) and got["gflops"] > 0
    assert main(["bench", "--ceiling", "--nproc", "2"]) == 2
    assert "--ceiling got together with --stages/--recipe/--nproc" in capsys.readouterr().err
