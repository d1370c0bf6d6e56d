"""mindstep: your MindSpore training logic as one compiled, correct, measured training step."""
from . import loss_scale
from .step import TrainStep

__version__ = "0.1.0"

__all__ = ["TrainStep", "loss_scale", "__version__"]
