from mindspore import context
from src.models.APDrawingGAN_D import Discriminator
from src.utils import BilinearSim
context.set_context(mode=context.GRAPH_MODE)
