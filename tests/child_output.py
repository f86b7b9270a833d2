"""What a child interpreter printed, less the lines torch's own libraries print there: torch 2.8.0's gloo
writes "[Gloo] Rank 0 is connected to 1 peer ranks. ..." to stdout whenever a group forms."""

from __future__ import annotations

from typing import IO

TORCH_NOISE = ("[Gloo] ",)


def own_lines(text: str) -> list[str]:
    """The lines of ``text`` the child's own code printed."""
    return [line for line in text.splitlines() if not line.startswith(TORCH_NOISE)]


def own_words(text: str) -> list[str]:
    """The whitespace-separated words of :func:`own_lines`."""
    return " ".join(own_lines(text)).split()


def next_own_line(stream: IO[str]) -> str:
    """The next line of ``stream`` the child's own code printed ('' at its end), stripped."""
    while (line := stream.readline()) and line.startswith(TORCH_NOISE):
        pass
    return line.strip()
