"""`mindstep train`: config validation and overrides, and the resnet recipe end to end on tiny sizes
(eval, checkpoints, resume that continues to the same result as an uninterrupted run)."""
import json
import os

import numpy as np
import pytest
import yaml

from mindstep.cli import main
from mindstep.train import config, recipes

# schedule.total_steps: the interrupted run (stopped after 3 batches) and the full one share one LR curve
TINY = ["model.widths=[4, 8]", "model.blocks=[1, 1]", "data.batch_size=480", "data.workers=1",  # 2 batches an epoch: resume crosses epochs
        "train.eval_every=3", "train.save_every=3", "train.log_every=1", "schedule.warmup_steps=2",
        "schedule.total_steps=6"]
pytestmark = pytest.mark.xdist_group("train")


def _resolve(*overrides, user=None):
    return config.resolve(recipes.defaults("resnet"), user, overrides)


@pytest.mark.parametrize("override, expected", [
    ("optim.lr=3e-4", (["optim", "lr"], 3e-4)),
    ("step.accumulate=4", (["step", "accumulate"], 4)),
    ("step.keep_fp32=[head, 'blocks.*']", (["step", "keep_fp32"], ["head", "blocks.*"])),
    ("step.ema=null", (["step", "ema"], None)),
    ("step.jit=false", (["step", "jit"], False)),
    ("step.loss_scale=dynamic", (["step", "loss_scale"], "dynamic")),
], ids=lambda v: str(v)[:24])
def test_overrides_are_read_as_yaml_with_numbers_as_numbers(override, expected):
    assert config.parse_override(override) == expected


@pytest.mark.parametrize("overrides, words", [
    (["optim.lrr=0.1"], ["optim.lrr: unknown key", "valid keys here: name, lr, momentum"]),
    (["optimizer.lr=0.1"], ["optimizer: unknown key", "valid keys here: recipe, seed, data"]),
    (["optim.lr=-1"], ["optim.lr:", "greater than 0", "got -1"]),
    (["step.accumulate=two"], ["step.accumulate:", "valid integer", "'two'"]),
    (["step.normalize=median"], ["step.normalize:", "'mean' or 'count'", "'median'"]),
    (["step.on_nonfinite=apply", "step.loss_scale=dynamic"], ["on_nonfinite='apply' cannot be used with a loss scale"]),
    (["optim.lr"], ["expected key=value"]),
], ids=["unknown-key", "unknown-section", "range", "type", "choice", "combination", "no-equals"])
def test_a_bad_config_is_one_error_naming_the_key_the_value_and_the_fix(overrides, words):
    with pytest.raises(config.ConfigError) as err:
        _resolve(*overrides)
    for word in words:
        assert word in str(err.value)


def test_the_recipes_own_keys_and_unknown_recipes_are_refused(tmp_path, capsys):
    with pytest.raises(config.ConfigError, match=r"model.depth: Extra inputs are not permitted.*valid keys: widths"):
        recipes.build(_resolve("model.depth=3"))
    with pytest.raises(config.ConfigError, match="same length"):
        recipes.build(_resolve("model.widths=[4, 8]"))
    assert main(["train", "--recipe", "vgg", "--out", str(tmp_path)]) == 2
    assert "recipe 'vgg' does not exist; recipes: resnet" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("recipe: resnet\nstep:\n  acumulate: 2\n")
    assert main(["train", "--config", str(bad), "--out", str(tmp_path)]) == 2
    assert "step.acumulate: unknown key" in capsys.readouterr().err
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing ran


def test_print_config_prints_a_config_that_resolves_to_itself(tmp_path, capsys):
    assert main(["train", "--recipe", "resnet", "--print-config", "optim.lr=0.1", "step.ema=0.999"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["optim"]["lr"] == 0.1 and printed["step"]["ema"] == 0.999
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(printed))
    assert config.resolve(recipes.defaults("resnet"), config.load_yaml(str(path))) == _resolve("optim.lr=0.1",
                                                                                                "step.ema=0.999")


def _params(ckpt):
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(ckpt)).items()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    assert main(["train", "--recipe", "resnet", "--out", str(out), "--steps", "6", "--json", str(out / "s.json"),
                 *TINY]) == 0
    return out


def test_the_run_writes_metrics_checkpoints_curves_and_the_summary(uninterrupted):
    out = uninterrupted
    summary = json.loads((out / "s.json").read_text())
    assert set(summary) == {"recipe", "steps", "epochs", "resumed_from", "samples_per_s", "data_wait_share",
                            "final_loss", "checkpoint", "stopped", "recompute", "notes", "eval"}
    assert summary["recipe"] == "resnet" and summary["steps"] == 6 and 0 <= summary["data_wait_share"] <= 1
    assert set(summary["eval"]) == {"accuracy_initial", "accuracy_majority_initial", "accuracy", "accuracy_majority"}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["batch"] for r in records if "eval" in r] == [0, 3, 6]  # `_initial` is the eval before any update
    logs = [r for r in records if "loss" in r]
    assert [r["batch"] for r in logs] == [1, 2, 3, 4, 5, 6]
    assert set(logs[0]) == {"batch", "loss", "lr", "applied", "step", "skipped", "skipped_in_row", "samples_per_s",
                            "data_wait_share"}
    assert sorted(os.listdir(out / "ckpt")) == ["batch-0000003.ckpt", "batch-0000003.ckpt.json",
                                               "batch-0000006.ckpt", "batch-0000006.ckpt.json"]
    assert (out / "curves.png").stat().st_size > 0 and (out / "config.yaml").exists()


def test_resume_continues_to_the_same_result_as_an_uninterrupted_run(uninterrupted, tmp_path):
    assert main(["train", "--recipe", "resnet", "--out", str(tmp_path), "--steps", "3", *TINY]) == 0
    assert main(["train", "--recipe", "resnet", "--out", str(tmp_path), "--steps", "6", "--resume",
                 "--json", str(tmp_path / "s.json"), *TINY]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["resumed_from"] == 3
    full, resumed = _params(uninterrupted / "ckpt" / "batch-0000006.ckpt"), _params(tmp_path / "ckpt" / "batch-0000006.ckpt")
    assert full.keys() == resumed.keys()
    for name in full:
        assert np.array_equal(full[name], resumed[name]), name
    losses = [[json.loads(x)["loss"] for x in (o / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
              for o in (uninterrupted, tmp_path)]
    assert losses[0] == losses[1]


def test_resume_without_a_checkpoint_is_refused(tmp_path, capsys):
    assert main(["train", "--recipe", "resnet", "--out", str(tmp_path), "--resume", *TINY]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err


def test_recompute_marks_the_matching_cells_and_refuses_a_pattern_that_matches_none(tmp_path):
    from mindstep.train import loop

    cfg = _resolve(*TINY, "step.recompute=['blocks.*']")
    recipe = recipes.build(cfg)
    _, _, names = loop.build_step(cfg, recipe)
    assert names and all(n.startswith("blocks.") for n in names)
    with pytest.raises(config.ConfigError, match="matches no Cell; top-level Cells: stem, blocks, head"):
        loop.build_step(_resolve(*TINY, "step.recompute=['layer4']"), recipes.build(cfg))


BERT_TINY = ["model.vocab_size=200", "model.seq_len=64", "model.hidden=16", "model.layers=1", "model.heads=2",
             "model.ffn=32", "data.batch_size=800", "data.workers=1", "train.eval_every=2", "train.save_every=2",
             "train.log_every=1", "schedule.total_steps=4", "schedule.warmup_steps=1"]


def test_mlm_masking_marks_the_masked_tokens_and_keeps_their_labels():
    from mindstep.train.recipes import bert

    ids = np.random.default_rng(0).integers(3, 100, (400, 16)).astype(np.int32)
    inputs, labels, weights = bert.mask(ids, 0.15, 100, seed=1)
    chosen = weights > 0
    assert 0.13 < chosen.mean() < 0.17
    assert np.array_equal(labels[chosen], ids[chosen]) and not labels[~chosen].any()
    assert np.array_equal(inputs[~chosen], ids[~chosen])
    assert 0.75 < (inputs[chosen] == bert.SPECIAL.index("[MASK]")).mean() < 0.85


def test_bert_recipe_end_to_end_and_resume(tmp_path):
    """Token-normalised MLM on the pydoc corpus, tiny: eval keys, and a resume across an epoch
    boundary (the masks are drawn per epoch) that ends where an uninterrupted run does."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(["train", "--recipe", "bert", "--out", str(full), "--steps", "4", "--json", str(full / "s.json"),
                 *BERT_TINY]) == 0
    summary = json.loads((full / "s.json").read_text())
    assert set(summary["eval"]) == {"mlm_accuracy_initial", "mlm_accuracy_unigram_initial", "mlm_accuracy",
                                    "mlm_accuracy_unigram"}
    assert 0 < summary["eval"]["mlm_accuracy_unigram"] < 0.5
    # the run's tokenizer is part of the run (tokenizers' trainer breaks ties differently each time)
    cut.mkdir()
    (cut / "tokenizer.json").write_bytes((full / "tokenizer.json").read_bytes())
    assert main(["train", "--recipe", "bert", "--out", str(cut), "--steps", "2", *BERT_TINY]) == 0
    assert main(["train", "--recipe", "bert", "--out", str(cut), "--steps", "4", "--resume", *BERT_TINY]) == 0
    a, b = _params(full / "ckpt" / "batch-0000004.ckpt"), _params(cut / "ckpt" / "batch-0000004.ckpt")
    for name in a:
        assert np.array_equal(a[name], b[name]), name


@pytest.mark.slow
def test_staged_report_runs_every_stage_in_its_own_process_and_prints_the_table(tmp_path, capsys):
    """Schema only: six stages, each a row with its figures or its error, ratios to the first."""
    sets = [a for o in TINY if not o.startswith("train.") for a in ("--set", o)]
    code = main(["bench", "--recipe", "resnet", "--stages", "--stage-steps", "4", "--out", str(tmp_path),
                 "--json", str(tmp_path / "stages.json"), *sets])
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "stages.json").read_text())
    rows = result["stages"]
    assert [r["stage"] for r in rows] == ["pynative", "jit", "amp", "accumulate", "composed", "recompute"]
    assert code == (0 if all(r["status"] == "ok" for r in rows) else 1)
    for r in rows:
        assert r["label"] in out
        if r["status"] == "ok":
            assert {"samples_per_s", "ms_per_step", "peak_mb", "compile_s", "time_to_target_s", "target",
                    "overrides"} <= set(r)
        else:
            assert r["error"] in out
    # the pass is off until its own stage, even for a recipe that turns it on (esrgan)
    assert rows[0]["overrides"] == ["step.jit=false", "step.optimize=false"]
    assert "step.accumulate=2" in rows[3]["overrides"] and "step.optimize=false" in rows[3]["overrides"]
    assert "step.optimize=true" in rows[4]["overrides"]
    assert "samples/s" in out and "x base" in out and (tmp_path / "stages.png").stat().st_size > 0


def test_recipes_take_the_users_data(tmp_path):
    """resnet: an image folder with one subfolder per class; bert: a text file."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (tmp_path / "img" / label).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(tmp_path / "img" / label / f"{i}.png")
    r = recipes.build(_resolve(f"data.path={tmp_path / 'img'}", "model.image_size=8"))
    assert r.classes == 2 and r.train_set[0].shape[1:] == (3, 8, 8) and len(r.train_set[1]) + len(r.test_set[1]) == 20
    text = tmp_path / "t.txt"
    text.write_text("\n\n".join(f"paragraph {i}: the quick brown fox jumps over the lazy dog " * 3 for i in range(60)))
    b = recipes.build(config.resolve(recipes.defaults("bert"), None, [f"data.path={text}", "model.vocab_size=100",
                                                                     "model.seq_len=16"]))
    assert len(b.train_set[0]) > 0 and len(b.test_set[0]) > 0 and b.vocab <= 100
