"""Build hooks: the sdist and the wheel carry upstream BullMQ's Lua scripts and SQL.

The repository never holds them. Building an sdist or a (non-editable) wheel first makes sure
``bullmq_compat/_upstream/`` holds the pinned release, fetching it with the package's own fetcher
(``bullmq_compat/_wire/fetch.py``: sha512 of the tarball, sha256 of each migration) when it does
not. An sdist carries the folder, so a wheel built from it needs neither npm nor the network.
``BULLMQ_COMPAT_UPSTREAM_TARBALL=bullmq-6.7.0.tgz`` builds offline from a tarball on disk.
An editable install (``pip install -e .``, ``make setup``) fetches nothing here: ``make setup``
runs the fetcher itself.
"""
from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent


def _fetcher() -> types.ModuleType:
    """``bullmq_compat._wire.fetch`` without running ``bullmq_compat/__init__.py``, whose imports
    (redis, msgpack, ...) are not installed in a build environment."""
    if "bullmq_compat" not in sys.modules:
        package = types.ModuleType("bullmq_compat")
        package.__path__ = [str(HERE / "bullmq_compat")]
        sys.modules["bullmq_compat"] = package
    return importlib.import_module("bullmq_compat._wire.fetch")


def ensure_upstream() -> None:
    fetch = _fetcher()
    tarball = os.environ.get("BULLMQ_COMPAT_UPSTREAM_TARBALL")
    try:
        print(fetch.fetch(Path(tarball) if tarball else None))
    except fetch.FetchError as exc:
        sys.exit(f"bullmq-compat build: cannot get upstream BullMQ's scripts: {exc}")


class BuildPy(build_py):
    def run(self) -> None:
        if not getattr(self, "editable_mode", False):
            ensure_upstream()
        super().run()


class Sdist(sdist):
    def run(self) -> None:
        ensure_upstream()
        super().run()


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
