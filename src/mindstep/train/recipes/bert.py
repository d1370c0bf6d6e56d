"""The `bert` recipe: a small BERT encoder trained with masked-language modelling.

Default corpus: `pydoc_data.topics` (Python's own documentation topics, installed with every
Python), without the lines that only draw reST rules and table borders (`-----`, `=====`,
`+---+`: they made '-' a quarter of the tokens of some topics); every 10th paragraph is held out
(a first split, every 5th whole topic, held out 7k tokens dominated by a few tables' topics).
`--data` takes any UTF-8 text file, or a folder of `.txt` files, split the same way. The vocabulary is a WordPiece one trained on the training
text with Hugging Face's `tokenizers` (the WordPiece BERT uses, trained in a fraction of a second;
MindSpore's `dataset.text.WordpieceTokenizer` needs a vocabulary and cannot train one). 15 % of the
tokens of each 64-token block are masked afresh every epoch (seed `data.seed + epoch`, so a resumed
run sees the same masks): 80 % become [MASK], 10 % a random token, 10 % stay; the held-out blocks
are masked once. The loss is the sum of the masked
tokens' cross-entropy with their count (`normalize="count"`: accumulation gives the token mean).
Eval: `mlm_accuracy` on the held-out blocks' masked tokens, against `mlm_accuracy_unigram`, always
predicting the most frequent training token.
"""
from __future__ import annotations

import os
import re
from typing import Any, Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import mindspore as ms
from mindspore import nn, ops

from ...models import BertMLM

SPECIAL = ["[PAD]", "[UNK]", "[MASK]"]


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vocab_size: int = Field(1000, ge=64)
    seq_len: int = Field(64, ge=8)
    hidden: int = Field(128, ge=8)
    layers: int = Field(2, ge=1)
    heads: int = Field(2, ge=1)
    ffn: int = Field(256, ge=8)
    mask_prob: float = Field(0.15, gt=0, lt=1)
    dropout: float = Field(0.1, ge=0, lt=1)
    factory: Optional[str] = Field(None, description="your network (token ids -> logits): 'module:callable' or './file.py:Net'")
    args: dict[str, Any] = Field(default_factory=dict, description="the factory's keyword arguments")
    init_from: Optional[str] = Field(None, description="weights to start from: a .ckpt or .safetensors file")
    init_map: Union[None, Literal["torch"], dict[str, str]] = None
    init_strict: bool = True


_RULE = re.compile(r"\s*[\-=*+|~^_:][\s\-=*+|~^_:]*")  # a rule or border line (blank lines stay)


def _clean(text):
    return "\n".join(line for line in text.splitlines() if not _RULE.fullmatch(line))


HELD_OUT_EVERY = 10


def _texts(path):
    """(training paragraphs, held-out paragraphs): every 10th paragraph (text between blank lines)
    of the corpus is held out, so both sides come from the same documents while no held-out text
    is trained on, the tokenizer included."""
    if path and os.path.isdir(path):  # a folder: its .txt files, in name order
        files = sorted(os.path.join(root, f) for root, _, names in os.walk(path) for f in names if f.endswith(".txt"))
        if not files:
            raise ValueError(f"data.path {path}: a folder without .txt files; give a text file or a folder of them")
        docs = []
        for file in files:
            with open(file, encoding="utf-8") as fh:
                docs.append(fh.read())
    elif path:
        with open(path, encoding="utf-8") as fh:
            docs = [fh.read()]
    else:
        import pydoc_data.topics as topics

        docs = [_clean(topics.topics[n]) for n in sorted(topics.topics)]
    paragraphs = [p.strip() for d in docs for p in re.split(r"\n\s*\n", d) if p.strip()]
    held = [i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 for i in range(len(paragraphs))]
    return ([p for p, h in zip(paragraphs, held) if not h], [p for p, h in zip(paragraphs, held) if h])


def tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL))
    return tok


def blocks(tok, texts, seq_len):
    ids = np.array([i for text in texts for i in tok.encode(text).ids], np.int32)
    n = len(ids) // seq_len
    return ids[:n * seq_len].reshape(n, seq_len)


def mask(ids, prob, vocab, seed):
    """(inputs, labels, weights): `weights` is 1 at the masked positions, where `labels` holds the token."""
    rng = np.random.default_rng(seed)
    chosen = rng.random(ids.shape) < prob
    roll = rng.random(ids.shape)
    inputs = ids.copy()
    inputs[chosen & (roll < 0.8)] = SPECIAL.index("[MASK]")
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = rng.integers(len(SPECIAL), vocab, int(swap.sum()))
    return inputs, np.where(chosen, ids, 0).astype(np.int32), chosen.astype(np.float32)


def shared_tokenizer(texts, vocab_size, workdir):
    """The run's tokenizer: trained once and kept as `<workdir>/tokenizer.json`. `tokenizers`'
    WordPiece trainer breaks ties differently from run to run (measured: 6 of 2,000 tokens differed
    between two trainings on the same text), so a resumed run, and every data-parallel rank, must
    read the one file rank 0 wrote, never train its own."""
    import os
    import time

    from tokenizers import Tokenizer

    from ...dist import context

    if workdir is None:
        return tokenizer(texts, vocab_size)
    path = os.path.join(workdir, "tokenizer.json")
    if not os.path.exists(path) and context.is_main():
        os.makedirs(workdir, exist_ok=True)
        tokenizer(texts, vocab_size).save(path + ".tmp")
        os.replace(path + ".tmp", path)
    deadline = time.time() + 300
    while not os.path.exists(path):
        if time.time() > deadline:
            raise RuntimeError(f"rank {context.rank()}: rank 0 wrote no {path} within 300 s")
        time.sleep(0.2)
    return Tokenizer.from_file(path)


class Recipe:
    name = "bert"
    metric = "mlm_accuracy"

    def __init__(self, cfg, workdir=None):
        self.cfg = cfg
        m = self.model_cfg = ModelConfig.model_validate(cfg.model)
        if m.hidden % m.heads:
            raise ValueError(f"model.hidden ({m.hidden}) must be a multiple of model.heads ({m.heads})")
        train_text, test_text = _texts(cfg.data.path)
        self.tok = shared_tokenizer(train_text, m.vocab_size, workdir)
        self.vocab = self.tok.get_vocab_size()
        train_ids, test_ids = blocks(self.tok, train_text, m.seq_len), blocks(self.tok, test_text, m.seq_len)
        if len(train_ids) == 0 or len(test_ids) == 0:
            raise ValueError(f"the corpus gives {len(train_ids)} training and {len(test_ids)} held-out blocks of "
                             f"model.seq_len={m.seq_len} tokens; give more text or a smaller seq_len")
        self.train_ids = train_ids
        self.train_set = self.epoch(0)
        self.test_set = mask(test_ids, m.mask_prob, self.vocab, cfg.data.seed + 1)
        counts = np.bincount(train_ids.ravel(), minlength=self.vocab)
        counts[:len(SPECIAL)] = 0
        self.unigram = int(counts.argmax())

    def columns(self):
        return ("input", "label", "weight")

    def epoch(self, epoch: int):
        """The training arrays of one epoch: the same blocks, masked afresh."""
        return mask(self.train_ids, self.model_cfg.mask_prob, self.vocab, self.cfg.data.seed + 1000 * (epoch + 1))

    def build(self):
        from .. import factory

        m = self.model_cfg
        if m.factory:
            self.net = factory.build(m.factory, m.args, {"vocab_size": self.vocab, "seq_len": m.seq_len})
        else:
            self.net = BertMLM(self.vocab, m.hidden, m.layers, m.heads, m.ffn, m.seq_len, m.dropout)
        self.init_report = factory.initialise(self.net, m)
        return self.net

    def forward(self):
        net = self.net

        def forward(inputs, labels, weights):
            logp = ops.log_softmax(net(inputs), -1)
            picked = ops.gather_elements(logp, 2, labels.expand_dims(-1)).squeeze(-1)
            return -(picked * weights).sum(), weights.sum()

        return forward

    def evaluate(self) -> dict:
        inputs, labels, weights = self.test_set
        self.net.set_train(False)
        hits = total = 0.0
        for i in range(0, len(inputs), 64):
            pred = self.net(ms.Tensor(inputs[i:i + 64])).asnumpy().argmax(-1)
            w = weights[i:i + 64]
            hits += float(((pred == labels[i:i + 64]) * w).sum())
            total += float(w.sum())
        self.net.set_train(True)
        unigram = float(((labels == self.unigram) * weights).sum() / weights.sum())
        return {"mlm_accuracy": hits / total, "mlm_accuracy_unigram": unigram}
