"""The LeNet `Model.train` script on mindstep: `TrainStep.from_net` of the same network, loss and
optimizer, driven by one iterator over both epochs (`create_tuple_iterator(num_epochs=2)`), which
reshuffles each epoch as `Model.train` does (a new iterator per epoch would replay the first
epoch's order)."""
import mindspore
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

import mindstep

mindspore.set_seed(4)
ds.config.set_seed(4)
rng = np.random.default_rng(4)
images = rng.random((64, 1, 32, 32), dtype=np.float32)
labels = rng.integers(0, 10, 64).astype(np.int32)
ds_train = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True).batch(16, drop_remainder=True)


class LeNet5(nn.Cell):
    def __init__(self, num_class=10, num_channel=1):
        super(LeNet5, self).__init__()
        self.conv1 = nn.Conv2d(num_channel, 6, 5, pad_mode='valid')
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode='valid')
        self.fc1 = nn.Dense(16 * 5 * 5, 120)
        self.fc2 = nn.Dense(120, 84)
        self.fc3 = nn.Dense(84, num_class)
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()

    def construct(self, x):
        x = self.max_pool2d(self.relu(self.conv1(x)))
        x = self.max_pool2d(self.relu(self.conv2(x)))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        x = self.fc3(x)
        return x


network = LeNet5()
net_loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction='mean')
net_opt = nn.Momentum(network.trainable_params(), 0.01, 0.9)
step = mindstep.TrainStep.from_net(network, net_loss, net_opt)
losses = []
batches = ds_train.create_tuple_iterator(num_epochs=2)
for epoch in range(2):
    for image, label in batches:
        losses.append(float(step(image, label)["loss"].asnumpy()))
