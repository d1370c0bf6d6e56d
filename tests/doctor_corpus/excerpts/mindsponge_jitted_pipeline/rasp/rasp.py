from mindspore import jit, context
from .nn_arch import RaspNet


class RASP:
    def __init__(self, config):
        context.set_context(memory_optimize_level="O1", max_call_depth=6000)
        self.network = RaspNet(config)

    @jit
    def _jit_forward(self, data):
        return self.network(*data)
