from mindspore import context, Model
from models.dense_cnn import DPNet
from src.edsr_slim import EDSR

context.set_context(mode=context.PYNATIVE_MODE, device_target='GPU')
Model(DPNet()).train(1, None)
