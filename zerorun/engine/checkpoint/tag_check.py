"""``checkpoint.tag_validation``: whether every rank saves under the same tag (DeepSpeed's Ignore/Warn/Fail).

A checkpoint is one directory holding every rank's file, so ranks that pass different tags
(a rank number in the tag) cannot each get their own: with ``Fail`` every rank raises
DeepSpeed's error (an ``AssertionError`` there, so this one is one too); with ``Warn`` (the
default) a warning names the tags and the checkpoint is saved, complete, under rank 0's tag;
with ``Ignore`` the same without the warning. DeepSpeed instead writes each rank's files under
its own tag, none of which can be loaded alone.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Literal

from zerorun.engine.checkpoint.errors import CheckpointError

if TYPE_CHECKING:
    from zerorun.engine.comm.collectives import Collectives

Mode = Literal["Ignore", "Warn", "Fail"]


class TagMismatch(CheckpointError, AssertionError):
    """Ranks asked for different checkpoint tags under ``checkpoint.tag_validation: Fail``."""


def agreed_tag(coll: Collectives, rank: int, tag: str, mode: Mode) -> str:
    """The tag every rank saves under (all ranks call it): ``tag`` when the ranks agree, else rank 0's,
    or :class:`TagMismatch` on every rank with ``mode="Fail"``."""
    tags = coll.all_gather_object(tag)
    if all(t == tags[0] for t in tags):
        return tag
    others = ", ".join(f"rank {r}: {t!r}" for r, t in enumerate(tags) if t != tags[0])
    message = (f"[rank={rank}] The checkpoint tag name '{tag}' is not consistent across all ranks "
               f"(rank 0: {tags[0]!r}; {others})")
    if mode == "Fail":
        raise TagMismatch(message, "pass every rank the same tag (no rank number in it), or set "
                                   "checkpoint.tag_validation to Warn to save under rank 0's tag")
    if mode == "Warn":
        warnings.warn(f"{message}: saved as {tags[0]!r}, rank 0's tag, so that the checkpoint is complete",
                      stacklevel=3)
    return tags[0]
