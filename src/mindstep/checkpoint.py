"""Checkpoints of a whole `TrainStep`: save, load, find the newest complete one.

What is saved (`state`): every Parameter the step trains or keeps: the networks' weights and
buffers (BatchNorm statistics, `mindstep.Dropout`'s random state), the optimizer's state
(moments, `global_step`, per-group LRs), and the step's own stages (loss scale and its counter,
the accumulators and the micro-step position inside a window, EMA shadows, the applied-update
counter that drives the LR schedules, the skip counters). The payload is MindSpore's own format
(`mindspore.save_checkpoint`, ``"ckpt"`` or ``"safetensors"``); beside it a JSON manifest records
the format version, the mindstep/MindSpore/numpy versions, the device, every `TrainStep` setting,
each tensor's name, shape and dtype, the composed-operator decisions, and the payload's SHA-256.

Writes are atomic, after Orbax: the payload goes to a temporary file in the same folder, is
fsynced and renamed, the folder is fsynced; the manifest is written the same way *last*. A
checkpoint is complete exactly when its manifest exists and the payload matches its checksum;
`latest(folder)` returns the newest complete one and skips (with a warning naming the file) torn
or corrupt ones. `save(..., keep=K)` removes older checkpoints only after the new one is complete,
manifest first, so a crash during the clean-up leaves at worst a payload without a manifest
(ignored).

Loading writes the values into the existing Parameters in place (`ops.assign`), so a step that is
already compiled (either compiler) uses them at its next call without recompiling.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ._errors import bad_type, bad_value, check_choice, check_int
from .dist import context as _dist

FORMAT_VERSION = 1
FORMATS = {"ckpt": ".ckpt", "safetensors": ".safetensors"}
MANIFEST_SUFFIX = ".json"
# settings that change what the state means: a checkpoint taken under others does not fit
STRUCTURAL = ("accumulate", "normalize", "ema", "loss_scale", "on_nonfinite")


class CheckpointError(ValueError):
    """A checkpoint is incomplete, corrupt, or does not fit the step it is loaded into."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped, or loaded only in part (`strict=False`)."""


def state(step) -> dict:
    """{name: Parameter} of everything `step` keeps, networks first; names must be unique."""
    out: dict = {}
    seen = set()
    for cell in list(step.cells) + [step.graph]:
        for p in cell.get_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if p.name in out:
                raise CheckpointError(
                    f"two different Parameters are both named {p.name!r}, so a checkpoint cannot tell them apart. "
                    "Give your networks distinct prefixes, e.g. net.update_parameters_name('generator.').")
            out[p.name] = p
    return out


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - folders cannot be opened on some platforms
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: Path, value: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def manifest_path(path) -> Path:
    return Path(str(path) + MANIFEST_SUFFIX)


def _resolve(path, fmt: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise bad_type("path", path, "a file path (str or pathlib.Path)", "Example: step.save('runs/ckpt/step-100.ckpt').")
    path = Path(path)
    suffix = FORMATS[fmt]
    return path if path.name.endswith(suffix) else path.with_name(path.name + suffix)


def save(step, path, *, format: str = "ckpt", keep: int | None = None, extra: dict | None = None) -> Path | None:
    """Save the complete training state of `step`; returns the payload's path. In a data-parallel
    job (a step with `reduce`) only rank 0 writes, and the other ranks return None.

    Args:
        step: a `TrainStep`.
        path: the payload file; the format's suffix (``.ckpt``, ``.safetensors``) is added when
            missing. Its folder is created. The manifest is `<path>.json`.
        format: ``"ckpt"`` or ``"safetensors"`` (both MindSpore's `save_checkpoint`).
        keep: after this checkpoint is complete, remove the older complete checkpoints of the
            same folder beyond the newest `keep` (None: remove nothing).
        extra: JSON values recorded in the manifest under ``"extra"`` (what `mindstep.fit` keeps
            there: the data position, the callbacks' state); written with the manifest, so it is
            exactly as complete as the checkpoint. `read_manifest(path)["extra"]` reads it back.

    Example:
        `step.save(f"runs/ckpt/step-{int(m['step']):06d}.ckpt", keep=3)` inside the loop; the
        quickstart page runs a whole save and resume.
    """
    check_choice("format", format, tuple(FORMATS), "Use 'ckpt' (MindSpore's format) or 'safetensors'.")
    if keep is not None:
        keep = check_int("keep", keep, minimum=1, fix="Pass how many checkpoints to keep, e.g. keep=3, or None.")
    if extra is not None:
        try:
            extra = json.loads(json.dumps(extra, allow_nan=True))
        except (TypeError, ValueError) as err:
            raise bad_type("extra", extra, "a dict of JSON values (numbers, strings, lists, dicts)",
                           f"Convert tensors with float()/.tolist() first ({err}).") from None
    if getattr(step, "reduce", None) and not _dist.is_main():
        return None  # data parallel: every rank holds the same state, rank 0 writes it
    path = _resolve(path, format)
    params = state(step)
    _warn_kernel_dropout(step)
    try:
        _write(step, path, params, format, extra)
    except (OSError, RuntimeError) as err:
        _discard(path)
        previous = latest(path.parent) if path.parent.is_dir() else None
        reason = f"{err.strerror} (errno {err.errno})" if isinstance(err, OSError) and err.strerror else \
            str(err).strip().splitlines()[0]
        raise CheckpointError(f"could not save the checkpoint {path}: {reason}. Nothing of it was kept; the newest "
                              f"complete checkpoint is still {previous or '(none)'}. Free disk space or fix the "
                              "folder's permissions; mindstep.fit(on_save_error='warn') keeps training and tries "
                              "again at the next save.") from err
    if keep is not None:
        _prune(path.parent, keep)
    return path


def _discard(path: Path) -> None:
    """What a failed save left: its temporary files, and a payload whose manifest was not written."""
    for leftover in path.parent.glob(f".{path.name}.{os.getpid()}.tmp*") if path.parent.is_dir() else ():
        leftover.unlink(missing_ok=True)
    for leftover in path.parent.glob(f".{manifest_path(path).name}.{os.getpid()}.tmp") if path.parent.is_dir() else ():
        leftover.unlink(missing_ok=True)
    if path.exists() and not manifest_path(path).exists():
        path.unlink(missing_ok=True)


def _write(step, path: Path, params: dict, format: str, extra) -> None:
    """The payload, then its manifest, each written atomically (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{FORMATS[format]}")
    ms.save_checkpoint([{"name": n, "data": p} for n, p in params.items()], str(tmp), format=format)
    _fsync_file(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    manifest = {
        "format_version": FORMAT_VERSION, "mindstep": _version(), "mindspore": ms.__version__,
        "numpy": np.__version__, "device": ms.get_context("device_target"), "created_ns": time.time_ns(),
        "step": int(step.graph.counter.value.asnumpy()),
        "payload": {"file": path.name, "format": format, "bytes": path.stat().st_size, "sha256": _digest(path)},
        "settings": step.settings(),
        "tensors": [{"name": n, "shape": list(p.shape), "dtype": str(p.dtype)} for n, p in params.items()],
        "optimize_report": [{k: r[k] for k in ("layer", "choice")} for r in step.optimize_report or []] or None,
        "extra": extra,
    }
    _write_json_atomic(manifest_path(path), manifest)


def _version() -> str:
    from . import __version__

    return __version__


def _warn_kernel_dropout(step) -> None:
    legacy = sorted({name for net in step.cells for name, c in net.cells_and_names() if type(c) is nn.Dropout})
    if legacy:
        warnings.warn(
            f"nn.Dropout layers ({', '.join(legacy[:5])}) keep their random state inside MindSpore's kernel, which no "
            "checkpoint can save: after a resume their masks restart from their seed, so training continues "
            "correctly but not bit-identically. mindstep.resumable_dropout(net) swaps them for mindstep.Dropout, "
            "whose state is saved.", CheckpointWarning, stacklevel=3)


def _payload(path) -> Path:
    """The payload a user names: as given, or with the format's suffix that `save` adds when the
    name has none (`step.save("state")` writes ``state.ckpt``; `step.load("state")` reads it)."""
    path = Path(path)
    if manifest_path(path).exists() or path.name.endswith(tuple(FORMATS.values())):
        return path
    for suffix in FORMATS.values():
        candidate = path.with_name(path.name + suffix)
        if manifest_path(candidate).exists():
            return candidate
    return path


def read_manifest(path, *, verify: bool = True) -> dict:
    """The manifest of the checkpoint whose payload is `path`, checked against its payload (its size
    and SHA-256; `verify=False` skips the hash, for a payload `latest()` has just verified).

    Raises:
        CheckpointError: no manifest (the save did not complete), an unreadable manifest, or a
            payload missing or differing from the manifest's size or checksum.
    """
    path = _payload(path)
    mpath = manifest_path(path)
    if not mpath.exists():
        raise CheckpointError(f"{path} has no manifest {mpath.name}: the save did not complete (or this is not a "
                              "mindstep checkpoint). Use mindstep.checkpoint.latest(folder) to find a complete one.")
    try:
        manifest = json.loads(mpath.read_text())
        payload = manifest["payload"]
        version = manifest["format_version"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{mpath} is not a readable mindstep manifest ({e}).") from None
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{mpath} has format version {version}; this mindstep reads up to {FORMAT_VERSION}. "
                              "Upgrade mindstep.")
    if not path.exists():
        raise CheckpointError(f"the payload {path} of {mpath.name} is missing.")
    size = path.stat().st_size
    if size != payload["bytes"] or verify and _digest(path) != payload["sha256"]:
        raise CheckpointError(f"{path} does not match its manifest ({size} bytes, expected {payload['bytes']}, or a "
                              "different SHA-256): the file is corrupt or was changed after saving.")
    return manifest


def _candidates(folder: Path) -> list:
    """[(created_ns, payload path)] of the checkpoints in `folder` with a readable manifest, oldest
    first, their payloads not yet verified; warns about payloads without a manifest (torn saves)."""
    found, described = [], set()
    for mpath in sorted(folder.glob("*" + MANIFEST_SUFFIX)):
        if mpath.name.startswith("."):
            continue
        payload = Path(str(mpath)[:-len(MANIFEST_SUFFIX)])
        described.add(payload.name)
        try:
            created = json.loads(mpath.read_text())["created_ns"]
        except (ValueError, KeyError, TypeError):
            created = -1  # read_manifest names what is wrong with it when it is verified
        found.append((created, payload))
    for suffix in FORMATS.values():
        for payload in folder.glob("*" + suffix):
            if not payload.name.startswith(".") and payload.name not in described:
                warnings.warn(f"skipping {payload}: it has no manifest, so its save did not complete.",
                              CheckpointWarning, stacklevel=4)
    return sorted(found)


def _verified(payload: Path) -> bool:
    """Whether the checkpoint is complete (`read_manifest`); warns naming it when it is not."""
    try:
        read_manifest(payload)
    except CheckpointError as e:
        warnings.warn(f"skipping the checkpoint {payload}: {e}", CheckpointWarning, stacklevel=4)
        return False
    return True


def latest(folder) -> Path | None:
    """The payload path of the newest complete checkpoint in `folder`, or None if there is none.

    Torn checkpoints (a payload without its manifest) and corrupt ones newer than the one returned
    (a payload that does not match its manifest's checksum) are skipped with a `CheckpointWarning`
    naming the file. Payloads are verified newest first, so older ones are not read at all.

    Example:
        `path = mindstep.checkpoint.latest("runs/ckpt")`, then `step.load(path)` when it is not None.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return None
    return next((payload for _, payload in reversed(_candidates(folder)) if _verified(payload)), None)


def _prune(folder: Path, keep: int) -> None:
    complete = [payload for _, payload in _candidates(folder) if _verified(payload)]
    for payload in complete[:-keep]:
        remove(payload)


def remove(path) -> None:
    """Remove a checkpoint: its manifest first (so a crash in between leaves a torn payload, which
    `latest` skips, never a manifest without its payload), then the payload.

    Example:
        `mindstep.checkpoint.remove("runs/ckpt/batch-0000100.ckpt")`.
    """
    payload = Path(path)
    manifest_path(payload).unlink(missing_ok=True)
    _fsync_dir(payload.parent)
    payload.unlink(missing_ok=True)


def _window_state(step, name: str) -> bool:
    """Whether `name` is part of the accumulation window's state (accumulators, weight, position)."""
    prefix = getattr(step, "name", "mindstep")
    return name.startswith(f"{prefix}.acc.") or name in (f"{prefix}.acc_weight", f"{prefix}.micro")


def _differences(step, manifest: dict, params: dict, elastic: bool = False) -> tuple[list, list]:
    """(problems, names that fit) between the step and a checkpoint's manifest; `elastic` leaves
    the accumulation setting and the window's state out of the comparison."""
    problems = []
    mine, theirs = step.settings(), manifest.get("settings", {})
    for key in getattr(step, "STRUCTURAL", STRUCTURAL):
        if mine.get(key) != theirs.get(key) and not (elastic and key == "accumulate"):
            problems.append(f"setting {key}: the step has {mine.get(key)!r}, the checkpoint {theirs.get(key)!r}")
    if elastic:
        params = {n: p for n, p in params.items() if not _window_state(step, n)}
        manifest = {**manifest, "tensors": [t for t in manifest["tensors"] if not _window_state(step, t["name"])]}
    saved = {t["name"]: t for t in manifest["tensors"]}
    missing = [n for n in params if n not in saved]
    unexpected = [n for n in saved if n not in params]
    if missing:
        problems.append(f"missing from the checkpoint: {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected in the checkpoint: {_names(unexpected)}")
    fits = []
    for name, p in params.items():
        t = saved.get(name)
        if t is None:
            continue
        if list(p.shape) != t["shape"] or str(p.dtype) != t["dtype"]:
            problems.append(f"{name}: the step has {list(p.shape)} {p.dtype}, the checkpoint {t['shape']} {t['dtype']}")
        else:
            fits.append(name)
    return problems, fits


def _names(names: list, limit: int = 8) -> str:
    return ", ".join(repr(n) for n in names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def load(step, path, *, strict: bool = True, elastic: bool = False) -> dict:
    """Load a checkpoint saved by `save` into `step`, in place; returns its manifest.

    Args:
        step: a `TrainStep` built with the same settings and networks (compiled already or not).
        path: the payload file (as `save` returned it, or `latest(folder)`).
        strict: refuse a checkpoint that does not fit (missing or unexpected tensors, other shapes
            or dtypes, another accumulate/normalize/EMA/loss-scale/on_nonfinite setting) with one
            `CheckpointError` listing every difference; with False, load what fits and warn
            naming what was skipped.
        elastic: the step may accumulate over another number of micro-batches than the saved one
            (`mindstep.fit` resuming on another number of ranks keeps the global batch by changing
            `accumulate`): the accumulation setting and the window's state are not compared, and
            the checkpoint must have been taken at an update boundary (its window empty), else
            `CheckpointError`. The step's own window starts empty.

    Example:
        `step.load(mindstep.checkpoint.latest("runs/ckpt"))` before or after the first call.
    """
    if not isinstance(strict, bool):
        raise bad_type("strict", strict, "True or False", "Pass strict=True (refuse a mismatch) or strict=False.")
    if not isinstance(path, (str, os.PathLike)):
        raise bad_type("path", path, "a checkpoint file path",
                       "Pass what step.save() returned, or mindstep.checkpoint.latest(folder).")
    path = _payload(path)
    manifest = read_manifest(path)
    params = state(step)
    problems, fits = _differences(step, manifest, params, elastic)
    values = None
    if elastic:
        values = ms.load_checkpoint(str(path), format=manifest["payload"]["format"])
        micro = values.get(f"{getattr(step, 'name', 'mindstep')}.micro")
        if micro is not None and int(micro.asnumpy()) != 0:
            raise CheckpointError(f"the checkpoint {path} was taken {int(micro.asnumpy())} micro-batch(es) into an "
                                  "accumulation window, so it cannot resume with another accumulate; resume from a "
                                  "checkpoint taken at an update boundary (save_every a multiple of accumulate)")
    if problems and strict:
        raise CheckpointError(f"the checkpoint {path} does not fit this step:\n  - " + "\n  - ".join(problems)
                              + "\nBuild the step as it was saved, or load(..., strict=False) to load what fits.")
    if problems:
        warnings.warn(f"loaded {len(fits)} of {len(params)} tensors from {path}; skipped:\n  - "
                      + "\n  - ".join(problems), CheckpointWarning, stacklevel=3)
    if values is None:
        values = ms.load_checkpoint(str(path), format=manifest["payload"]["format"])
    for name in fits:
        ops.assign(params[name], values[name])
    step.resync()
    _restore_decisions(step, manifest)
    return manifest


def _restore_decisions(step, manifest: dict) -> None:
    """A step whose composed-operator pass has not run yet takes the saved decisions, so the resumed
    run computes with the same forms (measured decisions can differ between processes)."""
    saved = manifest.get("optimize_report")
    if not saved or step.optimize is None:
        return
    if step.optimize_report is None:
        step.optimize["force"] = {r["layer"]: r["choice"] for r in saved}
        return
    if [(r["layer"], r["choice"]) for r in step.optimize_report] != [(r["layer"], r["choice"]) for r in saved]:
        warnings.warn("this step's composed-operator decisions differ from the checkpoint's; the resumed run computes "
                      "with other forms (equal within float tolerance, not bit-identical). Load before the first "
                      "call to reuse the saved decisions.", CheckpointWarning, stacklevel=3)


#: `load_weights(..., name_map="torch")`: PyTorch's BatchNorm names -> MindSpore's
TORCH_BATCHNORM = {"running_mean": "moving_mean", "running_var": "moving_variance"}
_TORCH_DROPPED = ("num_batches_tracked",)


def _rename(name: str, name_map, targets) -> str | None:
    """The network name a weight file's `name` goes to (None: dropped)."""
    import re

    if name_map == "torch":
        if name.rsplit(".", 1)[-1] in _TORCH_DROPPED:
            return None
        head, _, leaf = name.rpartition(".")
        leaf = TORCH_BATCHNORM.get(leaf, leaf)
        for old, new in (("weight", "gamma"), ("bias", "beta")):
            if leaf == old and f"{head}.{old}" not in targets and f"{head}.{new}" in targets:
                leaf = new
        return f"{head}.{leaf}" if head else leaf
    for pattern, replacement in (name_map or {}).items():
        name = re.sub(pattern, replacement, name)
    return name


def load_weights(net: nn.Cell, path, *, name_map=None, strict: bool = True) -> dict:
    """Initialise `net`'s weights from a `.ckpt` or `.safetensors` file, e.g. weights trained
    elsewhere; returns the report ``{"loaded", "missing", "unexpected", "mismatched"}``.

    Args:
        net: the network.
        path: a MindSpore checkpoint (``.ckpt``) or a ``.safetensors`` file.
        name_map: how the file's names become the network's: a dict ``{regex: replacement}``
            applied in order (`re.sub`), or ``"torch"`` for PyTorch's BatchNorm names
            (``running_mean``/``running_var``/``weight``/``bias`` -> ``moving_mean``/
            ``moving_variance``/``gamma``/``beta``; ``num_batches_tracked`` dropped).
        strict: raise `CheckpointError` listing every network weight the file lacks, every file
            weight the network lacks and every shape that differs, each with the closest names;
            False loads what fits and warns with the same list.

    Example:
        `mindstep.checkpoint.load_weights(net, "resnet18_torch.safetensors", name_map="torch")`.
    """
    import difflib

    if not isinstance(net, nn.Cell):
        raise bad_type("net", net, "a mindspore.nn.Cell", "Pass the network to initialise.")
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise bad_value("path", path, "an existing .ckpt or .safetensors file", "Check the path (model.init_from).")
    if name_map is not None and name_map != "torch" and not isinstance(name_map, dict):
        raise bad_type("name_map", name_map, "None, 'torch' or a dict {regex: replacement}",
                       "Example: name_map={'^backbone\\\\.': ''}.")
    fmt = "safetensors" if str(path).endswith(".safetensors") else "ckpt"
    try:
        values = ms.load_checkpoint(str(path), format=fmt)
    except (RuntimeError, ValueError, OSError) as err:
        raise CheckpointError(f"cannot read the weights {path}: {err}") from None
    params = {p.name: p for p in net.get_parameters()}
    renamed = {}
    for name, value in values.items():
        target = _rename(name, name_map, params)
        if target is not None:
            renamed[target] = (name, value)
    missing = [n for n in params if n not in renamed]
    unexpected = [f"{src} (as {n})" if src != n else n for n, (src, _) in renamed.items() if n not in params]
    mismatched, fits = [], []
    for n, (src, value) in renamed.items():
        if n in params:
            if tuple(value.shape) != tuple(params[n].shape):
                mismatched.append(f"{n}: the network has {list(params[n].shape)}, the file {list(value.shape)}")
            else:
                fits.append(n)

    def closest(name, pool):
        near = difflib.get_close_matches(name.split(" (as ")[0], list(pool), n=1, cutoff=0.6)
        return f"{name} (closest: {near[0]})" if near else name

    report = {"loaded": fits, "missing": [closest(n, [k for k in renamed if k not in params]) for n in missing],
              "unexpected": [closest(n, missing) for n in unexpected], "mismatched": mismatched}
    problems = [f"{kind}: {', '.join(report[kind][:12])}" + (f" and {len(report[kind]) - 12} more" if len(report[kind]) > 12 else "")
                for kind in ("missing", "unexpected", "mismatched") if report[kind]]
    if problems and strict:
        raise CheckpointError(f"the weights {path} do not fit the network ({len(fits)} of {len(params)} fit):\n  - "
                              + "\n  - ".join(problems) + "\nFix the names with name_map= (a dict of regexes, or "
                              "'torch' for PyTorch BatchNorm names), or load what fits with strict=False.")
    if problems:
        warnings.warn(f"loaded {len(fits)} of {len(params)} weights from {path}; not loaded:\n  - " + "\n  - ".join(problems),
                      CheckpointWarning, stacklevel=2)
    for n in fits:
        params[n].set_data(ms.Tensor(values[renamed[n][0]].asnumpy(), params[n].dtype))
    return report
