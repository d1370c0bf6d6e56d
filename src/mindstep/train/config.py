"""A training run's configuration: a recipe's YAML, the user's file, `key=value` overrides, validated.

Sections and keys are pydantic models with `extra="forbid"`, so every unknown key, wrong type or
out-of-range value is found before anything is built, and `ConfigError` names the key, the value,
the valid keys or range, and the fix. Every `TrainStep` feature has a key under `step:`; the
optimizer, its parameter groups and the LR schedule live under `optim:` and `schedule:`.
"""
from __future__ import annotations

import copy
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Data(_Section):
    path: Optional[str] = Field(None, description="your data instead of the recipe's default (see the recipe)")
    batch_size: int = Field(64, ge=1)
    workers: int = Field(2, ge=1, description="mindspore.dataset parallel workers")
    seed: int = 0
    on_error: Literal["raise", "skip"] = Field("raise", description="an unreadable sample: raise naming it, or skip it")
    augment: bool = Field(True, description="an image folder: random resized crop and flip each epoch")


class Optim(_Section):
    name: Literal["momentum", "sgd", "adam", "adamw"] = "momentum"
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    no_decay: list[str] = Field(default_factory=lambda: ["bias", "norm", "bn", "ln"])
    lr_scale: dict[str, float] = Field(default_factory=dict, description="parameter groups: {name pattern: LR factor}")


class Schedule(_Section):
    name: Literal["constant", "cosine", "step", "sgdr"] = "cosine"
    total_steps: Optional[int] = Field(None, ge=1, description="cosine: step calls it spans (None: train.steps)")
    warmup_steps: int = Field(0, ge=0)
    eta_min: float = Field(0.0, ge=0)
    step_size: int = Field(100, ge=1, description="step: decay every this many updates")
    gamma: float = Field(0.1, gt=0, le=1)
    T_0: int = Field(100, ge=1, description="sgdr: the first cycle's length")
    T_mult: int = Field(1, ge=1)


class Step(_Section):
    precision: str = "O0"
    keep_fp32: list[str] = Field(default_factory=list, description="Cell name patterns kept in float32")
    loss_scale: Union[None, Literal["dynamic"], float] = None
    accumulate: int = Field(1, ge=1)
    normalize: Literal["mean", "count"] = "mean"
    clip_grad_norm: Optional[float] = Field(None, gt=0)
    clip_grad_value: Optional[float] = Field(None, gt=0)
    ema: Optional[float] = Field(None, gt=0, lt=1)
    on_nonfinite: Literal["skip", "raise", "apply"] = "skip"
    optimize: Union[bool, dict[str, Any]] = Field(
        False, description="the composed-operator pass: true, or its settings (e.g. {memory_budget_mb: 1000})")
    losses: Optional[dict[str, float]] = Field(None, description="multi-task weights {loss name: weight}")
    recompute: list[str] = Field(default_factory=list, description="Cell name patterns recomputed in backward")
    jit: bool = True


class EarlyStop(_Section):
    monitor: str
    patience: int = Field(3, ge=1)
    mode: Literal["min", "max"] = "min"
    min_delta: float = Field(0.0, ge=0)


class Plateau(_Section):
    monitor: str
    factor: float = Field(0.1, gt=0, lt=1)
    patience: int = Field(2, ge=1)
    mode: Literal["min", "max"] = "min"
    min_delta: float = Field(0.0, ge=0)
    cooldown: int = Field(0, ge=0)
    min_factor: float = Field(0.0, ge=0)


class Best(_Section):
    monitor: str
    k: int = Field(1, ge=1)
    mode: Literal["min", "max"] = "min"


class Train(_Section):
    steps: int = Field(600, ge=1, description="step calls (batches)")
    eval_every: int = Field(200, ge=1)
    save_every: int = Field(200, ge=1)
    log_every: int = Field(20, ge=1)
    keep: int = Field(3, ge=1, description="checkpoints kept")
    early_stopping: Optional[EarlyStop] = Field(None, description="mindstep.loop.EarlyStopping's arguments")
    reduce_lr_on_plateau: Optional[Plateau] = Field(None, description="mindstep.loop.ReduceLROnPlateau's arguments")
    best_checkpoint: Optional[Best] = Field(None, description="mindstep.loop.BestCheckpoint's arguments (in out/best)")
    loggers: list[Literal["tensorboard", "mlflow"]] = Field(default_factory=list,
                                                           description="trackers beside metrics.jsonl/csv")


class Config(_Section):
    recipe: str
    seed: int = 0
    data: Data = Field(default_factory=Data)
    model: dict[str, Any] = Field(default_factory=dict, description="the recipe's model settings")
    optim: Optim = Field(default_factory=Optim)
    schedule: Schedule = Field(default_factory=Schedule)
    step: Step = Field(default_factory=Step)
    train: Train = Field(default_factory=Train)
    phases: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="named phases run in order, each a partial config merged onto this one")

    @model_validator(mode="after")
    def _consistent(self):
        if self.step.loss_scale is not None and not isinstance(self.step.loss_scale, str) and self.step.loss_scale < 1:
            raise ValueError("step.loss_scale must be None, 'dynamic' or a float >= 1")
        if self.step.on_nonfinite == "apply" and self.step.loss_scale is not None:
            raise ValueError("step.on_nonfinite='apply' cannot be used with a loss scale (an overflow must skip)")
        return self


class ConfigError(ValueError):
    """A configuration that cannot be run: each line names a key, what it got, and what it takes."""


SECTIONS = {"data": Data, "optim": Optim, "schedule": Schedule, "step": Step, "train": Train}


def _valid_keys(parent: tuple) -> str:
    """The keys of the section at `parent` (() is the top level)."""
    model = SECTIONS.get(parent[0]) if parent else Config
    return ", ".join(model.model_fields) if model is not None else ""


def _explain(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"] if not str(p).startswith(("function-", "literal[", "float", "none",
                                                                          "str", "union")))
        key = ".".join(loc) or "(config)"
        value = e.get("input")
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key (got {value!r}); valid keys here: {_valid_keys(loc[:-1])}. "
                         f"Fix the spelling or remove it.")
        else:
            lines.append(f"{key}: {e['msg']} (got {value!r}). Fix: set {key} to a valid value, e.g. with "
                         f"`{key}=...` on the command line.")
    return "\n".join(dict.fromkeys(lines))


def parse_override(text: str) -> tuple[list[str], Any]:
    """`optim.lr=3e-4` -> (["optim", "lr"], 0.0003); values are read as YAML (`[a, b]`, `null`,
    `true`), and numbers such as `3e-4` that YAML 1.1 leaves as strings are numbers."""
    if "=" not in text or text.startswith("="):
        raise ConfigError(f"override {text!r}: expected key=value, e.g. optim.lr=3e-4 or step.accumulate=4")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"override {text!r}: the key {key!r} has an empty part; write e.g. optim.lr=3e-4")
    value = yaml.safe_load(raw) if raw.strip() else None
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value.lower() for c in ".e") else int(value)
        except ValueError:
            pass
    return path, value


def merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _override(data: dict, overrides) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            if not isinstance(node.get(part, {}), dict):
                raise ConfigError(f"override {text!r}: {part} is a value, not a section")
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return data


def _overrides_win_over_phases(data: dict, overrides) -> None:
    """A command-line `key=value` sets the key for every phase: the phases' own values of it go
    (`phases.<name>.key=value` sets one phase's)."""
    phases = data.get("phases")
    if not isinstance(phases, dict):
        return
    for text in overrides:
        path, _ = parse_override(text)
        if path[0] == "phases":
            continue
        for part in phases.values():
            node = part
            for key in path[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(path[-1], None)


def resolve(recipe_yaml: dict, user: dict | None = None, overrides=()) -> Config:
    """The recipe's defaults, then the user's file, then `key=value` overrides; validated."""
    data = _override(copy.deepcopy(merge(recipe_yaml, user or {})), overrides)
    _overrides_win_over_phases(data, overrides)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_explain(err)) from None
    for name in cfg.phases:  # every phase is checked before anything trains
        phase(cfg, name)
    return cfg


def phase(cfg: Config, name: str) -> Config:
    """The config of phase `name`: its partial config merged onto the rest (the command line's
    overrides already won over it, see `resolve`), with `model.phase` set to the phase's name."""
    if name not in cfg.phases:
        raise ConfigError(f"--phase {name!r}: this config has the phases {', '.join(cfg.phases) or '(none)'}; "
                          "pick one of them, or leave --phase out to run them all in order")
    base = cfg.model_dump()
    base.pop("phases")
    part = cfg.phases[name]
    if not isinstance(part, dict) or "phases" in part or "recipe" in part:
        raise ConfigError(f"phases.{name}: a partial config (sections such as optim:, train:, model:) without "
                          "recipe: or phases: of its own")
    data = merge(base, part)
    data["model"] = {**data.get("model", {}), "phase": name}
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError("\n".join(f"phases.{name}.{line}" for line in _explain(err).splitlines())) from None


def load_yaml(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as err:
        raise ConfigError(f"cannot read the config {path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (recipe:, data:, step:, ...), got {type(data).__name__}")
    return data


def dump(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(), sort_keys=False)
