"""The study's texts, read from Debian packages by subquad.data (none fitted by anything
here): Austen's six novels (r-cran-janeaustenr, by their janeaustenr names), Melville's
Moby Dick (r-cran-tokenizers) and the GCIDE dictionary (dict-gcide, entries joined by blank
lines); and the documents cut from them: window w of a book is its tokens
[w L, (w + 1) L) for documents of L = context + continuation tokens.
"""

from typing import Callable, Dict, List, Mapping, Sequence

__all__ = ["TEXTS", "document", "load_text"]


def _novel(name: str) -> Callable[[], str]:
    def load() -> str:
        from ..data import load_novels
        return load_novels()[name]
    return load


def _mobydick() -> str:
    from ..data import load_mobydick
    return load_mobydick()


def _gcide() -> str:
    from ..data import load_gcide
    return "\n\n".join(load_gcide())


TEXTS: Dict[str, Callable[[], str]] = {
    **{name: _novel(name) for name in ("sensesensibility", "prideprejudice", "mansfieldpark",
                                       "emma", "northangerabbey", "persuasion")},
    "mobydick": _mobydick,
    "gcide": _gcide,
}


def load_text(name: str, texts: Mapping[str, str] = None) -> str:
    """The text `name`: from `texts` when given (fixtures), else from its package."""
    if texts is not None:
        if name not in texts:
            raise ValueError(f"text: {name!r} is not among the given texts {sorted(texts)}")
        return texts[name]
    if name not in TEXTS:
        raise ValueError(f"text: expected one of {sorted(TEXTS)}, got {name!r}")
    return TEXTS[name]()


def document(ids: Sequence[int], window: int, length: int) -> List[int]:
    """Window `window` of `length` tokens; ValueError past the end of the text."""
    if window < 0 or (window + 1) * length > len(ids):
        raise ValueError(f"window: {window} of {length} tokens is past the text's "
                         f"{len(ids)} tokens ({len(ids) // length} windows)")
    return list(ids[window * length:(window + 1) * length])
