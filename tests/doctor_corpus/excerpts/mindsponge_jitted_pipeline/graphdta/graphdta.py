from mindspore import jit, context


class GraphDTA:
    def __init__(self, config):
        context.set_context(device_target="Ascend")
        self.use_jit = config.use_jit

    def forward(self, data):
        feat = []
        for key in self.feature_list:
            feat.append(data[key])
        if self.use_jit:
            out = self._jit_forward(feat)  # judged: graphdta
        else:
            out = self.network(*feat)
        return out

    @jit
    def _jit_forward(self, data):
        return self.network(*data)
