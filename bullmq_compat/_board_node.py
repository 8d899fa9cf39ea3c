"""Where `bullmq-compat board` finds Bull-Board's Node project, and `board --install`.

The board is a small Node project shipped as package data in ``bullmq_compat/_board/``:
``board.js`` and the ``package.json`` / ``package-lock.json`` of the Node modules it needs
(Bull-Board, BullMQ 6.7.0, ioredis, pg, express). Those modules are found, in this order:

1. ``$BULLMQ_COMPAT_BOARD_DIR``, when set: that directory only (``--install`` fills it);
2. in a clone of the repository, ``interop/node_modules`` (``make setup`` installs it there),
   with ``board.js`` run from the package and ``NODE_PATH`` pointing there;
3. otherwise (an installed package) the per-user cache
   ``$XDG_CACHE_HOME/bullmq-compat/board-<version>`` (``~/.cache/...`` by default), which
   ``bullmq-compat board --install`` fills with a copy of ``_board/`` and ``npm ci``.

Every failure is a :class:`BoardSetupError` whose message says what to run.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Optional

from bullmq_compat._errors import BullMQCompatError
from bullmq_compat._version import __version__

PACKAGED = Path(__file__).resolve().parent / "_board"
FILES = ("board.js", "package.json", "package-lock.json")
PROJECT_NAME = "bullmq-compat-board"  # package.json's "name": --install overwrites no other project
REPO_ROOT = PACKAGED.parent.parent
NODE_MAJOR = 20
DIR_VARIABLE = "BULLMQ_COMPAT_BOARD_DIR"
NPM_CI = ("ci", "--omit=dev", "--no-audit", "--no-fund")
INSTALL_HINT = f"run 'bullmq-compat board --install' (needs Node.js {NODE_MAJOR}+ and npm)"


class BoardSetupError(BullMQCompatError):
    """Node.js, npm or Bull-Board's Node modules are missing: the message says what to run."""


@dataclass
class BoardProject:
    """The board.js to run, and the environment it needs to find its Node modules."""

    script: Path
    env: dict[str, str] = field(default_factory=dict)


def cache_dir() -> Path:
    """Where ``--install`` puts the board: ``$BULLMQ_COMPAT_BOARD_DIR``, else the per-user cache."""
    explicit = os.environ.get(DIR_VARIABLE)
    if explicit:
        return Path(explicit).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"  # XDG: a relative one is ignored
    return root / "bullmq-compat" / f"board-{__version__}"


def clone_modules() -> Optional[Path]:
    """``interop/node_modules`` of the repository this package runs from (an editable install),
    when it holds Bull-Board; None from an installed package (or with $BULLMQ_COMPAT_BOARD_DIR)."""
    if os.environ.get(DIR_VARIABLE):
        return None
    modules = REPO_ROOT / "interop" / "node_modules"
    if (REPO_ROOT / "interop" / "package.json").is_file() and (modules / "@bull-board" / "express").is_dir():
        return modules
    return None


def _same(a: Path, b: Path) -> bool:
    try:
        return a.read_bytes() == b.read_bytes()
    except OSError:
        return False


def resolve() -> BoardProject:
    """The board to run, or a BoardSetupError saying what to run to get one."""
    modules = clone_modules()
    if modules is not None:
        return BoardProject(PACKAGED / "board.js", {"NODE_PATH": str(modules)})
    target = cache_dir()
    if not (target / "node_modules" / ".package-lock.json").is_file():
        in_clone = not os.environ.get(DIR_VARIABLE) and (REPO_ROOT / "interop" / "package.json").is_file()
        raise BoardSetupError(f"board needs Bull-Board's Node modules, which are not in {target}: {INSTALL_HINT}"
                              + (" or, in this clone, 'make setup'" if in_clone else ""))
    if not all(_same(target / name, PACKAGED / name) for name in FILES):
        raise BoardSetupError(f"Bull-Board in {target} was installed by another bullmq-compat: {INSTALL_HINT}")
    return BoardProject(target / "board.js")


def node_binary() -> str:
    """``node`` on PATH, of version 20 or later."""
    node = shutil.which("node")
    if node is None:
        raise BoardSetupError(f"board needs Node.js {NODE_MAJOR}+ for Bull-Board, and 'node' is not on PATH: install "
                              f"Node.js {NODE_MAJOR} or later (it comes with npm) and check with 'node --version'")
    try:
        shown = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        raise BoardSetupError(f"board cannot run {node} ({err}): check with 'node --version' that Node.js "
                              f"{NODE_MAJOR}+ is installed") from None
    found = re.match(r"v(\d+)\.", shown)
    if found is None or int(found.group(1)) < NODE_MAJOR:
        raise BoardSetupError(f"board needs Node.js {NODE_MAJOR}+; {node} --version says {shown or 'nothing'}: "
                              f"install Node.js {NODE_MAJOR} or later")
    return node


def install(say: Callable[[str], None], npm_stdout: Optional[IO[str]] = None, then_start: bool = False) -> Path:
    """Copies board.js, package.json and package-lock.json into `cache_dir()` and runs
    ``npm ci --omit=dev --no-audit --no-fund`` there; ``say`` gets a line per step, npm's own
    output goes to ``npm_stdout`` (None: ours)."""
    node_binary()
    npm = shutil.which("npm")
    if npm is None:
        raise BoardSetupError("board --install needs npm (it comes with Node.js), and 'npm' is not on PATH: "
                              "check with 'npm --version'")
    target = cache_dir()
    existing = target / "package.json"
    if existing.is_file() and f'"name": "{PROJECT_NAME}"' not in existing.read_text(errors="replace"):
        raise BoardSetupError(f"{target} holds another Node project ({existing}): set {DIR_VARIABLE} to an empty "
                              "directory, or remove that one")
    say(f"installing Bull-Board into {target}")
    try:
        target.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            shutil.copyfile(PACKAGED / name, target / name)
    except OSError as err:
        raise BoardSetupError(f"cannot write to {target} ({err}): set {DIR_VARIABLE} to a directory you can "
                              "write to") from None
    say(f"copied {', '.join(FILES)} from {PACKAGED}")
    say(f"running: npm {' '.join(NPM_CI)}   (in {target}; it downloads the modules the first time)")
    try:
        code = subprocess.run([npm, *NPM_CI], cwd=target, stdout=npm_stdout).returncode
    except OSError as err:
        raise BoardSetupError(f"cannot run {npm} ({err}): check with 'npm --version'") from None
    if code != 0:
        raise BoardSetupError(f"npm ci in {target} failed (exit {code}; its output is above): fix what it says, "
                              "then run 'bullmq-compat board --install' again")
    say(f"Bull-Board is installed in {target}" + ("" if then_start else ": start it with 'bullmq-compat board --queue NAME'"))
    return target
