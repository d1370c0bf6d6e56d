"""Graph-kernel fusion (`optimize={"fuse": True}`, `mindstep.optimize.fusion`): a fused step (the loss in
the cross-entropy's 'lse' form, the LayerNorms in 'reduce', the other layers composed) trains to the same
parameters as the unfused one, compiles once, and leaves MindSpore's context flag and the working
directory as they were; fused decisions are cached under their own key; bad settings and a missing
compiler dependency fail on the host with the fix; the bench's `jit-opt-fuse` mode asks for it."""
import json
import os
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindstep import TrainStep
from mindstep.models import BertMLM, MLMLoss
from mindstep.optimize import decide, fusion, optimize


def _bert():
    ms.set_seed(0)
    return BertMLM(vocab=50, hidden=16, layers=1, heads=2, ffn=32, max_len=8)


def test_a_fused_step_trains_to_the_same_parameters_compiles_once_and_restores_the_flag(tmp_path, monkeypatch):
    monkeypatch.setenv(fusion.CACHE_ENV, str(tmp_path / "kernels"))
    rng = np.random.default_rng(0)
    data = [(ms.Tensor(rng.integers(0, 50, (4, 8)).astype(np.int32)),
             ms.Tensor(rng.integers(0, 50, (4, 8)).astype(np.int32))) for _ in range(2)]
    here, results = os.getcwd(), []
    for fuse in (False, True):
        net = _bert()
        step = TrainStep.from_net(net, MLMLoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9),
                                  optimize={"fuse": fuse, "force": {"*.ce": "lse", "*.ln?": "reduce", "*": "composed"},
                                            "cache_dir": str(tmp_path)})
        losses = [float(step(x, y)["loss"]) for x, y in data * 3]
        chosen = [(r["layer"], r["choice"]) for r in step.optimize_report]
        assert ("loss.ce", "lse") in chosen and ("layers.0.ln1", "reduce") in chosen, chosen
        assert step.compile_count == 1  # the flag set around each call does not recompile the step
        assert not fusion.active() and os.getcwd() == here
        results.append((losses, {p.name: p.asnumpy() for p in net.get_parameters()}))
    assert results[1][0][-1] < results[1][0][0]  # it trains
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    for name, value in results[0][1].items():
        np.testing.assert_allclose(results[1][1][name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    # MindSpore's generated kernels went to the cache asked for, not the working directory
    assert (tmp_path / "kernels" / "akg_kernel_meta").is_dir()
    assert not os.path.exists(os.path.join(here, "akg_kernel_meta"))


def test_fused_decisions_are_cached_under_their_own_key(tmp_path, monkeypatch):
    def fake_measure(kind, layer, shape, dtype):
        return {"choice": "native", "native_ms": 1.0, "gemm_ms": 1.0, "reason": "measured (fake)",
                "times": {"native": 1.0, "composed": 1.0}}

    monkeypatch.setattr(decide, "measure_kind", fake_measure)
    monkeypatch.setenv(fusion.CACHE_ENV, str(tmp_path / "kernels"))
    x = (np.ones((2, 3, 8), np.float32),)
    optimize(nn.SequentialCell(nn.LayerNorm((8,))), x, cache_dir=str(tmp_path))
    assert fusion.key_device("CPU") == "CPU"
    with fusion.fused():
        assert fusion.active() and fusion.key_device("CPU") == "CPU+graph-kernel"
        optimize(nn.SequentialCell(nn.LayerNorm((8,))), x, cache_dir=str(tmp_path))
    assert not fusion.active()
    keys = {k.split("|", 1)[0]: k.split("|", 1)[1] for k in json.loads((tmp_path / "decisions.json").read_text())}
    assert sorted(keys) == ["CPU", "CPU+graph-kernel"] and keys["CPU"] == keys["CPU+graph-kernel"]


def test_fuse_is_validated_and_a_missing_compiler_dependency_names_the_fix(monkeypatch):
    net = nn.Dense(4, 2)
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    with pytest.raises(TypeError, match=r"optimize\['fuse'\]"):
        TrainStep.from_net(net, nn.MSELoss(), opt, optimize={"fuse": "yes"})
    with pytest.raises(ValueError, match=r"optimize\['fuse'\].*jit=True"):
        TrainStep.from_net(net, nn.MSELoss(), opt, optimize={"fuse": True}, jit=False)
    monkeypatch.setitem(sys.modules, "decorator", None)  # `import decorator` now raises ImportError
    with pytest.raises(ImportError, match="pip install decorator"):
        TrainStep.from_net(net, nn.MSELoss(), opt, optimize={"fuse": True})
    with pytest.raises(ImportError, match="pip install decorator"), fusion.fused():
        pass
    assert not fusion.active()


def test_the_bench_jit_opt_fuse_mode_asks_for_fusion():
    from mindstep.bench import modes

    assert "jit-opt-fuse" in modes.MODES and "jit-opt-fuse" in modes.OPT_MODES
    net = nn.SequentialCell(nn.Dense(4, 2))
    _, settings = modes.build("jit-opt-fuse", net, nn.MSELoss(), optimize={"memory_budget_mb": None})
    assert settings["step"].optimize == {"memory_budget_mb": None, "fuse": True}
    assert "graph-kernel fusion" in settings["opt"]
    _, plain = modes.build("jit-opt", nn.SequentialCell(nn.Dense(4, 2)), nn.MSELoss(), optimize={"memory_budget_mb": None})
    assert "fuse" not in plain["step"].optimize


def test_a_fused_gan_step_equals_the_hand_written_loop(tmp_path, monkeypatch):
    from test_gan import data, gan, reference, weights

    monkeypatch.setenv(fusion.CACHE_ENV, str(tmp_path / "kernels"))
    batches = data()
    ref = reference(batches)
    step, g, d = gan(optimize={"fuse": True, "cache_dir": str(tmp_path)})
    for batch in batches:
        step(*batch)
    assert not fusion.active() and step.compile_count == 1
    got = weights(g, d)
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_only_the_first_fused_block_of_a_process_warms_up(monkeypatch):
    calls = []
    monkeypatch.setattr(fusion, "_STARTED", False)
    monkeypatch.setattr(fusion, "_warm_up", lambda: calls.append(fusion.active()))
    here = os.getcwd()
    with fusion.fused():
        assert os.getcwd() == os.environ[fusion.CACHE_ENV]  # MindSpore's compile process starts here
    with fusion.fused():
        assert os.getcwd() == here  # later blocks leave the working directory alone
    assert calls == [True] and os.getcwd() == here and not fusion.active()
    # AKG finds its own tiling repository there (else it prints a line per kernel and ignores it)
    assert os.path.isfile(os.path.join(os.environ[fusion.WHITE_LIST_ENV], "repository_cpu.json"))


def test_env_says_whether_graph_kernels_can_fuse(monkeypatch, capsys):
    from mindstep.cli import main

    assert main(["env", "--no-run-check"]) == 0
    assert "graph kernels yes" in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "decorator", None)
    assert main(["env", "--no-run-check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["graph_kernels"] == {"usable": False, "detail": "MindSpore's graph-kernel compiler needs the "
                                       "`decorator` package: pip install decorator"}
