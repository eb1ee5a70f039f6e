"""Training configurations: a TOML file of four tables (run, data, model, train), checked
against one schema so that a misspelt key or a value of the wrong type is an error that
names it; command-line overrides as `table.key=value` (the value in TOML syntax)."""

import copy
from typing import Any, Dict, Iterable, Mapping, Tuple

try:
    import tomllib
except ImportError:  # Python < 3.11: the same parser from PyPI
    import tomli as tomllib

FAMILIES = ("lm", "mlm", "vit", "regression", "forecast")
NUMBER = (int, float)

# table -> key -> (accepted types, default, the families it applies to (None: all)).
SCHEMA: Dict[str, Dict[str, Tuple[tuple, Any, Any]]] = {
    "run": {
        "family": ((str,), None, None),
        "seed": ((int,), 0, None),
        "threads": ((int,), 1, None),
        "out": ((str,), "runs/run", None),
        "progress": ((bool,), True, None),
    },
    "data": {
        "tokenizer": ((str,), "byte", ("lm", "mlm")),
        "vocab_size": ((int,), 2048, ("lm", "mlm")),
        "length": ((int,), 128, ("lm", "mlm")),
        "train_size": ((int,), 0, ("vit",)),
        "eval_size": ((int,), 1000, ("vit",)),
        "dims": ((int,), 5, ("regression",)),
        "points": ((int,), 11, ("regression",)),
        "curriculum_dims_start": ((int,), 0, ("regression",)),
        "curriculum_points_start": ((int,), 0, ("regression",)),
        "curriculum_interval": ((int,), 2000, ("regression",)),
        "dataset": ((str,), "ETTh1", ("forecast",)),
        "context": ((int,), 96, ("forecast",)),
        "horizon": ((int,), 24, ("forecast",)),
    },
    "model": {
        "attention": ((str,), "exact", None),
        "pattern": ((list,), [], None),
        "dim": ((int,), 64, None),
        "heads": ((int,), 4, None),
        "layers": ((int,), 2, None),
        "mlp_ratio": (NUMBER, 4.0, None),
        "mup": ((bool,), False, None),
        "attention_scale": (NUMBER, 0.0, None),  # 0: the entry's default scale
        "attention_options": ((dict,), {}, None),
        "position_embedding": ((str,), "learned", ("lm", "mlm")),  # "learned" or "none"
        "patch": ((int,), 4, ("vit", "forecast")),
        "pool": ((str,), "cls", ("vit",)),
    },
    "train": {
        "steps": ((int,), 200, None),
        "batch_size": ((int,), 16, None),
        "lr": (NUMBER, 1e-3, None),
        "min_lr_ratio": (NUMBER, 0.1, None),
        "warmup": ((int,), 20, None),
        "weight_decay": (NUMBER, 0.01, None),
        "betas": ((list,), [0.9, 0.95], None),
        "clip": (NUMBER, 1.0, None),
        "precision": ((str,), "float32", None),
        "eval_every": ((int,), 50, None),
        "eval_points": ((int,), 0, None),  # > 0: that many log-spaced evaluations
        "eval_batches": ((int,), 4, None),  # 0: the whole split
        "log_every": ((int,), 10, None),
        "checkpoint_every": ((int,), 100, None),
    },
}
PRECISIONS = ("float32", "bf16")


class ConfigError(ValueError):
    """A configuration that cannot run, with the key and the reason."""


def _check_types(table: str, key: str, value: Any) -> None:
    types = SCHEMA[table][key][0]
    if isinstance(value, bool) and bool not in types:
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        names = " or ".join(t.__name__ for t in types)
        raise ConfigError(f"{table}.{key}: expected {names}, got {value!r}")


def resolve(raw: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The full configuration: raw's values over the defaults, checked."""
    unknown_tables = sorted(set(raw) - set(SCHEMA))
    if unknown_tables:
        raise ConfigError(f"unknown table(s) {unknown_tables}; accepted: {sorted(SCHEMA)}")
    family = raw.get("run", {}).get("family")
    if family not in FAMILIES:
        raise ConfigError(f"run.family: expected one of {list(FAMILIES)}, got {family!r}")
    config: Dict[str, Dict[str, Any]] = {}
    for table, keys in SCHEMA.items():
        given = raw.get(table, {})
        if not isinstance(given, Mapping):
            raise ConfigError(f"{table}: expected a table, got {given!r}")
        for key in given:
            if key not in keys:
                raise ConfigError(f"unknown key {table}.{key}; accepted: {sorted(keys)}")
            families = keys[key][2]
            if families is not None and family not in families:
                raise ConfigError(f"{table}.{key} does not apply to family {family!r} "
                                  f"(only to {list(families)})")
            _check_types(table, key, given[key])
        config[table] = {key: copy.deepcopy(given.get(key, default))
                         for key, (_, default, families) in keys.items()
                         if families is None or family in families}
    check(config)
    return config


def _positive(config, *names: str, allow_zero: Iterable[str] = ()) -> None:
    for name in names:
        table, key = name.split(".")
        if key not in config[table]:
            continue
        value = config[table][key]
        low_ok = value >= 0 if name in allow_zero else value > 0
        if not low_ok:
            bound = ">= 0" if name in allow_zero else "> 0"
            raise ConfigError(f"{name}: expected {bound}, got {value}")


def check(config: Dict[str, Dict[str, Any]]) -> None:
    """Value ranges and combinations no model or data set can run."""
    run, data, model, train = (config[t] for t in ("run", "data", "model", "train"))
    _positive(config, "run.threads", "model.dim", "model.heads", "model.layers",
              "model.mlp_ratio", "train.steps", "train.batch_size", "train.lr",
              "train.eval_every", "train.log_every",
              "train.checkpoint_every", "data.length", "data.dims", "data.points",
              "data.context", "data.horizon", "data.eval_size", "model.patch",
              "data.curriculum_interval")
    _positive(config, "train.warmup", "train.weight_decay", "train.clip", "data.train_size",
              "model.attention_scale", "data.curriculum_dims_start",
              "data.curriculum_points_start", "train.eval_points", "train.eval_batches",
              allow_zero={"train.warmup", "train.weight_decay", "train.clip",
                          "train.eval_points", "train.eval_batches",
                          "data.train_size", "model.attention_scale",
                          "data.curriculum_dims_start", "data.curriculum_points_start"})
    if model["dim"] % model["heads"]:
        raise ConfigError(f"model.heads: expected a divisor of model.dim = {model['dim']}, "
                          f"got {model['heads']}")
    if not 0 <= train["min_lr_ratio"] <= 1:
        raise ConfigError(f"train.min_lr_ratio: expected in [0, 1], got {train['min_lr_ratio']}")
    if train["warmup"] >= train["steps"]:
        raise ConfigError(f"train.warmup: expected < train.steps = {train['steps']}, got "
                          f"{train['warmup']}")
    betas = train["betas"]
    if len(betas) != 2 or not all(isinstance(b, NUMBER) and 0 <= b < 1 for b in betas):
        raise ConfigError(f"train.betas: expected two numbers in [0, 1), got {betas}")
    if train["precision"] not in PRECISIONS:
        raise ConfigError(f"train.precision: expected one of {list(PRECISIONS)}, got "
                          f"{train['precision']!r}")
    if not all(isinstance(name, str) for name in model["pattern"]):
        raise ConfigError(f"model.pattern: expected a list of attention names, got "
                          f"{model['pattern']}")
    if model["pattern"] and model["layers"] % len(model["pattern"]):
        raise ConfigError(f"model.pattern: its length {len(model['pattern'])} must divide "
                          f"model.layers = {model['layers']}")
    for name, options in model["attention_options"].items():
        if not isinstance(options, Mapping):
            raise ConfigError(f"model.attention_options.{name}: expected a table of options, "
                              f"got {options!r}")
    family = run["family"]
    if family == "regression" and train["eval_batches"] == 0:
        raise ConfigError("train.eval_batches: expected > 0 for regression (its prompts are "
                          "drawn afresh, so there is no whole split to evaluate)")
    if train["eval_points"] > train["steps"]:
        raise ConfigError(f"train.eval_points: expected <= train.steps = {train['steps']}, "
                          f"got {train['eval_points']}")
    if family in ("lm", "mlm"):
        if data["tokenizer"] not in ("byte", "bpe"):
            raise ConfigError(f"data.tokenizer: expected 'byte' or 'bpe', got "
                              f"{data['tokenizer']!r}")
        if data["tokenizer"] == "bpe" and data["vocab_size"] < 257:
            raise ConfigError(f"data.vocab_size: expected >= 257 for BPE, got "
                              f"{data['vocab_size']}")
        if model["position_embedding"] not in ("learned", "none"):
            raise ConfigError(f"model.position_embedding: expected 'learned' or 'none', got "
                              f"{model['position_embedding']!r}")
    if family == "vit" and 28 % model["patch"]:
        raise ConfigError(f"model.patch: expected a divisor of Fashion-MNIST's 28 pixels, got "
                          f"{model['patch']}")
    if family == "forecast" and data["context"] % model["patch"]:
        raise ConfigError(f"model.patch: expected a divisor of data.context = "
                          f"{data['context']}, got {model['patch']}")
    if family == "regression":
        for key in ("curriculum_dims_start", "curriculum_points_start"):
            limit = data["dims" if "dims" in key else "points"]
            if data[key] > limit:
                raise ConfigError(f"data.{key}: expected <= {limit}, got {data[key]}")


def parse_override(text: str) -> Tuple[str, str, Any]:
    """"table.key=value" -> (table, key, value); value in TOML syntax, or a bare string."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"override {text!r}: expected table.key=value")
    name, value_text = text.split("=", 1)
    table, key = name.strip().split(".", 1)
    try:
        value = tomllib.loads(f"value = {value_text}")["value"]
    except tomllib.TOMLDecodeError:
        value = value_text
    return table, key, value


def load(path: str, overrides: Iterable[str] = ()) -> Dict[str, Dict[str, Any]]:
    """The checked configuration from the TOML file at `path` and `table.key=value`
    overrides."""
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"config: {path} not found") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config: {path} is not valid TOML ({error})") from None
    for override in overrides:
        table, key, value = parse_override(override)
        raw.setdefault(table, {})[key] = value
    return resolve(raw)
