from mindspore import nn


class VRT(nn.Cell):
    def get_flow_4frames(self, flows_forward, flows_backward):
        d = flows_forward[0].shape[1]
        print("flows_forward[0].shape---", flows_forward[0].shape, "d", d)  # judged: vrt-a vrt-b
        return [flows[:, :d] for flows in flows_backward]

    def construct(self, x):
        flows_backward, flows_forward = self.spynet(x)
        return self.get_flow_4frames(flows_forward, flows_backward)
