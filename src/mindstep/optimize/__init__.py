"""The composed-operator pass: faster formulations of slow native layers, chosen by measurement."""
from .conv import GemmConv2d
from .cross_entropy import ComposedCrossEntropy
from .gelu import ComposedGELU
from .layernorm import ComposedLayerNorm
from .pass_ import optimize, render

__all__ = ["ComposedCrossEntropy", "ComposedGELU", "ComposedLayerNorm", "GemmConv2d", "optimize", "render"]
