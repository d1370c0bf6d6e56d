"""The composed-operator pass: faster formulations of slow native layers, chosen by measurement."""
from .conv import GemmConv2d
from .gelu import ComposedGELU
from .pass_ import optimize, render

__all__ = ["ComposedGELU", "GemmConv2d", "optimize", "render"]
