import mindspore as ms
from mindaudio.models.fastspeech2.variance_adapter import LengthRegulator


def main(args):
    mode = ms.context.PYNATIVE_MODE if args.context_mode == "py" else ms.context.GRAPH_MODE
    ms.context.set_context(mode=mode, device_target=args.device_target)
