"""The command lines of the README's and docs' fenced code blocks, for the tests that run them
(test_docs_commands.py: specpilot plan/validate; test_docs_helm_commands.py: helm install/upgrade)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def fenced_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(the line's number, its text stripped) for each line inside a ``` block of `path`, a backslash-continued
    line joined with the lines it continues (numbered by its first line)."""
    in_block = False
    pending, start = "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_block, pending = not in_block, ""
            continue
        if not in_block:
            continue
        text = pending + line.strip()
        start = start if pending else number
        if text.endswith("\\"):
            pending = text[:-1].rstrip() + " "
            continue
        pending = ""
        yield start, text
