"""Your own network in `mindstep train`: `model.factory` names a callable that builds it, and
`model.init_from` loads weights trained elsewhere.

``factory: "package.module:callable"`` imports an installed module (``mindcv.models:create_model``);
``factory: "./my_models.py:Net"`` (or any path ending in ``.py``) loads a file, relative to the
folder the command runs in. `model.args` are its keyword arguments; what the recipe knows and the
callable takes by name is filled in unless `args` sets it (`num_classes` and `in_channels` for
classification, `vocab_size` and `seq_len` for masked-LM). The result must be a `nn.Cell`: a
classifier maps images `(N, C, H, W)` to logits `(N, classes)`, a masked-LM network token ids
`(N, T)` to logits `(N, T, vocab)`.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys

from .config import ConfigError


def load(spec: str):
    """The callable `spec` names."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError(f"model.factory: expected 'package.module:callable' or './file.py:callable', got {spec!r}")
    where, attr = spec.split(":")
    if where.endswith(".py") or os.sep in where or where.startswith("."):
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise ConfigError(f"model.factory: the file {where!r} does not exist (from {os.getcwd()}); fix the path")
        name = f"_mindstep_user_{os.path.splitext(os.path.basename(path))[0]}"
        module = sys.modules.get(name)
        if module is None or getattr(module, "__file__", None) != path:
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as err:
            raise ConfigError(f"model.factory: cannot import {where!r} ({err}); install it, or give a file path "
                              "such as './my_models.py:Net'") from None
    if not hasattr(module, attr):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(f"model.factory: {where!r} has no {attr!r}; its callables: {', '.join(public[:20])}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise ConfigError(f"model.factory: {spec!r} is a {type(fn).__name__}, not a callable")
    return fn


def build(spec: str, args: dict, known: dict):
    """The network: `load(spec)(**args)`, with the `known` values the callable takes by name added."""
    from mindspore import nn

    fn = load(spec)
    try:
        accepted = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        accepted = {}
    kwargs = {k: v for k, v in known.items() if k in accepted and k not in args}
    kwargs.update(args)
    try:
        net = fn(**kwargs)
    except TypeError as err:
        raise ConfigError(f"model.factory {spec!r} called with {kwargs}: {err}; fix model.args") from None
    if not isinstance(net, nn.Cell):
        raise ConfigError(f"model.factory {spec!r} returned a {type(net).__name__}, not a mindspore.nn.Cell")
    return net


def initialise(net, model_cfg) -> dict | None:
    """`model.init_from` loaded into `net` (`mindstep.checkpoint.load_weights`); the report, or None."""
    if not model_cfg.init_from:
        return None
    from .. import checkpoint

    try:
        return checkpoint.load_weights(net, model_cfg.init_from, name_map=model_cfg.init_map,
                                       strict=model_cfg.init_strict)
    except ValueError as err:
        raise ConfigError(f"model.init_from: {err}") from None
