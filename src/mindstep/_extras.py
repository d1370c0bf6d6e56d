"""Optional dependencies: what each extra of `pip install "mindstep[...]"` brings, and one clear error
when a feature's extra is not installed.

The core install carries what the training step, `mindstep env`, `doctor`, `bench` and `launch` need;
`mindstep train` and its recipes, and the bench's plots, need more.
"""
from __future__ import annotations

import importlib.util
import sys

#: extra -> (import name, distribution name) of each package it adds
EXTRAS = {
    "train": (("pydantic", "pydantic"), ("yaml", "pyyaml"), ("matplotlib", "matplotlib"),
              ("sklearn", "scikit-learn"), ("tokenizers", "tokenizers"), ("skimage", "scikit-image"),
              ("PIL", "pillow")),
    "bench": (("matplotlib", "matplotlib"),),
    "tensorboard": (("tensorboardX", "tensorboardX"),),
    "mlflow": (("mlflow", "mlflow-skinny"),),
}


class MissingExtraError(ImportError):
    """A feature needs packages of an extra that is not installed; the message gives the pip line."""


def require(extra: str, what: str) -> None:
    """Check that the packages of `extra`, which `what` needs, are installed, without importing them,
    or raise one `MissingExtraError` naming what is missing and the `pip install "mindstep[extra]"` line."""
    missing = [dist for module, dist in EXTRAS[extra] if not _installed(module)]
    if missing:
        raise MissingExtraError(
            f"{what} needs {', '.join(missing)}, which mindstep installs with its '{extra}' extra: "
            f"pip install \"mindstep[{extra}]\"", name=missing[0])


def _installed(module: str) -> bool:
    if module in sys.modules:  # None there: an import that is known to fail
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
