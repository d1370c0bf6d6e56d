"""mindstep: your MindSpore training logic as one compiled, correct, measured training step.

Quiet by default: unless you set `GLOG_v` yourself, importing mindstep before MindSpore sets
MindSpore's C++ log level to errors-only-when-fatal (`GLOG_v=4`), so its plugin warnings and the
C++ call stacks it prints beside an exception stay out of your terminal; mindstep's own errors
carry MindSpore's message. `GLOG_v=2` (MindSpore's default) or `mindstep --verbose` shows them.
The public names load lazily, so `mindstep --help` and `--version` answer without importing
MindSpore.
"""
import importlib as _importlib
import os as _os
import sys as _sys
import types as _types
from typing import TYPE_CHECKING as _TYPE_CHECKING

#: whether the user set GLOG_v (then mindstep never touches it)
_USER_GLOG = "GLOG_v" in _os.environ
if not _USER_GLOG and "mindspore" not in _sys.modules:
    _os.environ["GLOG_v"] = "4"

__version__ = "0.1.0"

# public name -> the submodule that defines it
_NAMES = {"Dropout": "dropout", "resumable_dropout": "dropout", "NetworkWarning": "_discover",
          "NonFiniteError": "nonfinite", "PortingWarning": "_porting", "param_groups": "groups", "optimize": "optimize",
          "Precision": "precision", "TrainStep": "step", "GANStep": "gan", "init_distributed": "dist", "shard_args": "dist",
          "is_main": "dist", "fit": "loop"}

__all__ = ["Dropout", "GANStep", "NetworkWarning", "NonFiniteError", "PortingWarning", "Precision", "TrainStep", "checkpoint", "dist",
           "fit", "gan", "init_distributed", "is_main", "loop", "loss_scale", "losses", "optimize", "param_groups", "resumable_dropout",
           "schedules", "shard_args", "__version__"]

if _TYPE_CHECKING:  # what the lazy exports resolve to, for type checkers and API-doc generators
    from . import checkpoint, dist, gan, loop, loss_scale, losses, schedules
    from ._discover import NetworkWarning
    from ._porting import PortingWarning
    from .dist import init_distributed, is_main, shard_args
    from .dropout import Dropout, resumable_dropout
    from .gan import GANStep
    from .groups import param_groups
    from .loop import fit
    from .nonfinite import NonFiniteError
    from .optimize import optimize
    from .precision import Precision
    from .step import TrainStep


def __getattr__(name):
    if name in _NAMES:
        value = getattr(_importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    else:
        try:  # the public submodules and every other one (`mindstep.clip`, ...)
            value = _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'mindstep' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


class _Package(_types.ModuleType):
    """Keeps `mindstep.optimize` the function: importing the submodule of the same name (which
    the step does) would otherwise rebind the package attribute to the module."""

    def __setattr__(self, name, value):
        if name in _NAMES and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
