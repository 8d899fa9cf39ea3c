#!/usr/bin/env python3
"""Fetch Valkey 8, the server upstream BullMQ's CI runs, from Debian backports into .valkey/ (`make valkey`).

Nothing is installed and the machine's apt set-up is left as it is: apt runs on a sources list and
a state of its own, in a temporary directory. That list is derived from the machine's Debian source
(its URI, keyring and options, read from /etc/apt/sources.list{,.d/}), with the suites
``<codename>`` and ``<codename>-backports``. ``apt-get download`` fetches valkey-server and
valkey-tools (the binaries) and any shared library they need that is not installed; ``dpkg-deb -x``
unpacks them into the destination. No service, no maintainer script runs.

Usage: python3 scripts/fetch_valkey.py [DEST]   (default: .valkey beside scripts/)

Then ``DEST/usr/bin/valkey-server`` is the server (``REDIS_SERVER=...`` in tests/README.md). A second
run with the stamp in place and the binary answering ``--version`` does nothing.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("valkey-server", "valkey-tools")
MAJOR = 8
APT_ETC = Path("/etc/apt")


@dataclass
class Source:
    """One apt source entry, kept as written so every option (keyring, architectures...) carries over."""

    uri: str
    suites: list[str]
    components: list[str]
    lines: list[str] = field(default_factory=list)  # a deb822 stanza's lines (for a one-line entry: none)
    options: str = ""  # a one-line entry's "[...]"

    def with_suites(self, suites: list[str]) -> str:
        if self.lines:  # binary packages only (no deb-src), of these suites
            written = {"types:": "Types: deb\n", "suites:": f"Suites: {' '.join(suites)}\n"}
            return "".join(written.get(line.split(":", 1)[0].lower() + ":", line) for line in self.lines)
        return "".join(f"deb {self.options}{self.uri} {suite} {' '.join(self.components)}\n" for suite in suites)


def deb822_sources(text: str) -> list[Source]:
    found = []
    for stanza in re.split(r"\n[ \t]*\n", text):
        lines = [line + "\n" for line in stanza.splitlines() if not line.startswith("#")]
        fields: dict[str, str] = {}
        for line in lines:
            if line[:1] in (" ", "\t"):
                continue  # a continuation (e.g. an inline key): kept as written, not needed here
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if ("deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no"
                and fields.get("uris")):
            found.append(Source(fields["uris"].split()[0], fields.get("suites", "").split(),
                                fields.get("components", "").split(), lines))
    return found


def one_line_sources(text: str) -> list[Source]:
    found = []
    for line in text.splitlines():
        entry = re.match(r"deb\s+(\[[^]]*\]\s+)?(\S+)\s+(\S+)\s*([^#]*)", line.strip())
        if entry:
            options, uri, suite, components = entry.groups()
            found.append(Source(uri, [suite], components.split(), options=options or ""))
    return found


def machine_sources() -> list[Source]:
    sources: list[Source] = []
    for path in [APT_ETC / "sources.list", *sorted((APT_ETC / "sources.list.d").glob("*"))]:
        if path.is_file() and path.suffix == ".sources":
            sources += deb822_sources(path.read_text())
        elif path.is_file() and (path.suffix == ".list" or path.name == "sources.list"):
            sources += one_line_sources(path.read_text())
    return sources


def codename() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    sys.exit("fetch_valkey: no VERSION_CODENAME in /etc/os-release: not a Debian release apt knows")


def debian_source(release: str) -> Source:
    """The machine's entry for ``release`` main; Debian's archive first if a third-party one uses the same suite name."""
    candidates = [s for s in machine_sources() if release in s.suites and "main" in s.components]
    if not candidates:
        sys.exit(f"fetch_valkey: no apt source serves {release} main (read {APT_ETC}/sources.list and sources.list.d/)")
    return sorted(candidates, key=lambda s: not (s.uri.rstrip("/").endswith("/debian")
                                                 or "debian-archive-keyring" in "".join(s.lines)))[0]


def run(*argv: str, cwd: Path | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"fetch_valkey: {' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def installed(package: str) -> bool:
    done = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", package], capture_output=True, text=True)
    return done.returncode == 0 and done.stdout == "installed"


def library_depends(deb: Path) -> list[str]:
    """The shared-library packages a .deb depends on (first of each alternative, versions dropped)."""
    depends = run("dpkg-deb", "-f", str(deb), "Depends").strip()
    names = [re.split(r"[\s(:]", alternative.split("|")[0].strip(), maxsplit=1)[0] for alternative in depends.split(",")]
    return [name for name in names if name.startswith("lib")]


def version_line(server: Path) -> str:
    if not server.exists():
        return ""
    done = subprocess.run([str(server), "--version"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def wrap_for_libraries(dest: Path) -> None:
    """Libraries unpacked beside the binaries: valkey-server and valkey-cli become scripts that put
    them on LD_LIBRARY_PATH (the server keeps its name as argv[0]: the name selects server mode)."""
    dirs = ":".join(sorted({str(p.parent) for p in dest.rglob("*.so*") if p.is_file()}))
    for name in ("valkey-server", "valkey-cli"):
        path = dest / "usr" / "bin" / name
        if path.is_symlink():  # valkey-server -> valkey-check-rdb
            real = path.parent / os.readlink(path)
            path.unlink()
        else:
            real = path.rename(path.parent / f".{name}.real")
        path.write_text(f'#!/bin/bash\nLD_LIBRARY_PATH="{dirs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
                        f'exec -a "$0" "{real}" "$@"\n')
        path.chmod(0o755)


def download(dest: Path) -> None:
    release = codename()
    backports = f"{release}-backports"
    source = debian_source(release)
    work = Path(tempfile.mkdtemp(prefix="bullmq-compat-valkey-"))
    try:
        for sub in ("parts", "lists/partial", "cache/archives/partial", "debs"):
            (work / sub).mkdir(parents=True)
        (work / "sources.list").write_text("" if source.lines else source.with_suites([release, backports]))
        if source.lines:
            (work / "parts" / "debian.sources").write_text(source.with_suites([release, backports]))
        apt = ["-q", "-o", f"Dir::Etc::SourceList={work / 'sources.list'}", "-o", f"Dir::Etc::SourceParts={work / 'parts'}",
               "-o", f"Dir::State::Lists={work / 'lists'}", "-o", f"Dir::Cache={work / 'cache'}"]
        if os.geteuid() == 0:
            apt += ["-o", "APT::Sandbox::User=root"]  # the private folders are root's: no drop to _apt
        debs = work / "debs"
        print(f"fetch_valkey: {' '.join(PACKAGES)} from {source.uri} {backports} (apt's own sources untouched)", flush=True)
        run("apt-get", *apt, "update")
        run("apt-get", *apt, "-t", backports, "download", *PACKAGES, cwd=debs)
        wanted, seen, extra = [lib for deb in debs.glob("*.deb") for lib in library_depends(deb)], set(), []
        while wanted:  # the libraries that are not installed, and theirs
            name = wanted.pop()
            if name in seen or installed(name):
                continue
            seen.add(name)
            run("apt-get", *apt, "download", name, cwd=debs)
            extra.append(name)
            wanted += library_depends(next(debs.glob(f"{name}_*.deb")))
        shutil.rmtree(dest, ignore_errors=True)
        for deb in sorted(debs.glob("*.deb")):
            run("dpkg-deb", "-x", str(deb), str(dest))
        if extra:
            print(f"fetch_valkey: unpacked these libraries too (not installed here): {' '.join(extra)}")
            wrap_for_libraries(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / ".valkey").absolute()
    stamp, server = dest / ".installed", dest / "usr" / "bin" / "valkey-server"
    line = version_line(server) if stamp.exists() else ""
    if not line:
        download(dest)
        line = version_line(server)
    if not re.search(rf"\bv={MAJOR}\.", line):
        sys.exit(f"fetch_valkey: {server} --version said {line!r}, not Valkey {MAJOR}")
    stamp.write_text(line + "\n")
    print(f"fetch_valkey: {server}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
