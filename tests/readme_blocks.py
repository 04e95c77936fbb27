"""Fenced code blocks of the README and the docs/ pages, found by a line they contain or by the comment
above them (not a test module). Each marker must appear in exactly one of those files, so moving an
example between the README and a page keeps it tested."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
from typing import Iterator, Union

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
DOCS = sorted((README.parent / "docs").glob("*.md"))


def documents() -> str:
    """The README and every docs/ page, one after the other."""
    return "\n".join(path.read_text() for path in [README, *DOCS])


_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)


def block(marker: str) -> str:
    """The one fenced block of the README or a docs/ page containing ``marker``, dedented; fails if not exactly one."""
    found = []
    for match in _FENCE.finditer(documents()):
        indent = len(match.group(1))
        text = "".join(line[indent:] + "\n" for line in match.group(3).splitlines())
        if marker in text:
            found.append(text)
    assert len(found) == 1, f"{len(found)} README/docs blocks contain {marker!r}"
    return found[0]


def block_after(comment: str, language: str = r"[a-z]*") -> str:
    """The fenced block (in ``language``, a regex) right after ``<!-- COMMENT -->`` in the README or a docs/
    page; fails unless there is exactly one."""
    found = re.findall(rf"<!-- {comment} -->\s*```{language}\n(.*?)```", documents(), re.S)
    assert len(found) == 1, f"README/docs hold {len(found)} {language} blocks after <!-- {comment} -->"
    return found[0]



@contextlib.contextmanager
def working_directory(directory: Union[str, "os.PathLike[str]"]) -> Iterator[None]:
    """Run the block in ``directory`` (the docs' examples name files relative to where they run)."""
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(cwd)


def exec_block(code: str, where: str) -> str:
    """Run a docs page's Python block (``where`` names the page in tracebacks); returns what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, where, "exec"), {})  # noqa: S102 -- the page's own code
    return out.getvalue()
