"""Fenced code blocks of the README and the docs/ pages, found by a line they contain or by the comment
above them, and the means to run their shell commands (not a test module). Each marker must appear in
exactly one of those files, so moving an example between the README and a page keeps it tested."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import sys
from typing import Iterator, Union

from childproc import child_env, run_isolated

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


def transcript(text: str) -> tuple[list[str], dict[str, str]]:
    """A shell session as a page shows it (``$ COMMAND`` lines, each followed by what it prints): the
    commands in order, and what each prints."""
    commands: list[str] = []
    expected: dict[str, str] = {}
    for line in text.splitlines(keepends=True):
        if line.startswith("$ "):
            commands.append(line[2:].strip())
            expected[commands[-1]] = ""
        else:
            expected[commands[-1]] += line
    return commands, expected


def turbospark_shell(directory: pathlib.Path) -> dict[str, str]:
    """An environment whose ``turbospark`` command (a wrapper written to ``directory``/bin) runs this
    checkout's package with this interpreter, as the pages' commands expect."""
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "turbospark"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m turbospark "$@"\n')
    wrapper.chmod(0o755)
    return child_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})


def sh(line: str, env: dict[str, str], cwd: pathlib.Path, timeout: float = 300) -> str:
    """What the shell ``line`` prints, run with bash in ``cwd``; it must exit 0."""
    done = run_isolated(["bash", "-c", line], str(cwd), env, timeout)
    assert done.returncode == 0, (line, done.stderr)
    return done.stdout


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
