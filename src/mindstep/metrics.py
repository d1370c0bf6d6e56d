"""Image-quality metrics of the super-resolution literature, in numpy: PSNR and SSIM on the Y channel.

As in the SR papers (and BasicSR's `calculate_psnr`/`calculate_ssim` with `test_y_channel=True`):
images are uint8-range RGB arrays (H, W, 3); the luma is ITU-R BT.601's
``Y = 16 + (65.481 R + 128.553 G + 24.966 B) / 255`` (R, G, B in [0, 255]); `crop` pixels are cut
from every border (the scale factor, by convention) before comparing. SSIM is Wang et al. (2004):
an 11x11 Gaussian window of sigma 1.5, K1 = 0.01, K2 = 0.03, data range 255, the mean over the
valid positions (scikit-image's `structural_similarity(gaussian_weights=True, sigma=1.5,
use_sample_covariance=False, data_range=255)` computes the same and the tests compare to it).
"""
from __future__ import annotations

import numpy as np

from ._errors import bad_value


def rgb_to_y(image: np.ndarray) -> np.ndarray:
    """BT.601 luma (16-235) of an RGB image in [0, 255], as float64."""
    image = np.asarray(image, dtype=np.float64)
    if image.ndim != 3 or image.shape[-1] != 3:
        raise bad_value("image", image.shape, "an RGB array of shape (H, W, 3)", "Pass HWC images (transpose CHW ones).")
    return 16.0 + (65.481 * image[..., 0] + 128.553 * image[..., 1] + 24.966 * image[..., 2]) / 255.0


def _prepare(a, b, crop: int, y_channel: bool):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise bad_value("b", b.shape, f"the shape of a {a.shape}", "Compare images of the same size.")
    if y_channel and a.ndim == 3:
        a, b = rgb_to_y(a), rgb_to_y(b)
    if crop:
        if min(a.shape[:2]) <= 2 * crop:
            raise bad_value("crop", crop, f"less than half the image's side ({a.shape[:2]})", "Lower crop.")
        a, b = a[crop:-crop, crop:-crop], b[crop:-crop, crop:-crop]
    return a, b


def psnr(a, b, *, crop: int = 0, y_channel: bool = True) -> float:
    """Peak signal-to-noise ratio in dB of two uint8-range images (inf when they are equal)."""
    a, b = _prepare(a, b, crop, y_channel)
    mse = np.mean((a - b) ** 2)
    return float("inf") if mse == 0 else float(10.0 * np.log10(255.0 ** 2 / mse))


def _gaussian_filter(x: np.ndarray, size: int = 11, sigma: float = 1.5) -> np.ndarray:
    """'valid' 2-D correlation with a normalised Gaussian window (separable)."""
    r = np.arange(size) - (size - 1) / 2
    g = np.exp(-(r ** 2) / (2 * sigma ** 2))
    g /= g.sum()
    rows = np.apply_along_axis(lambda v: np.convolve(v, g, mode="valid"), 0, x)
    return np.apply_along_axis(lambda v: np.convolve(v, g, mode="valid"), 1, rows)


def ssim(a, b, *, crop: int = 0, y_channel: bool = True) -> float:
    """Structural similarity of two uint8-range images (1.0 when equal); colour images are the mean
    over channels unless `y_channel`."""
    a, b = _prepare(a, b, crop, y_channel)
    if a.ndim == 3:
        return float(np.mean([ssim(a[..., c], b[..., c], y_channel=False) for c in range(a.shape[-1])]))
    if min(a.shape) < 11:
        raise bad_value("image", a.shape, "images at least 11x11 after the crop", "Use larger images or a smaller crop.")
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mu_a, mu_b = _gaussian_filter(a), _gaussian_filter(b)
    var_a = _gaussian_filter(a * a) - mu_a ** 2
    var_b = _gaussian_filter(b * b) - mu_b ** 2
    cov = _gaussian_filter(a * b) - mu_a * mu_b
    num = (2 * mu_a * mu_b + c1) * (2 * cov + c2)
    den = (mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2)
    return float(np.mean(num / den))
