"""The Transformer notebook on mindstep: `train_step` is a `TrainStep` of the same forward, with the
notebook's clipping as `clip_grad_norm=1.0`."""
import mindspore as ms
import numpy as np
from mindspore import nn

import mindstep

ms.set_seed(5)
VOCAB, D_MODEL, SEQ, BATCH = 50, 32, 12, 8
rng = np.random.default_rng(5)
tokens = rng.integers(0, VOCAB, (6 * BATCH, SEQ + 1)).astype(np.int32)


class TransformerModel(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, D_MODEL)
        self.position = ms.Parameter(ms.Tensor(rng.standard_normal((1, SEQ, D_MODEL)).astype(np.float32) * 0.02))
        layer = nn.TransformerEncoderLayer(D_MODEL, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Dense(D_MODEL, VOCAB)

    def construct(self, src):
        x = self.embedding(src) + self.position
        return self.head(self.encoder(x))


model = TransformerModel()
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-3)


def forward_fn(src, tgt):
    logits = model(src)
    loss = loss_fn(logits.reshape(-1, VOCAB), tgt.reshape(-1))
    return loss, logits


train_step = mindstep.TrainStep(forward_fn, optimizer, clip_grad_norm=1.0)
losses = []
for epoch in range(2):
    for i in range(0, len(tokens), BATCH):
        batch = tokens[i:i + BATCH]
        loss = train_step(ms.Tensor(batch[:, :-1]), ms.Tensor(batch[:, 1:]))["loss"]
        losses.append(float(loss.asnumpy()))
