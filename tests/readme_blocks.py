"""Fenced code blocks of the README, found by a line they contain or by the comment above them (not a test module)."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)


def block(marker: str) -> str:
    """The one fenced block of README.md containing ``marker``, dedented; fails if not exactly one."""
    found = []
    for match in _FENCE.finditer(README.read_text()):
        indent = len(match.group(1))
        text = "".join(line[indent:] + "\n" for line in match.group(3).splitlines())
        if marker in text:
            found.append(text)
    assert len(found) == 1, f"{len(found)} README blocks contain {marker!r}"
    return found[0]


def block_after(comment: str, language: str = r"[a-z]*") -> str:
    """The fenced block (in ``language``, a regex) right after ``<!-- COMMENT -->`` in README.md; fails if none."""
    found = re.search(rf"<!-- {comment} -->\s*```{language}\n(.*?)```", README.read_text(), re.S)
    assert found is not None, f"README has no {language} block after <!-- {comment} -->"
    return found.group(1)
