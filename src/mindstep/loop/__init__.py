"""The training loop as a library: `mindstep.fit` and what it calls.

`fit(step, train_data, ...)` (`mindstep.loop.fit`) trains a `TrainStep` or `GANStep` on a
`mindspore.dataset` pipeline, a re-iterable of batches or a callable `epoch -> batches`, with
logging, evaluation (EMA weights, merged over data-parallel ranks), checkpoints that record the
data position, exact resume, callbacks and experiment trackers. `mindstep train` runs it.

Modules: `data` (the three kinds of training data, sharding and seeking), `evaluate` (`Mean`,
the built-in `classification` and `loss` evaluators), `callbacks` (the events and
`EarlyStopping`, `ReduceLROnPlateau`, `BestCheckpoint`), `loggers` (JSONL, CSV, TensorBoard,
MLflow), `progress` (the bar), `fit` (the loop).
"""
from .callbacks import BestCheckpoint, Callback, EarlyStopping, ReduceLROnPlateau
from .data import ResumeWarning
from .evaluate import Mean, classification, loss
from .fit import Loop, fit
from .loggers import CSVLogger, JSONLLogger, Logger, MLflowLogger, TensorBoardLogger

__all__ = ["BestCheckpoint", "CSVLogger", "Callback", "EarlyStopping", "JSONLLogger", "Logger", "Loop", "MLflowLogger",
           "Mean", "ReduceLROnPlateau", "ResumeWarning", "TensorBoardLogger", "classification", "fit", "loss"]
