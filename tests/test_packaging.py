"""The built package is whole: the sdist and the wheel carry upstream's Lua, SQL and licence, and an
installed wheel runs Redis and PostgreSQL jobs with no Node and no npm on PATH.

The build runs on a copy of the checkout's tracked files plus its fetched ``_upstream`` (what
``make setup`` left), with ``PATH`` holding only the test venv's ``bin``: neither the sdist nor the
wheel built from it may need npm once the files are there. ``fetch-upstream --tarball`` is checked
on the real npm tarball (``npm pack``, from npm's cache after ``make setup``).
"""
from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from bullmq_compat._version import __version__
from bullmq_compat._wire import upstream
from tests.wheel_helpers import ROOT, VENV_BIN, build_dists, install_into_new_venv, run

pytestmark = pytest.mark.xdist_group("packaging")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An sdist and the wheel built from it (python -m build), from a copy of the checkout."""
    return build_dists(tmp_path_factory.mktemp("packaging"))


def _expected_upstream_files() -> set[str]:
    return {p.relative_to(upstream.UPSTREAM_DIR).as_posix() for p in upstream.UPSTREAM_DIR.rglob("*") if p.is_file()}


def test_the_wheel_holds_upstreams_scripts_sql_licence_and_our_own_files(built: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    shipped = {n.removeprefix("bullmq_compat/_upstream/") for n in names if n.startswith("bullmq_compat/_upstream/")}
    assert shipped == _expected_upstream_files()
    assert len([n for n in shipped if n.startswith("postgres/commands/")]) == upstream.POSTGRES_COMMAND_COUNT == 101
    assert sorted(n.removeprefix("postgres/migrations/") for n in shipped if n.startswith("postgres/migrations/")) \
        == sorted(upstream.POSTGRES_MIGRATION_SHA256)
    assert {"LICENSE", "VERSION", "commands/moveToActive-11.lua", "commands/includes/prepareJobForProcessing.lua",
            "ready/moveToActive-11.js"} <= shipped
    license_text = zipfile.ZipFile(built["wheel"]).read("bullmq_compat/_upstream/LICENSE").decode()
    assert "MIT" in license_text or "Permission is hereby granted" in license_text
    own_lua = {p.relative_to(ROOT).as_posix() for p in (ROOT / "bullmq_compat/_backends/redis/lua").rglob("*.lua")}
    assert own_lua and own_lua <= names
    assert "bullmq_compat/py.typed" in names
    assert {"bullmq_compat/_board/board.js", "bullmq_compat/_board/package.json",
            "bullmq_compat/_board/package-lock.json"} <= names
    assert f"bullmq_compat-{__version__}.dist-info/licenses/LICENSE" in names


def test_the_sdist_holds_the_same_upstream_files(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as sdist:
        prefix = f"bullmq_compat-{__version__}/bullmq_compat/_upstream/"
        shipped = {m.name.removeprefix(prefix) for m in sdist.getmembers() if m.isfile() and m.name.startswith(prefix)}
    assert shipped == _expected_upstream_files()


def test_twine_check_passes(built: dict[str, Path]) -> None:
    out = run([str(VENV_BIN / "twine"), "check", "--strict", str(built["wheel"]), str(built["sdist"])],
               cwd=built["work"], path=str(VENV_BIN))
    assert out.count("PASSED") == 2


INSTALLED_RUN = textwrap.dedent('''
    import asyncio, shutil, sys
    from pathlib import Path

    import bullmq_compat
    from bullmq_compat import Queue, Worker, migrate_postgres
    from bullmq_compat._backends.postgres import sql
    from bullmq_compat._wire import upstream
    from bullmq_compat._backends.redis import lua

    assert Path(bullmq_compat.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), bullmq_compat.__file__
    assert shutil.which("node") is None and shutil.which("npm") is None
    # every upstream script the resolver builds (includes resolved), ours, and the SQL commands
    assert len(lua.upstream_scripts()) > 40
    assert len(sql.command_texts()) == 101
    for path in sorted(lua.OWN_LUA_DIR.glob("*.lua")):
        lua.own_script(path.name)
    lua.own_library()

    async def one_job(connection, **where):
        async with Queue("installed", connection=connection, **where) as queue:
            job = await queue.add("double", {"i": 21})
            done = asyncio.Event()
            worker = Worker("installed", lambda job: job.data["i"] * 2, connection=connection, **where)
            worker.on("completed", lambda *args: done.set())
            running = asyncio.ensure_future(worker.run())
            await asyncio.wait_for(done.wait(), 60)
            await worker.close()
            await running
            finished = await queue.get_job(job.id)
            assert finished.returnvalue == 42, finished.returnvalue
            print("ok", queue.backend.kind)

    async def main(redis_url, postgres_url, schema):
        await one_job(redis_url)
        assert await migrate_postgres(postgres_url, schema=schema) == len(list(upstream.postgres_migrations_dir().glob("*.sql")))
        await one_job(postgres_url, schema=schema)

    asyncio.run(main(*sys.argv[1:]))
''')


@pytest.fixture(scope="module", params=["wheel", "sdist"])
def installed(request: pytest.FixtureRequest, built: dict[str, Path]) -> Path:
    """A new venv with the built wheel (or the sdist, built by pip with PATH = the venv's bin: no npm)
    and its [postgres] extra installed; returns its bin folder."""
    return install_into_new_venv(built[request.param], built["work"] / f"venv-{request.param}")


def test_an_installed_wheel_runs_redis_and_postgres_jobs_without_node_or_npm(
        installed: Path, redis_url: str, postgres_url: str, pg_schema: str, tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(INSTALLED_RUN)
    out = run([str(installed / "python"), str(script), redis_url, postgres_url, pg_schema], cwd=tmp_path,
               path=str(installed), timeout=180)
    assert out.split("\n")[:2] == ["ok redis", "ok postgres"]


def test_the_installed_command_prints_its_version_and_the_upstream_pin(installed: Path, tmp_path: Path) -> None:
    out = run([str(installed / "bullmq-compat"), "--version"], cwd=tmp_path, path=str(installed))
    assert out.strip() == f"bullmq-compat {__version__} (upstream bullmq {upstream.UPSTREAM_VERSION})"


def test_the_installed_board_says_what_it_needs_without_node(installed: Path, tmp_path: Path) -> None:
    environment = {**os.environ, "PATH": str(installed), "XDG_CACHE_HOME": str(tmp_path)}
    environment.pop("BULLMQ_COMPAT_BOARD_DIR", None)
    proc = subprocess.run([str(installed / "bullmq-compat"), "board", "--queue", "q"], cwd=tmp_path, env=environment,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "board needs Node.js 20+ for Bull-Board, and 'node' is not on PATH" in proc.stderr


# -- fetch-upstream --tarball: offline, same checks --------------------------------------------------

@pytest.fixture(scope="module")
def npm_tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not on PATH (make setup installs the Node side)")
    out = tmp_path_factory.mktemp("tarball")
    subprocess.run([npm, "pack", f"bullmq@{upstream.UPSTREAM_VERSION}", "--pack-destination", str(out),
                    "--loglevel=error"], check=True, capture_output=True, timeout=300)
    tarball, = out.glob("*.tgz")
    return tarball


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": str(VENV_BIN)}  # no npm: a tarball needs none
    return subprocess.run([sys.executable, "-m", "bullmq_compat", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.node
def test_fetch_upstream_from_a_tarball_writes_what_npm_pack_gives(npm_tarball: Path, tmp_path: Path) -> None:
    into = tmp_path / "up"
    proc = _cli("fetch-upstream", "--tarball", str(npm_tarball), "--into", str(into), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"fetched upstream bullmq@{upstream.UPSTREAM_VERSION}" in proc.stdout
    assert upstream.is_current(into)
    compared = filecmp.dircmp(upstream.UPSTREAM_DIR, into)
    files = sorted(_expected_upstream_files())
    match, mismatch, errors = filecmp.cmpfiles(upstream.UPSTREAM_DIR, into, files, shallow=False)
    assert (mismatch, errors) == ([], []) and len(match) == len(files), compared.report()


@pytest.mark.node
def test_fetch_upstream_refuses_a_tarball_that_is_not_the_pinned_one(npm_tarball: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "bullmq-6.7.0.tgz"
    tampered.write_bytes(npm_tarball.read_bytes() + b"\0")
    into = tmp_path / "up"
    proc = _cli("fetch-upstream", "--tarball", str(tampered), "--into", str(into), cwd=tmp_path)
    assert proc.returncode == 1
    assert "does not match the pin" in proc.stderr and "Traceback" not in proc.stderr
    assert not into.exists() and list(tmp_path.iterdir()) == [tampered]


def test_fetch_upstream_names_a_missing_or_wrong_tarball(tmp_path: Path) -> None:
    missing = _cli("fetch-upstream", "--tarball", str(tmp_path / "nope.tgz"), "--into", str(tmp_path / "up"),
                   cwd=tmp_path)
    assert missing.returncode == 1 and "nope.tgz: no such file" in missing.stderr
    not_tar = tmp_path / "bullmq.tgz"
    not_tar.write_text("hello")
    wrong = _cli("fetch-upstream", "--tarball", str(not_tar), "--into", str(tmp_path / "up"), cwd=tmp_path)
    assert wrong.returncode == 1 and "is not a tar archive" in wrong.stderr
    assert not (tmp_path / "up").exists()
