"""mindstep: your MindSpore training logic as one compiled, correct, measured training step."""
from . import checkpoint, loss_scale, losses, schedules
from ._discover import NetworkWarning
from .dropout import Dropout, resumable_dropout
from .nonfinite import NonFiniteError
from .groups import param_groups
from .optimize import optimize
from .precision import Precision
from .step import TrainStep

__version__ = "0.1.0"

__all__ = ["Dropout", "NetworkWarning", "NonFiniteError", "Precision", "TrainStep", "checkpoint", "loss_scale", "losses", "optimize",
           "param_groups", "resumable_dropout", "schedules", "__version__"]
