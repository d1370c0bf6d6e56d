import argparse
import mindspore as ms
from mindspore import context
from src.graph_regressor import GraphRegressor


def run(args):
    model = GraphRegressor()
    grad_fn = ms.value_and_grad(model.loss, None, model.trainable_params(), has_aux=True)
    return grad_fn


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", type=str, default="PYNATIVE", choices=["GRAPH", "PYNATIVE"])
    args = parser.parse_args()
    ms.set_context(mode=context.GRAPH_MODE if args.mode.upper().startswith("GRAPH") else context.PYNATIVE_MODE)
    run(args)
