import mindspore as ms
from nets.GSFF import Decoder
from network2 import CDANNet
if __name__ == '__main__':
    ms.set_context(mode=1, device_target="CPU")
