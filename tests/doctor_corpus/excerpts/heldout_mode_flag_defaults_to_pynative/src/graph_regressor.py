from mindspore import nn


class GraphRegressor(nn.Cell):
    def construct(self, batch):
        edges, nodes = self.model(batch)
        res = {"edges": edges, "nodes": nodes}
        res.update(self.graph_head(batch, nodes))  # judged: orb-a
        res.update(self.stress_head(batch, nodes))  # judged: orb-b
        res.update(self.node_head(batch, nodes))  # judged: orb-c
        return res
