import mindspore as ms
from mindcv.models import create_model


def train(args):
    ms.set_context(mode=args.mode)
    net = create_model(args.model)
    ms.Model(net).train(args.epochs, None)


if __name__ == "__main__":
    train(None)
