from mindspore import context
from src.model import GreedyCTCDecoder

if __name__ == "__main__":
    context.set_context(mode=context.GRAPH_MODE)
