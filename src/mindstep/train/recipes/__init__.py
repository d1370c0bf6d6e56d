"""The recipes `mindstep train --recipe NAME` runs: each a YAML of defaults beside its module."""
from __future__ import annotations

import importlib
import os

NAMES = ("resnet", "bert", "esrgan")


def defaults(name: str) -> dict:
    from ..config import ConfigError, load_yaml

    if name not in NAMES:
        raise ConfigError(f"recipe {name!r} does not exist; recipes: {', '.join(NAMES)}. Pass --recipe "
                          f"{NAMES[0]}, or --config FILE.yaml with `recipe: {NAMES[0]}`.")
    return load_yaml(os.path.join(os.path.dirname(__file__), f"{name}.yaml"))


def build(cfg, workdir=None):
    """The recipe object for a validated config; `workdir`: the run's folder, for what a recipe
    keeps with the run (the bert recipe's tokenizer); None only checks the recipe's settings."""
    from pydantic import ValidationError

    from ..config import ConfigError

    module = importlib.import_module(f"{__name__}.{cfg.recipe}")
    try:
        return module.Recipe(cfg, workdir)
    except ValidationError as err:
        lines = [f"model.{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e.get('input')!r}); valid keys: "
                 f"{', '.join(module.ModelConfig.model_fields)}" for e in err.errors()]
        raise ConfigError("\n".join(lines)) from None
    except ValueError as err:
        raise ConfigError(str(err)) from None

# the staged report (mindstep.bench.stages): the quality target each stage is timed to, and the
# Cells the recomputation stage recomputes
TARGETS = {"resnet": ("accuracy", 0.9), "bert": ("mlm_accuracy", 0.12), "esrgan": ("psnr_gain", 0.0)}
RECOMPUTE = {"resnet": ["blocks.?"], "bert": ["layers.?"], "esrgan": ["net.trunk.?"]}
STAGE_STEPS = {"resnet": 200, "bert": 300, "esrgan": 60}
