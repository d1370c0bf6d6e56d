"""`mindstep train`: recipes and YAML configs trained end to end with `TrainStep`.

What lives here: `config` (the validated configuration: sections, `key=value` overrides),
`recipes/` (each recipe's YAML defaults, data, network, forward and evaluation) and `loop` (the
run: data pipeline, progress, metrics, evaluation, checkpoints, resume, summary). It imports the
step, the checkpoints and `mindstep.dist`; nothing below it imports it.
"""
from .._extras import require as _require

_require("train", "mindstep train")

from .config import Config, ConfigError, resolve  # noqa: E402

__all__ = ["Config", "ConfigError", "resolve"]
