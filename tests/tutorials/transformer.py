"""A Transformer language model trained as the course notebooks train one, at a tiny size: a
forward returning `(loss, logits)` for `value_and_grad(..., has_aux=True)`, and a jitted
`train_step` that clips the gradients' global norm before Adam."""
import mindspore as ms
import numpy as np
from mindspore import nn, ops

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


grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)


@ms.jit
def train_step(src, tgt):
    (loss, _), grads = grad_fn(src, tgt)
    grads = ops.clip_by_global_norm(grads, 1.0)
    optimizer(grads)
    return loss


losses = []
model.set_train()
for epoch in range(2):
    for i in range(0, len(tokens), BATCH):
        batch = tokens[i:i + BATCH]
        loss = train_step(ms.Tensor(batch[:, :-1]), ms.Tensor(batch[:, 1:]))
        losses.append(float(loss.asnumpy()))
