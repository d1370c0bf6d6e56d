"""The recipes `mindstep train --recipe NAME` runs: each a YAML of defaults beside its module."""
from __future__ import annotations

import importlib
import os

NAMES = ("resnet",)


def defaults(name: str) -> dict:
    from ..config import ConfigError, load_yaml

    if name not in NAMES:
        raise ConfigError(f"recipe {name!r} does not exist; recipes: {', '.join(NAMES)}. Pass --recipe "
                          f"{NAMES[0]}, or --config FILE.yaml with `recipe: {NAMES[0]}`.")
    return load_yaml(os.path.join(os.path.dirname(__file__), f"{name}.yaml"))


def build(cfg):
    """The recipe object for a validated config."""
    from pydantic import ValidationError

    from ..config import ConfigError

    module = importlib.import_module(f"{__name__}.{cfg.recipe}")
    try:
        return module.Recipe(cfg)
    except ValidationError as err:
        lines = [f"model.{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e.get('input')!r}); valid keys: "
                 f"{', '.join(module.ModelConfig.model_fields)}" for e in err.errors()]
        raise ConfigError("\n".join(lines)) from None
    except ValueError as err:
        raise ConfigError(str(err)) from None
