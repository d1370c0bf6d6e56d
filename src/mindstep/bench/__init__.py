"""`mindstep bench`: training-step modes measured side by side, each in a fresh process."""
from .runner import BenchConfig, ratios, run

__all__ = ["BenchConfig", "ratios", "run"]
