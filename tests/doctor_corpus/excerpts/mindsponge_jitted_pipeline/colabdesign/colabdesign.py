from mindspore import jit, context, mutable, Tensor


class COLABDESIGN:
    def __init__(self):
        context.set_context(memory_optimize_level="O1", max_call_depth=6000)

    def train_step(self, data, epochs):
        best = 999
        for epoch in range(epochs):
            inputs_feats = mutable([Tensor(feat) for feat in data])
            loss = self._jit_forward(inputs_feats)
            if loss < best:
                best = loss
                inputs_feats = [Tensor(feat) for feat in data]
                final_seq = self._jit_forward(inputs_feats)  # judged: colabdesign
        return final_seq

    @jit
    def _jit_forward(self, data):
        return self.train_net(*data)
