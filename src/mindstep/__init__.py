"""mindstep: your MindSpore training logic as one compiled, correct, measured training step."""
from . import loss_scale, losses, schedules
from ._discover import NetworkWarning
from .groups import param_groups
from .optimize import optimize
from .precision import Precision
from .step import TrainStep

__version__ = "0.1.0"

__all__ = ["NetworkWarning", "Precision", "TrainStep", "loss_scale", "losses", "optimize", "param_groups", "schedules", "__version__"]
