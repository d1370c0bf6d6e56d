"""Small built-in models for tests, the demo, the bench and the recipes (device-agnostic MindSpore Cells)."""
from __future__ import annotations

import math

import mindspore as ms
from mindspore import nn, ops


class MLP(nn.Cell):
    """A two-layer perceptron: Dense -> ReLU -> Dense."""

    def __init__(self, in_features: int = 32, hidden: int = 64, out_features: int = 10):
        super().__init__()
        self.fc1 = nn.Dense(in_features, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Dense(hidden, out_features)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ConvNet(nn.Cell):
    """A small conv net with BatchNorm: two 3x3 conv blocks, global pooling, a linear head."""

    def __init__(self, in_channels: int = 3, width: int = 16, num_classes: int = 10):
        super().__init__()
        self.features = nn.SequentialCell(
            nn.Conv2d(in_channels, width, 3, pad_mode="same", has_bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, pad_mode="same", has_bias=True),
            nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.head = nn.Dense(2 * width, num_classes)

    def construct(self, x):
        return self.head(self.flatten(self.pool(self.features(x))))


def seeded(factory, seed: int = 0, **kwargs) -> nn.Cell:
    """Build `factory(**kwargs)` after `ms.set_seed(seed)`, so two builds start from the same weights."""
    ms.set_seed(seed)
    return factory(**kwargs)


# ---- BERT-style encoder with an MLM head, small by default ------------------------------------
class Attention(nn.Cell):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.dk = heads, hidden // heads
        self.qkv = nn.Dense(hidden, 3 * hidden)
        self.out = nn.Dense(hidden, hidden)
        self.scale = 1.0 / math.sqrt(self.dk)

    def construct(self, x):
        # q, k, v split off the projection's last axis (a `Split`), each then moved to (b, heads, s, dk):
        # indexing q, k, v out of one transposed (3, b, heads, s, dk) tensor ran as `StridedSlice`s that
        # took a fifth of the composed BERT step (docs/design/measurements.md)
        b, s, h = x.shape
        q, k, v = ops.split(self.qkv(x), h, axis=-1)
        q = q.reshape(b, s, self.heads, self.dk).transpose(0, 2, 1, 3)
        k = k.reshape(b, s, self.heads, self.dk).transpose(0, 2, 3, 1)
        v = v.reshape(b, s, self.heads, self.dk).transpose(0, 2, 1, 3)
        att = ops.softmax(ops.matmul(q, k) * self.scale, -1)
        ctx = ops.matmul(att, v).transpose(0, 2, 1, 3).reshape(b, s, h)
        return self.out(ctx)

    def extra_flops(self, x_shape):
        b, s, h = x_shape
        return 2 * 2 * b * s * s * h  # QK^T and att@V


def _dropout(p: float):
    """`mindstep.Dropout` (resumable: its state is checkpointed) for p > 0, else nothing."""
    from .dropout import Dropout

    return Dropout(p) if p > 0 else nn.Identity()


class EncoderLayer(nn.Cell):
    def __init__(self, hidden, heads, ffn, dropout: float = 0.0):
        super().__init__()
        self.att = Attention(hidden, heads)
        self.ln1 = nn.LayerNorm((hidden,))
        self.ff = nn.SequentialCell(nn.Dense(hidden, ffn), nn.GELU(), nn.Dense(ffn, hidden))
        self.ln2 = nn.LayerNorm((hidden,))
        self.drop1, self.drop2 = _dropout(dropout), _dropout(dropout)

    def construct(self, x):
        x = self.ln1(x + self.drop1(self.att(x)))
        return self.ln2(x + self.drop2(self.ff(x)))


class BertMLM(nn.Cell):
    def __init__(self, vocab=1000, hidden=128, layers=2, heads=2, ffn=512, max_len=512, dropout: float = 0.0):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_len, hidden)
        self.drop = _dropout(dropout)
        self.layers = nn.SequentialCell([EncoderLayer(hidden, heads, ffn, dropout) for _ in range(layers)])
        self.head = nn.Dense(hidden, vocab)
        self.vocab = vocab

    def construct(self, ids):
        pos = ops.arange(ids.shape[1]).astype(ms.int32).reshape(1, -1)
        x = self.drop(self.tok(ids) + self.pos(pos))
        return self.head(self.layers(x))


class MLMLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.ce = nn.CrossEntropyLoss()

    def construct(self, logits, labels):
        return self.ce(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
