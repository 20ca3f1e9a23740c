"""Run the code blocks of a Markdown file, in order, as a reader would.

Which blocks run:

- ```` ```python ```` blocks run in one Python process per file, in order,
  sharing one namespace (a later block may use a name an earlier one set);
- ```` ```sh ```` and ```` ```bash ```` blocks run with ``bash -euo pipefail``;
- every other block (output, ``text``, ``json``, ``sql``, no language) is shown, not run.

All of a file's blocks run in one fresh, empty working directory, with the
project's environment first on ``PATH`` (so ``stockade`` and ``python`` are the
ones under test). A comment on the line just before a block changes how it runs:

- ``<!-- doc: skip REASON -->``: not run; the reason is required and says where
  it is proven instead.
- ``<!-- doc: file NAME -->``: the block is saved as ``NAME`` in the working
  directory, not run (a later block runs it).
- ``<!-- doc: serve -->``: a ``stockade serve`` runs for the rest of the file
  (one per file, in ``./stockade-data`` of the working directory, on a free
  port), and ``127.0.0.1:7390`` in this and later blocks, and in files saved
  before, points at it. The
  Python session of the earlier blocks ends first (as a reader's would), so
  it holds no file the server needs for itself.
- ``<!-- doc: postgres -->``, ``<!-- doc: redis -->``: a real PostgreSQL or
  Redis runs for the rest of the file, and the addresses the docs use
  (``postgresql://postgres@127.0.0.1:5432/postgres``, ``redis://127.0.0.1:6379``)
  point at it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RUN_LANGUAGES = {"python": "python", "sh": "sh", "bash": "sh"}
BLOCK_TIMEOUT_S = 180

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[A-Za-z0-9_+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    re.M | re.S)
_DIRECTIVE = re.compile(r"<!--\s*doc:\s*(?P<what>skip|file|serve|postgres|redis)\b\s*(?P<arg>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str  # "python", "sh", or "" (not run)
    code: str
    directive: str = ""  # "", "skip", "file", or a service: "serve", "postgres", "redis"
    arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` with its directive.

    Raises:
        ValueError: a ``skip`` without a reason or a ``file`` without a name.
    """
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        directive = _DIRECTIVE.search(before)
        what, arg = (directive.group("what"), directive.group("arg")) if directive else ("", "")
        if what in ("skip", "file") and not arg:
            raise ValueError(f"{path.name}:{line}: 'doc: {what}' needs {'a reason' if what == 'skip' else 'a name'}")
        body = "\n".join(ln[len(match.group("indent")):] for ln in match.group("body").split("\n"))
        found.append(Block(path, line, RUN_LANGUAGES.get(match.group("lang").lower(), ""), body, what, arg))
    return found


_DRIVER = r"""
import json, os, sys, traceback
protocol = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # the blocks' own output (and their children's) goes to stderr
sys.stdout = sys.stderr
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    request = json.loads(line)
    try:
        exec(compile(request["code"], request["where"], "exec"), namespace)
        answer = {"ok": True}
    except BaseException:
        answer = {"ok": False, "error": traceback.format_exc()}
    sys.stderr.flush()
    protocol.write(json.dumps(answer) + "\n")
    protocol.flush()
"""


#: ``start(workdir) -> (substitutions, stop)``: a service a block needs, and the text to rewrite in blocks.
Service = Callable[[Path], tuple[dict[str, str], Callable[[], None]]]


class Runner:
    """Runs one file's blocks in ``workdir``; ``services[name]`` starts what ``doc: NAME`` needs."""

    def __init__(self, workdir: Path, env: dict[str, str], services: dict[str, Service]) -> None:
        self.workdir = workdir
        self.env = env
        self.services = services
        self.substitutions: dict[str, str] = {}
        self._started: dict[str, Callable[[], None]] = {}
        self._python: subprocess.Popen[str] | None = None
        self.ran: list[str] = []
        self._saved: list[Block] = []

    def _code(self, block: Block) -> str:
        code = block.code
        for old, new in self.substitutions.items():
            code = code.replace(old, new)
        return code

    def run(self, block: Block) -> None:
        """Run (or save, or skip) one block.

        Raises:
            AssertionError: the block failed; the message has its output.
        """
        if block.directive == "skip" or not block.lang and block.directive != "file":
            return
        if block.directive in self.services and block.directive not in self._started:
            if block.directive == "serve":
                self._end_python()  # a reader's Python session is over by now, and its files are closed
            substitutions, stop = self.services[block.directive](self.workdir)
            self._started[block.directive] = stop
            self.substitutions.update(substitutions)
            for saved in self._saved:  # files saved earlier point at the service too
                (self.workdir / saved.arg).write_text(self._code(saved), encoding="utf-8")
        if block.directive == "file":
            (self.workdir / block.arg).write_text(self._code(block), encoding="utf-8")
            self._saved.append(block)
            return
        if block.lang == "sh":
            self._sh(block)
        else:
            self._py(block)
        self.ran.append(block.where)

    def _sh(self, block: Block) -> None:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", self._code(block)], cwd=self.workdir, env=self.env,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (
            f"{block.where}: exit {done.returncode}\n--- block\n{block.code}\n--- stdout\n{done.stdout[-4000:]}"
            f"\n--- stderr\n{done.stderr[-4000:]}"
        )

    def _py(self, block: Block) -> None:
        if self._python is None:
            self._python = subprocess.Popen(
                [sys.executable, "-c", _DRIVER], cwd=self.workdir, env=self.env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(self.workdir / ".doc-python.log", "w"),
            )
        assert self._python.stdin is not None and self._python.stdout is not None
        self._python.stdin.write(json.dumps({"code": self._code(block), "where": block.where}) + "\n")
        self._python.stdin.flush()
        answer_line = self._python.stdout.readline()
        log = (self.workdir / ".doc-python.log").read_text(errors="replace")[-4000:]
        assert answer_line, f"{block.where}: the Python process died\n--- output\n{log}"
        answer = json.loads(answer_line)
        assert answer["ok"], (
            f"{block.where}: failed\n--- block\n{block.code}\n--- error\n{answer['error']}\n--- output\n{log}"
        )

    def _end_python(self) -> None:
        if self._python is not None:
            if self._python.stdin is not None:
                self._python.stdin.close()
            try:
                self._python.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._python.kill()
                self._python.wait()
            self._python = None

    def close(self) -> None:
        self._end_python()
        for stop in reversed(list(self._started.values())):
            stop()


def run_file(path: Path, workdir: Path, env: dict[str, str], services: dict[str, Service]) -> list[str]:
    """Run every block of ``path`` in order; returns where the run blocks are. Fails at the first failure."""
    # The CLI's default data directory is per user ($XDG_STATE_HOME/stockade): each file gets its own, never
    # the real home's.
    env = {**env, "XDG_STATE_HOME": str(workdir / ".state")}
    runner = Runner(workdir, env, services)
    try:
        for block in blocks(path):
            runner.run(block)
    finally:
        runner.close()
    return runner.ran


def environment(project_bin: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The blocks' environment: the project's interpreter first on PATH, no inherited stockade settings."""
    env = {k: v for k, v in (base or os.environ).items() if not k.startswith("STOCKADE_")}
    env["PATH"] = os.pathsep.join([str(project_bin), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env
