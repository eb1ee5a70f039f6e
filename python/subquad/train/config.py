"""Training configurations: a TOML file of four tables (run, data, model, train), checked
against one schema so that a misspelt key or a value of the wrong type is an error that
names it; command-line overrides as `table.key=value` (the value in TOML syntax)."""

import copy
import json
import math
from typing import Any, Dict, Iterable, List, Mapping, Tuple

try:
    import tomllib
except ImportError:  # Python < 3.11: the same parser from PyPI
    import tomli as tomllib

FAMILIES = ("lm", "mlm", "vit", "regression", "forecast", "retrieval")
CAUSAL_FAMILIES = ("lm", "regression")  # the others' models attend both ways
DRAWN_FAMILIES = ("regression", "retrieval")  # synthetic: every split is drawn afresh
MAX_RETRIEVAL_KEYS = 4096  # the probe's set sizes; its activations grow with keys^2
NUMBER = (int, float)

# Batches come from torch generators seeded seed * STEP_STREAMS + step + 1
# (tasks.step_generator), step in [-2, steps): the training steps and the validation (-1)
# and test (-2) streams. Two seeds never share a stream while steps <= MAX_STEPS, and
# every generator seed fits torch's 64 bits (2^64 - 1 being seed 0's test stream, -1)
# while seed <= MAX_SEED (about 1.8e13).
STEP_STREAMS = 1_000_003
MAX_STEPS = STEP_STREAMS - 2
MAX_SEED = (2 ** 64 - 2 - MAX_STEPS) // STEP_STREAMS
# AdamW moves every weight by about lr per step (the update is normalised by its second
# moment), and multiplies it by 1 - lr * weight_decay: beyond these, training only diverges.
MAX_LR = 1.0
# A CPU trainer: models and one step's activations are bounded (float32: 4 GiB of weights,
# 16 GiB with gradients and AdamW's moments; 8 GiB of activations), so that an absurd size
# fails here and not in the allocator, or in the kernel's OOM killer.
MAX_PARAMETERS = 2 ** 30
MAX_ACTIVATIONS = 2 ** 31
IMAGE_SIDE, IMAGE_CLASSES = 28, 10  # Fashion-MNIST
FASHION_MNIST_TRAIN = 60_000
MAX_VALIDATION_IMAGES = FASHION_MNIST_TRAIN // 2  # at least as many left to train on
ETT_CHANNELS = 7

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
        # > 0: the protocol's split: validation on the last validation_size training
        # images (not trained on), test on all 10,000 (eval_size unused)
        "validation_size": ((int,), 0, ("vit",)),
        "augment": ((bool,), False, ("vit",)),  # random shifts of <= 2 pixels, flips
        "dims": ((int,), 5, ("regression", "retrieval")),
        "keys": ((int,), 32, ("retrieval",)),
        "noise": (NUMBER, 1.0, ("retrieval",)),
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
        # > 0: stop when the validation loss has not improved on its best for this many
        # consecutive evaluations, and report the best evaluation's weights
        "patience": ((int,), 0, None),
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
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{table}.{key}: expected a finite number, got {value!r}")


def resolve(raw: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The full configuration: raw's values over the defaults, checked."""
    unknown_tables = sorted(set(raw) - set(SCHEMA))
    if unknown_tables:
        raise ConfigError(f"unknown table(s) {unknown_tables}; accepted: {sorted(SCHEMA)}")
    for table in SCHEMA:
        if not isinstance(raw.get(table, {}), Mapping):
            raise ConfigError(f"{table}: expected a table ([{table}] with keys), got "
                              f"{raw[table]!r}")
    family = raw.get("run", {}).get("family")
    if family not in FAMILIES:
        raise ConfigError(f"run.family: expected one of {list(FAMILIES)}, got {family!r}")
    config: Dict[str, Dict[str, Any]] = {}
    for table, keys in SCHEMA.items():
        given = raw.get(table, {})
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
    """Value ranges and combinations no model or data set can run, and sizes beyond this
    trainer's bounds (MAX_SEED, MAX_STEPS, MAX_LR, MAX_PARAMETERS, MAX_ACTIVATIONS,
    layers.registry.MAX_THREADS)."""
    from ..layers.registry import check_threads

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
              "train.patience",
              allow_zero={"train.warmup", "train.weight_decay", "train.clip",
                          "train.eval_points", "train.eval_batches", "train.patience",
                          "data.train_size", "model.attention_scale",
                          "data.curriculum_dims_start", "data.curriculum_points_start"})
    if not 0 <= run["seed"] <= MAX_SEED:
        raise ConfigError(f"run.seed: expected 0 to {MAX_SEED} (the batch generators' seeds "
                          f"are seed * {STEP_STREAMS} + step in 64 bits), got {run['seed']}")
    try:
        check_threads(run["threads"], "run.threads", low=1)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if not run["out"]:
        raise ConfigError("run.out: expected a directory, got ''")
    if train["steps"] > MAX_STEPS:
        raise ConfigError(f"train.steps: expected at most {MAX_STEPS} (a seed's batch "
                          f"streams), got {train['steps']}")
    if train["lr"] > MAX_LR:
        raise ConfigError(f"train.lr: expected at most {MAX_LR:g} (AdamW moves each weight "
                          f"by about lr per step), got {train['lr']}")
    if train["lr"] * train["weight_decay"] >= 1:
        raise ConfigError(f"train.weight_decay: expected train.lr x weight_decay < 1 (AdamW "
                          f"multiplies each matrix by 1 - lr x weight_decay per step), got "
                          f"{train['lr']} x {train['weight_decay']}")
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
    _check_attention(model, family)
    if family in DRAWN_FAMILIES and train["eval_batches"] == 0:
        raise ConfigError(f"train.eval_batches: expected > 0 for {family} (its data are "
                          f"drawn afresh, so there is no whole split to evaluate)")
    if train["eval_points"] > train["steps"]:
        raise ConfigError(f"train.eval_points: expected <= train.steps = {train['steps']}, "
                          f"got {train['eval_points']}")
    _check_patience(train)
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
    if family == "vit" and not 0 <= data["validation_size"] <= MAX_VALIDATION_IMAGES:
        raise ConfigError(f"data.validation_size: expected 0 (validate on the first "
                          f"eval_size test images) to {MAX_VALIDATION_IMAGES}, got "
                          f"{data['validation_size']}")
    if family == "vit" and data["validation_size"] and data["train_size"] and (
            data["train_size"] + data["validation_size"] > FASHION_MNIST_TRAIN):
        raise ConfigError(f"data.train_size + data.validation_size: expected at most the "
                          f"{FASHION_MNIST_TRAIN} training images, got {data['train_size']} + "
                          f"{data['validation_size']}")
    if family == "vit" and 28 % model["patch"]:
        raise ConfigError(f"model.patch: expected a divisor of Fashion-MNIST's 28 pixels, got "
                          f"{model['patch']}")
    if family == "forecast" and data["context"] % model["patch"]:
        raise ConfigError(f"model.patch: expected a divisor of data.context = "
                          f"{data['context']}, got {model['patch']}")
    if family == "retrieval":
        if not 2 <= data["keys"] <= MAX_RETRIEVAL_KEYS:
            raise ConfigError(f"data.keys: expected 2 to {MAX_RETRIEVAL_KEYS}, got "
                              f"{data['keys']}")
        if data["noise"] < 0:
            raise ConfigError(f"data.noise: expected >= 0, got {data['noise']}")
    if family == "regression":
        for key in ("curriculum_dims_start", "curriculum_points_start"):
            limit = data["dims" if "dims" in key else "points"]
            if data[key] > limit:
                raise ConfigError(f"data.{key}: expected <= {limit}, got {data[key]}")
    _check_size(config)


def _check_patience(train: Dict[str, Any]) -> None:
    """Early stopping needs more evaluations than its patience, or it could never end a
    run before its last step."""
    from .loop import evaluation_steps

    if train["patience"] == 0:
        return
    evaluations = len(evaluation_steps(train))
    if train["patience"] >= evaluations:
        how = (f"train.eval_points = {train['eval_points']}" if train["eval_points"]
               else f"train.eval_every = {train['eval_every']}")
        raise ConfigError(f"train.patience: expected < the run's {evaluations} evaluations "
                          f"({how} over train.steps = {train['steps']}), got "
                          f"{train['patience']}: early stopping could never end it")


def _check_attention(model: Dict[str, Any], family: str) -> None:
    """The attention entries exist, their options belong to entries of the model and leave
    the direction to the family, and their thread counts are in range."""
    from ..layers.registry import ATTENTIONS, check_threads
    from ..models.blocks import TORCH_ATTENTION, check_attention_options

    for key, names in (("model.attention", [model["attention"]]),
                       ("model.pattern", model["pattern"])):
        for name in names:
            if name != TORCH_ATTENTION and name not in ATTENTIONS:
                raise ConfigError(f"{key}: unknown entry {name!r}; registered: "
                                  f"{', '.join(ATTENTIONS)} (and {TORCH_ATTENTION!r})")
    options = model["attention_options"]
    try:
        check_attention_options(model["pattern"] or [model["attention"]], options,
                                causal=family in CAUSAL_FAMILIES, only_used=True)
        for name, own in options.items():
            if "threads" in own:
                check_threads(own["threads"], f"attention_options.{name}.threads")
    except ValueError as error:
        raise ConfigError(f"model.{error}") from None


def size_estimate(config: Dict[str, Dict[str, Any]]) -> Tuple[int, int, List[str]]:
    """(parameters, activations of one training step, the keys they grow with): an
    estimate within a small factor for every attention entry (projections 4 dim^2 per
    layer, the MLP 2 dim^2 mlp_ratio, embeddings and heads by family; a step keeps about
    (8 + 2 mlp_ratio) dim values per token and layer, and the logits)."""
    run, data, model, train = (config[t] for t in ("run", "data", "model", "train"))
    dim, layers, ratio = model["dim"], model["layers"], model["mlp_ratio"]
    keys = ["model.dim", "model.layers", "model.mlp_ratio", "train.batch_size"]
    family, outputs = run["family"], 0
    if family in ("lm", "mlm"):
        vocab = data["vocab_size"] if data["tokenizer"] == "bpe" else 256
        tokens, outputs = data["length"], vocab
        embeddings = (vocab + data["length"]) * dim
        keys += ["data.length"] + (["data.vocab_size"] if data["tokenizer"] == "bpe" else [])
    elif family == "vit":
        tokens = (IMAGE_SIDE // model["patch"]) ** 2 + 1
        embeddings = (tokens + model["patch"] ** 2 + IMAGE_CLASSES) * dim
        keys += ["model.patch"]
    elif family == "regression":
        tokens = 2 * data["points"]
        embeddings = (tokens + data["dims"]) * dim
        keys += ["data.points", "data.dims"]
    elif family == "retrieval":
        tokens, outputs = data["keys"] + 1, 1  # one row of label logits per sequence
        embeddings = (data["dims"] + 2 * data["keys"] + 1) * dim
        keys += ["data.keys", "data.dims"]
    else:  # forecast: every channel is a sequence of patches
        tokens = ETT_CHANNELS * (data["context"] // model["patch"])
        embeddings = data["context"] // model["patch"] * dim * (data["horizon"] + 1)
        keys += ["data.context", "data.horizon", "model.patch"]
    hidden = round(dim * ratio)
    parameters = layers * (4 * dim * dim + 2 * dim * hidden) + embeddings
    activations = train["batch_size"] * tokens * (layers * (8 * dim + 2 * hidden) + outputs)
    return int(parameters), int(activations), keys


def _check_size(config: Dict[str, Dict[str, Any]]) -> None:
    parameters, activations, keys = size_estimate(config)
    for what, value, limit in (("parameters", parameters, MAX_PARAMETERS),
                               ("activations per step", activations, MAX_ACTIVATIONS)):
        if value > limit:
            settings = ", ".join(f"{key} = {_value(config, key)}" for key in keys)
            raise ConfigError(f"{settings}: about {value:.3g} {what}, more than this CPU "
                              f"trainer's {limit:.3g}")


def _value(config, name: str):
    table, key = name.split(".")
    return config[table][key]


def differences(saved: Mapping[str, Mapping[str, Any]],
                config: Mapping[str, Mapping[str, Any]],
                ignore: Iterable[str] = ()) -> List[str]:
    """"table.key: saved -> now" for every key whose value differs (keys in `ignore`
    left out)."""
    out = []
    for table in sorted(set(saved) | set(config)):
        before, now = saved.get(table, {}), config.get(table, {})
        for key in sorted(set(before) | set(now)):
            name = f"{table}.{key}"
            if name not in ignore and before.get(key) != now.get(key):
                out.append(f"{name}: {_show(before.get(key))} -> {_show(now.get(key))}")
    return out


def _show(value) -> str:
    return "(unset)" if value is None else json.dumps(value)


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
    except OSError as error:
        raise ConfigError(f"config: cannot read {path} ({error.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"config: {path} is not valid TOML ({error})") from None
    try:
        for override in overrides:
            table, key, value = parse_override(override)
            if not isinstance(raw.setdefault(table, {}), dict):
                raise ConfigError(f"{table}: expected a table ([{table}] with keys), got "
                                  f"{raw[table]!r}; cannot set {table}.{key}")
            raw[table][key] = value
        return resolve(raw)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
