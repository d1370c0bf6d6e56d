from mindspore import context
from src.model import AnalogyModel
from base_net import GradReverse


def main(args):
    if args.device == "CPU":
        context.set_context(mode=context.PYNATIVE_MODE, device_target="CPU")
    else:
        context.set_context(mode=context.GRAPH_MODE, device_target="Ascend")
