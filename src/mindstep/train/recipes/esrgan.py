"""The `esrgan` recipe: ×4 super-resolution, an RRDBNet generator pretrained with L1, then a GAN.

Two phases (`phases:` in esrgan.yaml; `mindstep train --phase NAME` runs one):
- ``pretrain``: the generator alone, L1 to the HR image (PSNR-oriented), a `TrainStep`;
- ``gan``: starts from the pretrain phase's newest checkpoint (`model.init_from`, by default
  `<out>/../pretrain/ckpt`) and trains the generator against a VGG-style discriminator with a
  `mindstep.GANStep`: relativistic average GAN loss (ESRGAN's RaGAN), L1 and, when the user gives
  VGG-19 weights (`model.vgg_weights`, a MindSpore checkpoint of mindcv's `vgg19`), the perceptual
  loss on conv5_4 features. Without weights the perceptual loss is off, and the run says so.

Generator: RRDBNet (`mindstep.bench.zoo.RRDBNet`, ×4: two nearest-upsampling stages), by default
small enough to train on a CPU; with `model.residual: bicubic` (the default) it predicts the
residual over the bicubic upscaling of its input (the global skip of VDSR and many later SR
networks), so it starts at bicubic quality and learns what bicubic misses; `residual: none` is
ESRGAN's plain form.

Data: a folder of HR images (`data.path`: .png/.jpg/.bmp, any size), or by default the natural
colour images shipped inside the scikit-image wheel (`skimage.data`); `chelsea` and `coffee` are
held out, the others train (grey ones as RGB). Each epoch takes fresh random HR crops with flips
(fixed by `data.seed + epoch`), and `mindspore.dataset` workers make the LR input on the fly: a
bicubic ×4 downscale (`mindspore.dataset.vision.Resize`, `Inter.BICUBIC`), and its bicubic
upscale for the residual. Evaluation: PSNR and SSIM on the Y channel with a 4-pixel border cut
(`mindstep.metrics`), for the network and for plain bicubic upscaling, on the whole held-out
images, and `samples.png` (LR / bicubic / output / HR crops side by side) in the run's folder.
"""
from __future__ import annotations

import functools
import glob
import os
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import mindspore as ms
from mindspore import nn, ops

from ...bench.zoo import RRDBNet
from ... import metrics as _metrics

HELD_OUT = ("chelsea", "coffee")
TRAIN_IMAGES = ("astronaut", "rocket", "immunohistochemistry", "hubble_deep_field", "retina", "colorwheel", "camera",
                "brick", "grass", "gravel", "moon", "coins", "clock")
SCALE = 4


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    phase: Literal["pretrain", "gan"] = "pretrain"
    nf: int = Field(32, ge=4, description="RRDBNet feature channels")
    nb: int = Field(1, ge=1, description="RRDB blocks")
    gc: int = Field(16, ge=4, description="growth channels of each dense block")
    residual: Literal["bicubic", "none"] = "bicubic"
    hr_crop: int = Field(48, ge=16, multiple_of=4, description="HR training crop side (LR: a quarter)")
    crops_per_epoch: int = Field(1024, ge=1)
    d_width: int = Field(32, ge=4, description="the discriminator's first width (doubles per stage)")
    d_lr: float = Field(1e-4, gt=0)
    d_steps_per_g: int = Field(1, ge=1)
    g_warmup: int = Field(0, ge=0)
    pixel_weight: float = Field(1.0, ge=0)
    adv_weight: float = Field(5e-3, ge=0)
    perceptual_weight: float = Field(1.0, ge=0)
    vgg_weights: Optional[str] = Field(None, description="a MindSpore checkpoint of mindcv's vgg19 (perceptual loss)")
    init_from: Optional[str] = Field(None, description="gan phase: a pretrain checkpoint or its folder")


class Generator(nn.Cell):
    """RRDBNet on the LR image, plus (``residual="bicubic"``) the bicubic upscale."""

    def __init__(self, m: ModelConfig):
        super().__init__()
        self.net = RRDBNet(m.nf, m.nb, m.gc, scale=SCALE)
        self.residual = m.residual == "bicubic"

    def construct(self, lr, up):
        out = self.net(lr)
        return out + up if self.residual else out


class Discriminator(nn.Cell):
    """ESRGAN's VGG-style discriminator: conv pairs (stride 1, then 2) with BatchNorm and LeakyReLU,
    widths doubling to 8x, then two dense layers to one logit."""

    def __init__(self, width: int, size: int):
        super().__init__()
        layers, cin = [], 3
        stages = 0
        while size // 2 ** (stages + 1) >= 4 and stages < 4:
            stages += 1
        for i in range(stages):
            w = width * 2 ** min(i, 3)
            layers += [nn.Conv2d(cin, w, 3, 1, pad_mode="pad", padding=1, has_bias=i == 0),
                       nn.LeakyReLU(0.2) if i == 0 else nn.SequentialCell(nn.BatchNorm2d(w), nn.LeakyReLU(0.2)),
                       nn.Conv2d(w, w, 4, 2, pad_mode="pad", padding=1, has_bias=False), nn.BatchNorm2d(w),
                       nn.LeakyReLU(0.2)]
            cin = w
        self.features = nn.SequentialCell(layers)
        side = size // 2 ** stages
        self.flatten = nn.Flatten()
        self.head = nn.SequentialCell(nn.Dense(cin * side * side, 100), nn.LeakyReLU(0.2), nn.Dense(100, 1))

    def construct(self, x):
        return self.head(self.flatten(self.features(x)))


# mindcv's vgg19 `features` (conv 3x3 pad 1 + ReLU, max-pools); ESRGAN's perceptual loss uses the
# conv5_4 output before its ReLU: index 34
_VGG19 = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512]


class VGGFeatures(nn.Cell):
    def __init__(self):
        super().__init__()
        layers, cin = [], 3
        for v in _VGG19:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, pad_mode="pad", padding=1, has_bias=True), nn.ReLU()]
                cin = v
        self.features = nn.SequentialCell(layers[:-1])  # up to conv5_4, before its ReLU
        self.mean = ms.Tensor(np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1))
        self.std = ms.Tensor(np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1))

    def construct(self, x):
        return self.features((x - self.mean) / self.std)


def load_vgg(path: str) -> VGGFeatures:
    """VGG-19 features with the weights of `path` (mindcv's `features.<i>.weight/bias` names);
    every conv must be found in the checkpoint."""
    if not os.path.isfile(path):
        raise ValueError(f"model.vgg_weights: {path} is not a file; give a MindSpore checkpoint of mindcv's vgg19, "
                         "or leave it empty to train without the perceptual loss")
    vgg = VGGFeatures()
    values = ms.load_checkpoint(path)
    missing = [p.name for p in vgg.get_parameters() if p.name not in values]
    if missing:
        raise ValueError(f"model.vgg_weights: {path} lacks {len(missing)} VGG-19 tensors (e.g. {missing[:3]}); "
                         "it must hold mindcv's vgg19 weights (features.<i>.weight / .bias)")
    ms.load_param_into_net(vgg, {p.name: values[p.name] for p in vgg.get_parameters()})
    for p in vgg.get_parameters():
        p.requires_grad = False
    vgg.set_train(False)
    return vgg


def _skimage_images(names):
    import skimage.data

    out = []
    for name in names:
        img = getattr(skimage.data, name)()
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=2)
        out.append(np.ascontiguousarray(img[..., :3]).astype(np.uint8))
    return out


def _folder_images(path: str):
    from PIL import Image

    files = sorted(f for ext in ("png", "jpg", "jpeg", "bmp") for f in glob.glob(os.path.join(path, f"*.{ext}")))
    if len(files) < 2:
        raise ValueError(f"data.path: {path} holds {len(files)} image(s) (.png/.jpg/.bmp); it needs at least 2 "
                         "(one is held out for evaluation)")
    images = [np.asarray(Image.open(f).convert("RGB"), dtype=np.uint8) for f in files]
    cut = max(1, len(images) // 10)  # the last tenth (at least one image) is held out
    return images[:-cut], images[-cut:]


def degrade(hr: np.ndarray):
    """HR (H, W, 3) uint8 -> (LR, bicubic upscale of LR), both uint8, by mindspore.dataset.vision."""
    import mindspore.dataset.vision as vision
    from mindspore.dataset.vision import Inter

    h, w = hr.shape[:2]
    lr = vision.Resize((h // SCALE, w // SCALE), Inter.BICUBIC)(hr)
    up = vision.Resize((h, w), Inter.BICUBIC)(lr)
    return lr, up


def _to_chw(img: np.ndarray) -> np.ndarray:
    return (img.astype(np.float32) / 255.0).transpose(2, 0, 1)


def _make_pair(hr):
    """The dataset map: an HR crop -> (lr, up, hr) as float CHW in [0, 1]."""
    lr, up = degrade(hr)
    return _to_chw(lr), _to_chw(up), _to_chw(hr)


def _to_uint8(chw: np.ndarray) -> np.ndarray:
    return np.clip(np.round(chw.transpose(1, 2, 0) * 255.0), 0, 255).astype(np.uint8)


def _ragan(real, fake, real_label: bool):
    """Relativistic average logits: D(real) - E[D(fake)] and D(fake) - E[D(real)], with BCE to
    (1, 0) for the discriminator or (0, 1) for the generator (`real_label` says which)."""
    rel_real = real - fake.mean()
    rel_fake = fake - real.mean()
    if real_label:  # discriminator: real is real, fake is fake
        return (ops.softplus(-rel_real).mean() + ops.softplus(rel_fake).mean()) * 0.5
    return (ops.softplus(rel_real).mean() + ops.softplus(-rel_fake).mean()) * 0.5


class Recipe:
    name = "esrgan"
    metric = "psnr"

    def __init__(self, cfg, workdir=None):
        self.cfg = cfg
        self.model_cfg = m = ModelConfig.model_validate(cfg.model)
        self.workdir = workdir
        if cfg.data.path:
            self.train_images, self.test_images = _folder_images(cfg.data.path)
        else:
            self.train_images, self.test_images = _skimage_images(TRAIN_IMAGES), _skimage_images(HELD_OUT)
        small = [i.shape[:2] for i in self.train_images if min(i.shape[:2]) < m.hr_crop]
        if small:
            raise ValueError(f"model.hr_crop={m.hr_crop} is larger than training images of size {small[:3]}; "
                             "lower model.hr_crop")
        if m.vgg_weights is not None and not os.path.isfile(m.vgg_weights):
            raise ValueError(f"model.vgg_weights: {m.vgg_weights} is not a file; give a MindSpore checkpoint of "
                             "mindcv's vgg19, or leave it empty (null) to train without the perceptual loss")
        self.perceptual = m.vgg_weights is not None and m.perceptual_weight > 0
        self.notes = [] if self.perceptual or m.phase != "gan" else [
            "perceptual loss: off (no model.vgg_weights given; the gan phase trains with L1 + RaGAN only)"]
        self.loss_fn = nn.L1Loss()

    # ---- data ---------------------------------------------------------------------------------
    def columns(self):
        return ("hr",)

    def transform(self):
        """The per-sample map `mindspore.dataset` runs in its workers: HR crop -> LR, bicubic, HR."""
        return _make_pair, ["hr"], ["lr", "up", "hr"]

    def epoch(self, epoch: int):
        """This epoch's random HR crops with flips, fixed by `data.seed + epoch`."""
        m = self.model_cfg
        rng = np.random.default_rng(self.cfg.data.seed * 1000 + epoch)
        crops = np.empty((m.crops_per_epoch, m.hr_crop, m.hr_crop, 3), np.uint8)
        for i in range(m.crops_per_epoch):
            img = self.train_images[rng.integers(len(self.train_images))]
            top = rng.integers(img.shape[0] - m.hr_crop + 1)
            left = rng.integers(img.shape[1] - m.hr_crop + 1)
            crop = img[top:top + m.hr_crop, left:left + m.hr_crop]
            if rng.random() < 0.5:
                crop = crop[:, ::-1]
            if rng.random() < 0.5:
                crop = crop[::-1]
            crops[i] = crop
        return (crops,)

    # ---- networks and steps -------------------------------------------------------------------
    def build(self):
        self.net = Generator(self.model_cfg)
        self.net.update_parameters_name("generator.")
        return self.net

    def forward(self):
        net, loss_fn = self.net, self.loss_fn

        def forward(lr, up, hr):
            return loss_fn(net(lr, up), hr)

        return forward

    def make_step(self, cfg, optimizer, step_kwargs):
        """The gan phase's `GANStep` (the pretrain phase uses the loop's `TrainStep`)."""
        from ... import losses as _losses
        from ...gan import GANStep

        m = self.model_cfg
        if m.phase != "gan":
            return None
        self._init_generator()
        d = Discriminator(m.d_width, m.hr_crop)
        d.update_parameters_name("discriminator.")
        self.discriminator = d
        vgg = load_vgg(m.vgg_weights) if self.perceptual else None
        l1 = self.loss_fn

        def d_loss(fake, lr, up, hr):
            return _ragan(d(hr), d(fake), real_label=True)

        def g_loss(fake, lr, up, hr):
            parts = {"l1": l1(fake, hr), "adv": _ragan(ops.stop_gradient(d(hr)), d(fake), real_label=False)}
            if vgg is not None:
                parts["perceptual"] = l1(vgg(fake), ops.stop_gradient(vgg(hr)))
            return parts

        weights = {"l1": m.pixel_weight, "adv": m.adv_weight}
        if vgg is not None:
            weights["perceptual"] = m.perceptual_weight
        g_options = {k: step_kwargs[k] for k in ("loss_scale", "clip_grad_norm", "clip_grad_value", "ema",
                                                 "lr_schedule", "on_nonfinite")}
        g_options["losses"] = _losses.weighted(weights)
        d_options = {k: step_kwargs[k] for k in ("loss_scale", "clip_grad_norm", "clip_grad_value", "on_nonfinite")}
        return GANStep(self.net, d, d_loss, g_loss, nn.Adam(d.trainable_params(), m.d_lr, beta1=0.9, beta2=0.99),
                       optimizer, g_inputs=2, d_steps_per_g=m.d_steps_per_g, g_warmup=m.g_warmup,
                       d_options=d_options, g_options=g_options, precision=step_kwargs["precision"],
                       jit=step_kwargs["jit"], optimize=step_kwargs["optimize"])

    def _init_generator(self):
        """The gan phase starts from the pretrain phase's newest complete checkpoint."""
        from ... import checkpoint

        source = self.model_cfg.init_from or (os.path.join(os.path.dirname(os.path.abspath(self.workdir)),
                                                           "pretrain", "ckpt") if self.workdir else None)
        path = checkpoint.latest(source) if source and os.path.isdir(source) else source
        if not path or not os.path.isfile(str(path)):
            raise ValueError(f"the gan phase starts from the pretrain checkpoint, but {source or '(no folder)'} has none; "
                             "run `mindstep train --recipe esrgan --phase pretrain` first (same --out), or set "
                             "model.init_from=PATH")
        checkpoint.read_manifest(path)
        values = ms.load_checkpoint(str(path))
        own = {p.name for p in self.net.get_parameters()}
        missing = sorted(own - set(values))
        if missing:
            raise ValueError(f"model.init_from: {path} lacks generator tensors {missing[:3]}: was it saved by the "
                             "pretrain phase with the same model.nf/nb/gc?")
        ms.load_param_into_net(self.net, {n: values[n] for n in own}, strict_load=True)
        self.init_checkpoint = str(path)

    # ---- evaluation ---------------------------------------------------------------------------
    @functools.cached_property
    def _held_out(self) -> list:
        """Each held-out image cut to a multiple of the scale, its LR input and bicubic upscale (as
        uint8 and as the network's input tensors), and bicubic's PSNR/SSIM: computed once per run."""
        out = []
        for img in self.test_images:
            hr = img[:img.shape[0] // SCALE * SCALE, :img.shape[1] // SCALE * SCALE]
            lr, up = degrade(hr)
            out.append({"hr": hr, "lr": lr, "up": up,
                        "inputs": (ms.Tensor(_to_chw(lr)[None]), ms.Tensor(_to_chw(up)[None])),
                        "psnr_bicubic": _metrics.psnr(up, hr, crop=SCALE),
                        "ssim_bicubic": _metrics.ssim(up, hr, crop=SCALE)})
        return out

    def evaluate(self) -> dict:
        """PSNR/SSIM (Y, 4-pixel border cut) of the network and of bicubic on the held-out images."""
        self.net.set_train(False)
        rows, first = [], None
        for item in self._held_out:
            sr = _to_uint8(self.net(*item["inputs"]).asnumpy()[0])
            rows.append((_metrics.psnr(sr, item["hr"], crop=SCALE), _metrics.ssim(sr, item["hr"], crop=SCALE),
                         item["psnr_bicubic"], item["ssim_bicubic"]))
            first = first if first is not None else (item["lr"], item["up"], sr, item["hr"])
        self.net.set_train(True)
        psnr, ssim, psnr_b, ssim_b = (float(np.mean(c)) for c in zip(*rows))
        if self.workdir:
            _sample_png(first, os.path.join(self.workdir, "samples.png"))
        return {"psnr": psnr, "ssim": ssim, "psnr_bicubic": psnr_b, "ssim_bicubic": ssim_b,
                "psnr_gain": psnr - psnr_b}


def _sample_png(sample, path: str, side: int = 96) -> None:
    """LR (nearest-upscaled) / bicubic / output / HR of a centre crop, side by side."""
    from PIL import Image

    lr, up, sr, hr = sample
    h, w = hr.shape[:2]
    top, left = (h - side) // 2 // SCALE * SCALE, (w - side) // 2 // SCALE * SCALE
    crops = [np.repeat(np.repeat(lr[top // SCALE:(top + side) // SCALE, left // SCALE:(left + side) // SCALE],
                                 SCALE, 0), SCALE, 1)]
    crops += [x[top:top + side, left:left + side] for x in (up, sr, hr)]
    row = np.concatenate([np.pad(c, ((0, 0), (0, 4), (0, 0)), constant_values=255) for c in crops], axis=1)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    Image.fromarray(np.repeat(np.repeat(row, 2, 0), 2, 1)).save(path)
