"""Experiment trackers for `fit`: where the config, the logged metrics, the evaluations and the
summary go. They write on rank 0 only (the other ranks' loggers are not called).

- `JSONLLogger` (``metrics.jsonl``: one JSON line per log and per evaluation) and `CSVLogger`
  (``metrics.csv``: one row per value, columns `batch,kind,name,value`) are on whenever `fit` has
  an `out` folder;
- `TensorBoardLogger` (tensorboardX's event files in ``<out>/tb``; ``pip install "mindstep[tensorboard]"``), read by TensorBoard;
- `MLflowLogger` (MLflow's tracking API; by default its local file store ``<out>/mlruns``;
  ``pip install "mindstep[mlflow]"``).

Each is opened with the run's folder and, for a resumed run, the batch it resumes from (`open(out,
resumed)`): what was logged after that checkpoint is dropped (the file loggers rewrite their files,
TensorBoard purges the later events, MLflow continues the same run), so the logs read as one
uninterrupted run; a fresh run starts its files over and a new MLflow run. Then the config once
(`log_config`), `log(kind, batch, values)` with kind ``"train"`` or ``"eval"``, `log_summary`, `close`.
`read_scalars(logdir)` reads TensorBoard's event files back without TensorBoard.
"""
from __future__ import annotations

import csv
import json
import os

from .._extras import require as _require


def _numbers(values: dict) -> dict:
    out = {}
    for k, v in values.items():
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            continue
    return out


class Logger:
    """The interface; every method does nothing by default."""

    def open(self, out: str | None, resumed: int | None) -> None:
        """Called once with `fit`'s `out` folder (None when it has none) and, for a resumed run, the
        batch it resumes from: what was logged after it is dropped; None: a fresh run, which starts
        its logs over."""

    def log_config(self, config: dict) -> None: ...

    def log(self, kind: str, batch: int, values: dict) -> None: ...

    def log_summary(self, summary: dict) -> None: ...

    def close(self) -> None: ...


class _FileLogger(Logger):
    """A line-per-record file in `out`: emptied by a fresh run, cut back to the resumed batch by a
    resumed one (its `header` line kept), then appended to."""

    header: str | None = None

    def __init__(self, name: str):
        self.name, self.path, self.fh = name, None, None

    def _batch(self, line: str) -> int:
        """The batch a record line was logged at."""
        raise NotImplementedError

    def open(self, out, resumed):
        if out is None:
            raise ValueError(f"{type(self).__name__} writes into fit's out folder; pass fit(..., out=FOLDER)")
        self.path = os.path.join(out, self.name)
        lines = []
        if resumed is not None and os.path.exists(self.path):
            with open(self.path, newline="") as fh:
                lines = fh.readlines()[1 if self.header else 0:]
        with open(self.path, "w", newline="") as fh:
            fh.write(self.header or "")
            fh.writelines(line for line in lines if self._batch(line) <= resumed)
        self.fh = open(self.path, "a", newline="")

    def close(self):
        if self.fh is not None:
            self.fh.close()
            self.fh = None


class JSONLLogger(_FileLogger):
    """``metrics.jsonl``: ``{"batch": N, <train values>}`` per log, ``{"batch": N, "eval": {...}}``
    per evaluation."""

    def __init__(self, name: str = "metrics.jsonl"):
        super().__init__(name)

    def _batch(self, line):
        return json.loads(line).get("batch", 0)

    def log(self, kind, batch, values):
        record = {"batch": batch, **values} if kind == "train" else {"batch": batch, kind: values}
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()


class CSVLogger(_FileLogger):
    """``metrics.csv``: one row per value, `batch,kind,name,value` (long form: train logs and
    evaluations carry different names; `pandas.pivot` makes it wide)."""

    FIELDS = ("batch", "kind", "name", "value")
    header = ",".join(FIELDS) + "\r\n"  # as csv.writer writes it

    def __init__(self, name: str = "metrics.csv"):
        super().__init__(name)

    def _batch(self, line):
        return int(line.split(",", 1)[0])

    def log(self, kind, batch, values):
        csv.writer(self.fh).writerows([batch, kind, k, repr(v)] for k, v in _numbers(values).items())
        self.fh.flush()


class TensorBoardLogger(Logger):
    """TensorBoard event files in `<out>/<subdir>` through tensorboardX: scalars ``train/<name>``
    and ``eval/<name>`` against the batch count, the config as text, the summary's numbers as
    ``summary/<name>``."""

    def __init__(self, subdir: str = "tb"):
        _require("tensorboard", "TensorBoardLogger")
        self.subdir, self.writer, self.purge = subdir, None, None

    def open(self, out, resumed):
        if out is None:
            raise ValueError("TensorBoardLogger writes into fit's out folder; pass fit(..., out=FOLDER)")
        self.logdir = os.path.join(out, self.subdir)
        self.purge = None if resumed is None else resumed + 1

    def _writer(self):
        if self.writer is None:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(self.logdir, purge_step=self.purge)
        return self.writer

    def log_config(self, config):
        self._writer().add_text("config", "```\n" + json.dumps(config, indent=1, default=repr) + "\n```", 0)

    def log(self, kind, batch, values):
        w = self._writer()
        for k, v in _numbers(values).items():
            w.add_scalar(f"{kind}/{k}", v, batch)

    def log_summary(self, summary):
        w = self._writer()
        for k, v in _numbers(summary).items():
            w.add_scalar(f"summary/{k}", v, 0)
        w.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class MLflowLogger(Logger):
    """One MLflow run: the config as parameters, metrics ``train/<name>`` and ``eval/<name>`` with
    the batch count as MLflow's step, the summary's numbers as ``summary/<name>``. `tracking_uri`
    defaults to a local file store in `<out>/mlruns` (MLflow 3 keeps that store in maintenance mode
    and wants ``MLFLOW_ALLOW_FILE_STORE=true``, which this logger sets when you left it unset); a resumed run continues the same MLflow run
    (its id is kept in `<out>/mlflow_run_id`)."""

    def __init__(self, experiment: str = "mindstep", tracking_uri: str | None = None, run_name: str | None = None):
        _require("mlflow", "MLflowLogger")
        self.experiment, self.tracking_uri, self.run_name = experiment, tracking_uri, run_name
        self.client, self.run_id = None, None

    def open(self, out, resumed):
        from mlflow.tracking import MlflowClient

        uri = self.tracking_uri
        if uri is None:
            uri = "file:" + os.path.abspath(os.path.join(out or ".", "mlruns"))
            # MLflow 3.x keeps its file store in maintenance mode and refuses it unless told otherwise;
            # it still writes and reads it (pass tracking_uri="sqlite:///..." for a database store)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        id_file = os.path.join(out, "mlflow_run_id") if out else None
        if resumed is not None and id_file and os.path.exists(id_file):  # a fresh run is a new MLflow run
            with open(id_file) as fh:
                self.run_id = fh.read().strip()
            return
        exp = self.client.get_experiment_by_name(self.experiment)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(self.experiment)
        self.run_id = self.client.create_run(exp_id, run_name=self.run_name).info.run_id
        if id_file:
            with open(id_file, "w") as fh:
                fh.write(self.run_id)

    def log_config(self, config):
        flat = {}

        def walk(prefix, value):
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
            else:
                flat[prefix] = str(value)[:500]

        walk("", config)
        existing = self.client.get_run(self.run_id).data.params
        for k, v in flat.items():
            if k not in existing:
                self.client.log_param(self.run_id, k, v)

    def log(self, kind, batch, values):
        for k, v in _numbers(values).items():
            self.client.log_metric(self.run_id, f"{kind}/{k}", v, step=batch)

    def log_summary(self, summary):
        for k, v in _numbers(summary).items():
            self.client.log_metric(self.run_id, f"summary/{k}", v)

    def close(self):
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id)
            self.client = None


def read_scalars(logdir) -> dict:
    """{(tag, step): value} of every scalar in the TensorBoard event files of `logdir` (their
    records read with tensorboardX's own protobufs: 8-byte length, 4-byte CRC, the event, 4-byte CRC)."""
    import struct

    from tensorboardX.proto import event_pb2

    out = {}
    for name in sorted(os.listdir(logdir)):
        with open(os.path.join(logdir, name), "rb") as fh:
            data = fh.read()
        i = 0
        while i < len(data):
            n = struct.unpack("<Q", data[i:i + 8])[0]
            event = event_pb2.Event()
            event.ParseFromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            out.update(((v.tag, event.step), v.simple_value) for v in event.summary.value)
    return out


NAMES = {"jsonl": JSONLLogger, "csv": CSVLogger, "tensorboard": TensorBoardLogger, "mlflow": MLflowLogger}


def as_loggers(loggers) -> list:
    """`loggers=` as Logger instances: instances, or names from `NAMES`."""
    from .._errors import bad_type

    if isinstance(loggers, (Logger, str)):
        loggers = [loggers]
    out = []
    for i, lg in enumerate(loggers):
        if isinstance(lg, str):
            if lg not in NAMES:
                raise bad_type(f"loggers[{i}]", lg, f"a Logger or one of {', '.join(NAMES)}",
                               "Example: loggers=['tensorboard'] or loggers=[TensorBoardLogger('tb')].")
            lg = NAMES[lg]()
        if not isinstance(lg, Logger):
            raise bad_type(f"loggers[{i}]", lg, "a mindstep.loop.Logger instance or a name ('tensorboard', 'mlflow')",
                           "Example: loggers=[mindstep.loop.TensorBoardLogger()].")
        out.append(lg)
    return out
