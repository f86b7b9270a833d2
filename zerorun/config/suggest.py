"""Did-you-mean suggestions for misspelt keys and names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, candidates: Iterable[str], *, case_insensitive: bool = False) -> str | None:
    """The candidate closest to ``word``, or None when nothing is close enough."""
    options = list(candidates)
    if case_insensitive:
        lowered = {option.lower(): option for option in options}
        match = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
        return lowered[match[0]] if match else None
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if match:
        return match[0]
    # "prefetch_bucket_size" for "stage3_prefetch_bucket_size": a containing key is a good guess too.
    contained = [option for option in options if word and (word in option or option in word)]
    return min(contained, key=len) if contained else None
