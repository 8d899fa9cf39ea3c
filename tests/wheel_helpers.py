"""Building the sdist and the wheel from a copy of the checkout, and installing one into a new venv
(tests/test_packaging.py, tests/test_readme.py).

The copy holds the checkout's tracked files plus its fetched ``_upstream`` (what ``make setup``
left); the build and the installs run with ``PATH`` holding only a venv's ``bin``, so none of them
can use node or npm.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from bullmq_compat._wire import upstream

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def _tracked_files() -> list[str]:
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [name for name in proc.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


def run(argv: list[str], *, cwd: Path, path: str, timeout: float = 600, **env: str) -> str:
    """Run ``argv`` with ``PATH=path`` (and no PYTHONPATH, VIRTUAL_ENV or NODE_PATH); its stdout, or a
    failed assertion with its output."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "NODE_PATH")}
    environment.update(PATH=path, **env)
    proc = subprocess.run(argv, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def build_dists(work: Path) -> dict[str, Path]:
    """``python -m build`` (the sdist, then the wheel from it) of a copy of the checkout, in ``work``."""
    assert upstream.is_current(), "make setup fetches upstream first"
    source = work / "src"
    for name in _tracked_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(upstream.UPSTREAM_DIR, source / "bullmq_compat" / "_upstream")
    out = work / "dist"
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)], cwd=work,
        path=str(VENV_BIN))
    wheel, = out.glob("bullmq_compat-*.whl")
    sdist, = out.glob("bullmq_compat-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist, "work": work}


def install_into_new_venv(dist: Path, venv: Path) -> Path:
    """A new venv with ``dist`` and its [postgres] extra installed (PATH = the venv's bin); its bin."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    bin_dir = venv / "bin"
    run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{dist}[postgres]"],
        cwd=venv.parent, path=str(bin_dir))
    return bin_dir
