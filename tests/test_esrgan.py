"""The esrgan recipe end to end on tiny sizes (both phases, eval keys, resume, perceptual loss),
and the PSNR/SSIM functions against known values and scikit-image."""
import json
import os

import mindspore as ms
import numpy as np
import pytest

from mindstep import metrics

pytestmark = pytest.mark.xdist_group("esrgan")

TINY = ["model.nf=8", "model.gc=4", "model.hr_crop=16", "model.crops_per_epoch=16", "model.d_width=4",
        "data.batch_size=4", "data.workers=1", "step.optimize=false", "train.steps=4", "train.eval_every=2",
        "train.save_every=2", "train.log_every=2"]


def _image(seed=0, shape=(48, 40, 3)):
    return np.random.default_rng(seed).integers(0, 256, shape).astype(np.uint8)


def test_psnr_and_ssim_known_values():
    a = _image()
    assert metrics.psnr(a, a) == float("inf")
    assert metrics.ssim(a, a) == pytest.approx(1.0)
    # a constant offset of d on every channel moves Y by d * (65.481 + 128.553 + 24.966) / 255
    b = a.astype(np.float64) + 10.0
    dy = 10.0 * (65.481 + 128.553 + 24.966) / 255
    assert metrics.psnr(a, b) == pytest.approx(20 * np.log10(255 / dy))
    assert metrics.psnr(a, b, y_channel=False) == pytest.approx(20 * np.log10(255 / 10.0))
    with pytest.raises(ValueError, match="crop"):
        metrics.psnr(a, b, crop=30)


def test_psnr_and_ssim_equal_scikit_image():
    skm = pytest.importorskip("skimage.metrics")
    import skimage.data

    hr = skimage.data.chelsea()[:96, :128]
    noisy = np.clip(hr + np.random.default_rng(0).normal(0, 8, hr.shape), 0, 255).astype(np.uint8)
    ya, yb = (metrics.rgb_to_y(x)[4:-4, 4:-4] for x in (hr, noisy))
    assert metrics.psnr(noisy, hr, crop=4) == pytest.approx(skm.peak_signal_noise_ratio(ya, yb, data_range=255))
    assert metrics.ssim(noisy, hr, crop=4) == pytest.approx(skm.structural_similarity(
        ya, yb, gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255), abs=1e-9)


def _cfg(*overrides):
    from mindstep.train import config, recipes

    return config.resolve(recipes.defaults("esrgan"), None, TINY + list(overrides))


def test_both_phases_end_to_end_and_resume(tmp_path):
    from mindstep.train import loop

    out = tmp_path / "run"
    summary = loop.run(_cfg(), str(out), json_path=str(tmp_path / "s.json"), progress=False)
    assert set(summary["phases"]) == {"pretrain", "gan"}
    for phase in ("pretrain", "gan"):
        ev = summary["phases"][phase]["eval"]
        assert {"psnr", "ssim", "psnr_bicubic", "ssim_bicubic", "psnr_gain", "psnr_initial"} <= set(ev)
        assert np.isfinite(ev["psnr"]) and 0 < ev["ssim"] <= 1
        assert (out / phase / "samples.png").exists() and (out / phase / "curves.png").exists()
    assert json.loads((tmp_path / "s.json").read_text())["phases"]["gan"]["steps"] == 4
    # the gan phase started from the pretrain phase's weights: its initial PSNR is pretrain's final one
    assert summary["phases"]["gan"]["eval"]["psnr_initial"] == pytest.approx(
        summary["phases"]["pretrain"]["eval"]["psnr"], abs=1e-6)
    assert any("perceptual loss: off" in n for n in summary["phases"]["gan"]["notes"])
    logged = [json.loads(line) for line in (out / "gan" / "metrics.jsonl").read_text().splitlines()]
    assert any("loss/d" in r and "loss/g/adv" in r for r in logged)
    # resume the gan phase from its batch-2 checkpoint: the same final weights as the run above
    final = ms.load_checkpoint(summary["phases"]["gan"]["checkpoint"])
    (out / "gan" / "ckpt" / "batch-0000004.ckpt").unlink()
    (out / "gan" / "ckpt" / "batch-0000004.ckpt.json").unlink()
    again = loop.run(_cfg(), str(out), resume=True, phase="gan", progress=False)
    assert again["resumed_from"] == 2
    resumed = ms.load_checkpoint(again["checkpoint"])
    for name in final:
        np.testing.assert_array_equal(resumed[name].asnumpy(), final[name].asnumpy(), err_msg=name)


def test_gan_phase_needs_the_pretrain_checkpoint(tmp_path):
    from mindstep.train import loop

    with pytest.raises(ValueError, match="--phase pretrain` first"):
        loop.run(_cfg(), str(tmp_path / "fresh"), phase="gan", progress=False)
    with pytest.raises(ValueError, match="--resume: no complete checkpoint"):
        loop.run(_cfg(), str(tmp_path / "fresh"), resume=True, progress=False)


def test_perceptual_loss_with_vgg_weights(tmp_path):
    from mindstep.train import loop
    from mindstep.train.recipes.esrgan import VGGFeatures

    vgg = VGGFeatures()
    path = str(tmp_path / "vgg19.ckpt")
    ms.save_checkpoint(vgg, path)
    out = tmp_path / "run"
    loop.run(_cfg(), str(out), phase="pretrain", progress=False)
    summary = loop.run(_cfg(f"model.vgg_weights={path}", "train.steps=2"), str(out), phase="gan", progress=False)
    assert summary["notes"] == []
    logged = [json.loads(line) for line in (out / "gan" / "metrics.jsonl").read_text().splitlines()]
    assert any("loss/g/perceptual" in r for r in logged)


def test_bad_recipe_settings_are_named(tmp_path):
    from mindstep.train import config, recipes

    with pytest.raises(config.ConfigError, match="phases.gan.model|model.hr_crop"):
        recipes.build(config.phase(_cfg("model.hr_crop=18"), "gan"))
    with pytest.raises(config.ConfigError, match="--phase 'finetune'"):
        config.phase(_cfg(), "finetune")
    with pytest.raises(config.ConfigError, match="vgg_weights"):
        recipes.build(config.phase(_cfg(f"model.vgg_weights={tmp_path / 'missing.ckpt'}"), "gan"))


def test_a_folder_of_the_users_hr_images(tmp_path):
    from PIL import Image

    from mindstep.train import loop

    folder = tmp_path / "hr"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(_image(i, (40, 44, 3))).save(folder / f"img{i}.png")
    summary = loop.run(_cfg(f"data.path={folder}", "train.steps=2"), str(tmp_path / "run"), phase="pretrain",
                       progress=False)
    assert summary["steps"] == 2 and np.isfinite(summary["eval"]["psnr"])
    (folder / "img1.png").unlink()
    (folder / "img2.png").unlink()
    from mindstep.train import config, recipes

    with pytest.raises(config.ConfigError, match="at least 2"):
        recipes.build(config.phase(_cfg(f"data.path={folder}"), "pretrain"))
