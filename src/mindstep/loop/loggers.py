"""Experiment trackers for `fit`: where the config, the logged metrics, the evaluations and the
summary go. They write on rank 0 only (the other ranks' loggers are not called).

- `JSONLLogger` (``metrics.jsonl``: one JSON line per log and per evaluation) and `CSVLogger`
  (``metrics.csv``: one row per value, columns `batch,kind,name,value`) are on whenever `fit` has
  an `out` folder;
- `TensorBoardLogger` (tensorboardX's event files in ``<out>/tb``; ``pip install "mindstep[tensorboard]"``), read by TensorBoard;
- `MLflowLogger` (MLflow's tracking API; by default its local file store ``<out>/mlruns``;
  ``pip install "mindstep[mlflow]"``).

Each takes the config once (`log_config`), then `log(kind, batch, values)` with kind ``"train"``
or ``"eval"``, then `log_summary` and `close`. A resumed run first calls `truncate(batch)`: what
was logged after the checkpoint it resumes from is dropped (the file loggers rewrite their files;
TensorBoard purges the later events), so the logs read as one uninterrupted run.
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

    def open(self, out: str | None) -> None:
        """Called once with `fit`'s `out` folder (None when it has none)."""

    def truncate(self, batch: int) -> None:
        """Drop what was logged after `batch` (a resume)."""

    def log_config(self, config: dict) -> None: ...

    def log(self, kind: str, batch: int, values: dict) -> None: ...

    def log_summary(self, summary: dict) -> None: ...

    def close(self) -> None: ...


class JSONLLogger(Logger):
    """``metrics.jsonl``: ``{"batch": N, <train values>}`` per log, ``{"batch": N, "eval": {...}}``
    per evaluation."""

    def __init__(self, name: str = "metrics.jsonl"):
        self.name, self.path, self.fh = name, None, None

    def open(self, out):
        if out is None:
            raise ValueError("JSONLLogger writes into fit's out folder; pass fit(..., out=FOLDER)")
        self.path = os.path.join(out, self.name)
        self.fh = open(self.path, "a")

    def truncate(self, batch):
        self.fh.close()
        records = []
        if os.path.exists(self.path):
            with open(self.path) as fh:
                records = [r for r in map(json.loads, fh) if r.get("batch", 0) <= batch]
        with open(self.path, "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
        self.fh = open(self.path, "a")

    def log(self, kind, batch, values):
        record = {"batch": batch, **values} if kind == "train" else {"batch": batch, kind: values}
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()

    def close(self):
        if self.fh is not None:
            self.fh.close()
            self.fh = None


class CSVLogger(Logger):
    """``metrics.csv``: one row per value, `batch,kind,name,value` (long form: train logs and
    evaluations carry different names; `pandas.pivot` makes it wide)."""

    FIELDS = ("batch", "kind", "name", "value")

    def __init__(self, name: str = "metrics.csv"):
        self.name, self.path, self.fh, self.writer = name, None, None, None

    def open(self, out):
        if out is None:
            raise ValueError("CSVLogger writes into fit's out folder; pass fit(..., out=FOLDER)")
        self.path = os.path.join(out, self.name)
        fresh = not os.path.exists(self.path)
        self.fh = open(self.path, "a", newline="")
        self.writer = csv.writer(self.fh)
        if fresh:
            self.writer.writerow(self.FIELDS)

    def truncate(self, batch):
        self.fh.close()
        with open(self.path, newline="") as fh:
            rows = [r for r in csv.reader(fh)][1:]
        with open(self.path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(self.FIELDS)
            w.writerows(r for r in rows if int(r[0]) <= batch)
        self.fh = open(self.path, "a", newline="")
        self.writer = csv.writer(self.fh)

    def log(self, kind, batch, values):
        self.writer.writerows([batch, kind, k, repr(v)] for k, v in _numbers(values).items())
        self.fh.flush()

    def close(self):
        if self.fh is not None:
            self.fh.close()
            self.fh = None


class TensorBoardLogger(Logger):
    """TensorBoard event files in `<out>/<subdir>` through tensorboardX: scalars ``train/<name>``
    and ``eval/<name>`` against the batch count, the config as text, the summary's numbers as
    ``summary/<name>``."""

    def __init__(self, subdir: str = "tb"):
        _require("tensorboard", "TensorBoardLogger")
        self.subdir, self.writer, self.purge = subdir, None, None

    def open(self, out):
        if out is None:
            raise ValueError("TensorBoardLogger writes into fit's out folder; pass fit(..., out=FOLDER)")
        self.logdir = os.path.join(out, self.subdir)

    def truncate(self, batch):
        self.purge = batch + 1

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

    def open(self, out):
        from mlflow.tracking import MlflowClient

        uri = self.tracking_uri
        if uri is None:
            uri = "file:" + os.path.abspath(os.path.join(out or ".", "mlruns"))
            # MLflow 3.x keeps its file store in maintenance mode and refuses it unless told otherwise;
            # it still writes and reads it (pass tracking_uri="sqlite:///..." for a database store)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        id_file = os.path.join(out, "mlflow_run_id") if out else None
        if id_file and os.path.exists(id_file):
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
