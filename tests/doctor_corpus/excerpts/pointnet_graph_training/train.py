import mindspore as ms
from mindspore import context, nn
from src.network import PointNetCls

if __name__ == "__main__":
    context.set_context(mode=context.GRAPH_MODE)
    net = PointNetCls()
    model = ms.Model(net, nn.NLLLoss(), nn.Adam(net.trainable_params()))
    model.train(1, None)
