import mindspore as ms
from mindspore import nn
from .nn_arch import GroverModel


class Grover:
    def __init__(self, args):
        ms.set_context(device_target=args.device_target, save_graphs=False)
        self.network = GroverModel()
        self.train_net = nn.TrainOneStepCell(self.network, args.optimizer)
