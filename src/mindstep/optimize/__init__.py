"""The composed-operator pass: faster formulations of slow native layers, chosen by measurement."""
from .conv import GemmConv2d
from .pass_ import optimize, render

__all__ = ["GemmConv2d", "optimize", "render"]
