"""The attention registry: names -> (layer factory, capabilities), in the style of Hugging
Face's AttentionInterface. build() checks options and combinations before constructing.

    layer = subquad.layers.build("exact", dim=64, heads=4, causal=True, kv_heads=2)
    subquad.layers.capabilities("cat").causal        # False: the reason is in .reasons
    subquad.layers.register("mine", MyLayer, Capabilities(...))
"""

import inspect
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, Mapping, Tuple

from torch import nn

# The kernels' thread counts: 0 (all cores) to MAX_THREADS, as kMaxThreads in
# include/subquad/context.h; checked where a count enters (layers, trainer) so that a bad
# one fails before any work, not at the first kernel call.
MAX_THREADS = 1024


def check_threads(value, name: str = "threads", low: int = 0) -> int:
    """`value` if it is an int in [low, MAX_THREADS] (low 0: 0 means all cores)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_THREADS:
        accepted = "0 (all cores) to" if low == 0 else f"{low} to"
        raise ValueError(f"{name}: expected {accepted} {MAX_THREADS}, got {value!r}")
    return value


# Capability fields a combination can violate, with how the error names them.
_FEATURES = {
    "causal": "causal attention",
    "bidirectional": "bidirectional attention",
    "padding_mask": "an attention_mask with padding",
    "decoding_cache": "a decoding cache",
    "backward": "a backward pass (training)",
    "gqa": "grouped-query attention (kv_heads != heads)",
}


@dataclass(frozen=True)
class Capabilities:
    """What one registry entry supports. `reasons` says why for every unsupported feature.

    dtypes are those the C++ kernels compute in (CPU); other floating dtypes on CPU are
    computed in float32 and cast back. Tensors on other devices (CUDA, ...) run
    subquad.reference, in every floating dtype the device's matmuls and FFTs support (FFTs
    in float32 at least).
    """

    causal: bool
    bidirectional: bool
    padding_mask: bool
    decoding_cache: bool
    backward: bool
    dtypes: Tuple[str, ...]
    gqa: bool
    reasons: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        for feature in _FEATURES:
            if not getattr(self, feature) and feature not in self.reasons:
                raise ValueError(f"Capabilities: {feature} is unsupported, so reasons must say "
                                 f"why (reasons[{feature!r}])")

    def require(self, name: str, feature: str, detail: str = "") -> None:
        """Raises ValueError saying why `name` cannot do `feature` (a field name)."""
        if feature not in _FEATURES:
            raise ValueError(f"feature: expected one of {', '.join(_FEATURES)}, got {feature!r}")
        if not getattr(self, feature):
            suffix = f" ({detail})" if detail else ""
            raise ValueError(f"{name} does not support {_FEATURES[feature]}{suffix}: "
                             f"{self.reasons[feature]}")

    def as_row(self) -> Dict[str, str]:
        """The entry as strings, for the capabilities table."""
        row = {f: "yes" if getattr(self, f) else "no" for f in _FEATURES}
        row["dtypes"] = ", ".join(self.dtypes)
        return row


@dataclass(frozen=True)
class Entry:
    factory: Callable[..., nn.Module]  # factory(dim, heads, **options)
    capabilities: Capabilities
    defaults: Mapping[str, object]  # options passed unless overridden (e.g. causal=True)


class AttentionRegistry:
    """A mapping from attention names to entries; `register` adds or replaces one."""

    def __init__(self):
        self._entries: Dict[str, Entry] = {}

    def register(self, name: str, factory: Callable[..., nn.Module],
                 capabilities: Capabilities, *, defaults: Mapping[str, object] = None,
                 replace: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: expected a non-empty string, got {name!r}")
        if name in self._entries and not replace:
            raise ValueError(f"name: {name!r} is registered already; pass replace=True")
        if not isinstance(capabilities, Capabilities):
            raise TypeError(f"capabilities: expected a Capabilities, got "
                            f"{type(capabilities).__name__}")
        self._entries[name] = Entry(factory, capabilities, dict(defaults or {}))

    def unregister(self, name: str) -> None:
        self[name]  # raises for an unknown name
        del self._entries[name]

    def __getitem__(self, name: str) -> Entry:
        if name not in self._entries:
            raise ValueError(f"attention: unknown name {name!r}; registered: "
                             f"{', '.join(self._entries)}")
        return self._entries[name]

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


ATTENTIONS = AttentionRegistry()


def register(name: str, factory: Callable[..., nn.Module], capabilities: Capabilities, *,
             defaults: Mapping[str, object] = None, replace: bool = False) -> None:
    """Registers factory(dim, heads, **options) -> nn.Module under `name`."""
    ATTENTIONS.register(name, factory, capabilities, defaults=defaults, replace=replace)


def capabilities(name: str) -> Capabilities:
    """What the entry `name` supports."""
    return ATTENTIONS[name].capabilities


def names() -> Tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(ATTENTIONS)


_NOT_OPTIONS = ("self", "dim", "heads", "name")


def accepted_options(factory: Callable) -> Tuple[str, ...]:
    """The keyword options factory(dim, heads, **options) takes."""
    parameters = inspect.signature(factory).parameters
    return tuple(p for p in parameters if p not in _NOT_OPTIONS)


def required_options(factory: Callable) -> Tuple[str, ...]:
    """The options factory(dim, heads, **options) has no default for."""
    parameters = inspect.signature(factory).parameters.values()
    return tuple(p.name for p in parameters if p.name not in _NOT_OPTIONS
                 and p.default is inspect.Parameter.empty
                 and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def build(attention: str, dim: int, heads: int, **options) -> nn.Module:
    """The layer registered as `attention`: factory(dim, heads, **options).

    Raises ValueError for an unknown name, an option the entry does not take (naming the
    accepted ones) or needs and lacks, a thread count out of range, and a combination the
    entry cannot do (saying why).
    """
    entry = ATTENTIONS[attention]
    caps = entry.capabilities
    accepted = accepted_options(entry.factory)
    if "kv_heads" in options and not caps.gqa and options["kv_heads"] not in (None, heads):
        caps.require(attention, "gqa", f"kv_heads={options['kv_heads']}, heads={heads}")
    unknown = [name for name in options if name not in accepted]
    if unknown:
        raise ValueError(f"{attention}: unknown option{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(unknown)}; accepted: {', '.join(accepted)}")
    merged = {**entry.defaults, **options}
    missing = [name for name in required_options(entry.factory) if name not in merged]
    if missing:
        raise ValueError(f"{attention}: option{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)} required (it has no default)")
    if "threads" in merged:
        check_threads(merged["threads"])
    if "causal" in merged:
        causal = merged["causal"]
        if not isinstance(causal, bool):
            raise ValueError(f"{attention}: causal: expected a bool, got {causal!r}")
        caps.require(attention, "causal" if causal else "bidirectional")
    return entry.factory(dim, heads, **merged)
