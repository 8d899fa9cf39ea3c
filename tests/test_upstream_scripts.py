"""Upstream BullMQ Lua scripts: fetched copy, our include resolver, and byte identity with Node."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import redis.asyncio as aioredis

from bullmq_compat._backends.redis import lua
from bullmq_compat._backends.redis.lua import (
    LuaIncludeError,
    Script,
    ScriptBuilder,
    own_library,
    own_script,
    upstream_scripts,
)
from bullmq_compat._errors import BullMQCompatError, UpstreamScriptsMissing
from bullmq_compat._wire import upstream

FIXTURES = Path(__file__).parent / "lua_fixtures"

# Requires every ready-built module exactly as Node BullMQ does and reports what it would send.
_NODE_DIGESTS = r"""
const fs = require('fs'), path = require('path'), crypto = require('crypto');
const dir = process.argv[1];
const out = {};
for (const file of fs.readdirSync(dir).filter(f => f.endsWith('.js')).sort()) {
  for (const s of Object.values(require(path.join(dir, file)))) {
    out[s.name] = { sha: crypto.createHash('sha1').update(s.content, 'utf8').digest('hex'), keys: s.keys };
  }
}
process.stdout.write(JSON.stringify(out));
"""


def _node_digests(ready: Path) -> dict[str, dict[str, object]]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the byte-identity check needs Node.js")
    proc = subprocess.run([node, "-e", _NODE_DIGESTS, str(ready)], capture_output=True, text=True, check=True)
    result: dict[str, dict[str, object]] = json.loads(proc.stdout)
    return result


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def no_script_caches() -> Iterator[None]:
    """Drop the per-process script caches before and after, so a test sees its own UPSTREAM_DIR."""
    upstream_scripts.cache_clear()
    lua.own_builder.cache_clear()
    yield
    upstream_scripts.cache_clear()
    lua.own_builder.cache_clear()


# --- (a) byte identity with what Node sends -------------------------------------------------


def test_every_upstream_script_builds_byte_identical_to_node_bullmq() -> None:
    ready = upstream.ready_dir()
    node = _node_digests(ready)
    ours = upstream_scripts()

    assert len(node) == len(list(ready.glob("*.js")))
    assert len(ours) == len(node)
    mismatched = sorted(name for name in node if name not in ours or ours[name].sha != node[name]["sha"])
    assert mismatched == []
    assert {name: s.num_keys for name, s in ours.items()} == {name: d["keys"] for name, d in node.items()}


def test_script_sha_is_sha1_of_its_utf8_text() -> None:
    script = Script("x", 0, "return 'é'\n")
    assert script.sha == hashlib.sha1("return 'é'\n".encode("utf-8")).hexdigest()


# --- (b) resolver -----------------------------------------------------------------------------


def test_include_resolves_relative_to_the_including_file(tmp_path: Path) -> None:
    _write(tmp_path, {
        "top-2.lua": "--- @include \"parts/a\"\n-- @include 'parts/c.lua'\nreturn a() + c()\n",
        "parts/a.lua": "--- @include \"b\"\nlocal function a() return b() end\n",
        "parts/b.lua": "local function b() return 1 end\n",
        "parts/c.lua": "local function c() return 2 end\n",
    })
    script = ScriptBuilder().build(tmp_path / "top-2.lua")

    assert (script.name, script.num_keys) == ("top", 2)
    assert script.lua == (
        "local function b() return 1 end\n"
        "local function a() return b() end\n"
        "local function c() return 2 end\n"
        "return a() + c()\n"
    )


def test_include_through_a_path_mapping(tmp_path: Path) -> None:
    _write(tmp_path, {
        "lib/helpers/h.lua": "local function h() return 3 end\n",
        "own/mine-0.lua": "--- @include \"<lib>/helpers/h\"\nreturn h()\n",
    })
    script = ScriptBuilder({"lib": tmp_path / "lib"}).build(tmp_path / "own/mine-0.lua")
    assert script.lua == "local function h() return 3 end\nreturn h()\n"


def test_unknown_path_mapping_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, {"mine-0.lua": "--- @include \"<nowhere>/x\"\nreturn 1\n"})
    with pytest.raises(LuaIncludeError, match=r'no path mapping for "<nowhere>"'):
        ScriptBuilder().build(tmp_path / "mine-0.lua")


def test_function_directive_embeds_a_whole_script_built_on_its_own(tmp_path: Path) -> None:
    """``--- @function name "ref"`` puts the script as built alone (its includes expanded in its own
    scope, even ones the outer script also includes) as the body of a function of KEYS and ARGV."""
    _write(tmp_path, {
        "lib/inc/h.lua": "local function h() return 3 end\n",
        "lib/up-1.lua": "--- @include \"inc/h\"\nreturn h() + KEYS[1]\n",
        "own/mine-1.lua": "--- @function up \"<lib>/up-1\"\n--- @include \"<lib>/inc/h\"\nreturn up(KEYS, ARGV) + h()\n",
    })
    builder = ScriptBuilder({"lib": tmp_path / "lib"})
    alone = builder.build(tmp_path / "lib/up-1.lua").lua
    script = builder.build(tmp_path / "own/mine-1.lua")
    assert script.lua == (
        "local function up(KEYS, ARGV)\n" + alone + "end\n"
        "local function h() return 3 end\n"
        "return up(KEYS, ARGV) + h()\n"
    )


def test_function_directive_naming_a_missing_script_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, {"mine-0.lua": "--- @function up \"gone-1\"\nreturn up(KEYS, ARGV)\n"})
    with pytest.raises(LuaIncludeError, match=r'script not found: "gone-1"'):
        ScriptBuilder().build(tmp_path / "mine-0.lua")


def test_group_finish_script_runs_upstream_move_to_finished_unchanged() -> None:
    """Our moveToFinishedGroup embeds upstream's moveToFinished byte for byte."""
    ours = own_script("moveToFinishedGroup-15.lua").lua
    assert "local function moveToFinished(KEYS, ARGV)\n" + upstream_scripts()["moveToFinished"].lua + "end" in ours


def test_library_defines_every_include_once_and_keeps_each_script_body(tmp_path: Path) -> None:
    """A function library: each include of any script (an embedded one's too) is defined once, at
    the top, where a build would first define it; a script's text without its include lines is its
    function's body, and an embedded script's is its local function's."""
    _write(tmp_path, {
        "lib/inc/h.lua": "local function h() return 3 end\n",
        "lib/inc/k.lua": "--- @include \"h\"\nlocal function k() return h() + 1 end\n",
        "lib/up-1.lua": "--[[ up ]]\nlocal rcall = redis.call\n--- @include \"inc/k\"\nreturn k() + KEYS[1]\n",
        "own/mine-1.lua": "local rcall = redis.call\n--- @function up \"<lib>/up-1\"\n--- @include \"<lib>/inc/h\"\n"
                          "return up(KEYS, ARGV) + h()\n",
        "own/other-0.lua": "--- @include \"<lib>/inc/k\"\nreturn k()\n",
    })
    builder = ScriptBuilder({"lib": tmp_path / "lib"}, hoist=True)
    library = builder.build_library("L", [tmp_path / "own/mine-1.lua", tmp_path / "own/other-0.lua"])
    assert library.functions == {"mine": "L_mine", "other": "L_other"}
    assert library.lua == (
        "#!lua name=L\nlocal rcall\n"
        "local function h() return 3 end\n"
        "local function k() return h() + 1 end\n"
        "local function up(KEYS, ARGV)\n--[[ up ]]\nlocal rcall = redis.call\nreturn k() + KEYS[1]\nend\n"
        "redis.register_function('L_mine', function(KEYS, ARGV)\nrcall = redis.call\nlocal rcall = redis.call\n"
        "return up(KEYS, ARGV) + h()\nend)\n"
        "redis.register_function('L_other', function(KEYS, ARGV)\nrcall = redis.call\nreturn k()\nend)\n")
    with pytest.raises(LuaIncludeError, match="build_library"):
        ScriptBuilder().build_library("L", [tmp_path / "own/mine-1.lua"])
    with pytest.raises(LuaIncludeError, match="libraries only"):
        builder.build(tmp_path / "own/mine-1.lua")


def test_our_library_runs_upstream_move_to_finished_body_unchanged() -> None:
    """In our library, upstream's moveToFinished is its file's text without the include lines, and
    no function is defined twice."""
    library = own_library()
    raw = (upstream.commands_dir() / "moveToFinished-14.lua").read_text(encoding="utf-8")
    body = lua._EMPTY_LINE_RE.sub("", lua._INCLUDE_RE.sub("", raw))
    assert "\nlocal function moveToFinished(KEYS, ARGV)\n" + body + "end\n" in library.lua
    names = re.findall(r"^local function (\w+)\(", library.lua, re.M)
    assert names and len(names) == len(set(names))
    assert own_script("moveToFinishedGroup-15.lua").function == library.functions["moveToFinishedGroup"]


def test_own_lua_composes_with_upstream_includes(monkeypatch: pytest.MonkeyPatch, no_script_caches: None) -> None:
    monkeypatch.setattr(lua, "OWN_LUA_DIR", FIXTURES)
    script = own_script("pausedAndNextDelayed-2.lua")
    text = script.lua

    assert (script.name, script.num_keys) == ("pausedAndNextDelayed", 2)
    assert "@include" not in text and "@@" not in text
    assert text.count("local function getNextDelayedTimestamp(") == 1
    assert text.count("local function isQueuePaused(") == 1
    # Emitted where first included: before the include that needs it again.
    assert text.index("local function getNextDelayedTimestamp(") < text.index("local function addDelayMarkerIfNeeded(")
    assert "\n\n" not in text


def test_file_included_by_two_parents_is_emitted_once_at_its_first_use(tmp_path: Path) -> None:
    _write(tmp_path, {
        "top-0.lua": "--- @include \"parts/left\"\n--- @include \"parts/right\"\nreturn 1\n",
        "parts/left.lua": "--- @include \"base\"\nlocal function left() end\n",
        "parts/right.lua": "--- @include \"base\"\nlocal function right() end\n",
        "parts/base.lua": "local function base() end\n",
    })
    script = ScriptBuilder().build(tmp_path / "top-0.lua")
    assert script.lua == (
        "local function base() end\n"
        "local function left() end\n"
        "local function right() end\n"
        "return 1\n"
    )


def test_same_file_included_twice_by_one_parent_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, {
        "top-0.lua": "--- @include \"a\"\nlocal x = 1\n--- @include \"a.lua\"\nreturn x\n",
        "a.lua": "local function a() end\n",
    })
    with pytest.raises(LuaIncludeError, match=r'"a.lua" is included more than once in .*top-0\.lua:3'):
        ScriptBuilder().build(tmp_path / "top-0.lua")


def test_include_cycle_is_refused_naming_the_files(tmp_path: Path) -> None:
    _write(tmp_path, {
        "top-0.lua": "--- @include \"a\"\nreturn 1\n",
        "a.lua": "--- @include \"b\"\n",
        "b.lua": "--- @include \"a\"\n",
    })
    with pytest.raises(LuaIncludeError, match=r"include cycle: .*a\.lua -> .*b\.lua -> .*a\.lua"):
        ScriptBuilder().build(tmp_path / "top-0.lua")


def test_missing_include_is_refused_naming_it_and_the_includer(tmp_path: Path) -> None:
    _write(tmp_path, {"top-0.lua": "local x = 1\n--- @include \"parts/nope\"\nreturn x\n"})
    with pytest.raises(LuaIncludeError) as info:
        ScriptBuilder().build(tmp_path / "top-0.lua")
    message = str(info.value)
    assert '"parts/nope"' in message and "top-0.lua:2" in message
    assert isinstance(info.value, BullMQCompatError)


def test_dollar_sequences_in_included_text_are_kept_literally(tmp_path: Path) -> None:
    # Upstream's JS String.replace would expand these; no upstream file has them, and we choose
    # to keep our own Lua literal rather than reproduce that trap.
    _write(tmp_path, {
        "top-0.lua": "--- @include \"a\"\nreturn 1\n",
        "a.lua": "local p = \"$& $$ $' $`\"\n",
    })
    assert ScriptBuilder().build(tmp_path / "top-0.lua").lua == "local p = \"$& $$ $' $`\"\nreturn 1\n"


def test_script_file_name_must_carry_the_key_count(tmp_path: Path) -> None:
    _write(tmp_path, {"noKeys.lua": "return 1\n"})
    with pytest.raises(LuaIncludeError, match="<name>-<numkeys>.lua"):
        ScriptBuilder().build(tmp_path / "noKeys.lua")


# --- (c) missing or stale upstream copy -----------------------------------------------------


def test_missing_upstream_scripts_say_how_to_fetch_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_script_caches: None
) -> None:
    monkeypatch.setattr(upstream, "UPSTREAM_DIR", tmp_path / "empty")
    for call in (upstream.commands_dir, upstream.ready_dir, upstream_scripts):
        with pytest.raises(UpstreamScriptsMissing) as info:
            call()
        assert "run 'make setup' in a clone, or 'bullmq-compat fetch-upstream'" in str(info.value)


def test_upstream_copy_for_another_version_counts_as_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, {"VERSION": "0.0.1\n", "commands/x-0.lua": "return 1\n", "ready/x-0.js": ""})
    monkeypatch.setattr(upstream, "UPSTREAM_DIR", tmp_path)
    with pytest.raises(UpstreamScriptsMissing, match=rf"fetched for 0\.0\.1, but the pin is {upstream.UPSTREAM_VERSION}"):
        upstream.commands_dir()


# --- (d) built scripts run on Redis ---------------------------------------------------------


async def test_built_get_counts_loads_into_redis_under_its_sha(redis_url: str) -> None:
    script = upstream_scripts()["getCounts"]
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert await client.script_load(script.lua) == script.sha
    finally:
        await client.aclose()


async def test_a_library_loads_and_its_functions_run_on_redis(redis_url: str, tmp_path: Path) -> None:
    _write(tmp_path, {
        "lib/inc/h.lua": "local function h() return 3 end\n",
        "lib/up-1.lua": "local rcall = redis.call\n--- @include \"inc/h\"\nreturn h() + rcall('INCRBY', KEYS[1], 1)\n",
        "own/mine-1.lua": "--- @function up \"<lib>/up-1\"\nreturn up(KEYS, ARGV) + rcall('INCRBY', KEYS[1], ARGV[1])\n",
    })
    name = "bmqc_test_" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]
    library = ScriptBuilder({"lib": tmp_path / "lib"}, hoist=True).build_library(name, [tmp_path / "own/mine-1.lua"])
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert await client.function_load(library.lua) == name
        key = f"{name}:n"
        assert await client.fcall(library.functions["mine"], 1, key, 10) == 3 + 1 + 11
    finally:
        await client.function_delete(name)
        await client.delete(f"{name}:n")
        await client.aclose()


async def test_the_fast_channel_runs_a_function_that_fails_once(redis_url: str, tmp_path: Path) -> None:
    """A function's own error reply is the call's result: the worker's channel sends FCALL again
    only when Redis lacks the library (the call did not run), never after an error of the call."""
    import dataclasses

    from bullmq_compat._backends.redis.channel import FastChannel
    from bullmq_compat._backends.redis.fastconn import ReplyError

    _write(tmp_path, {"own/boom-1.lua": "return redis.error_reply('boom ' .. redis.call('INCR', KEYS[1]))\n"})
    name = "bmqc_test_" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]
    library = ScriptBuilder(hoist=True).build_library(name, [tmp_path / "own/boom-1.lua"])
    script = dataclasses.replace(ScriptBuilder().build(tmp_path / "own/boom-1.lua"),
                                 function=library.functions["boom"], library=library)
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    channel = await FastChannel.open(client, None)
    key = f"{name}:n"
    try:
        with pytest.raises(ReplyError, match="boom 1"):  # the library is loaded first, then it runs once
            await channel.call((script, [key], []))
        with pytest.raises(ReplyError, match="boom 2"):  # loaded: one FCALL
            await channel.call((script, [key], []))
        assert await client.get(key) == "2"
    finally:
        await channel.close()
        await client.function_delete(name)
        await client.delete(key)
        await client.aclose()


async def test_own_lua_with_upstream_includes_runs_on_redis(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch, no_script_caches: None
) -> None:
    monkeypatch.setattr(lua, "OWN_LUA_DIR", FIXTURES)
    script = own_script("pausedAndNextDelayed-2.lua")
    meta, delayed = f"bull:{queue_name}:meta", f"bull:{queue_name}:delayed"
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await client.hset(meta, "paused", "1")
        await client.zadd(delayed, {"job": 1700000000000 * 0x1000})
        sha = await client.script_load(script.lua)
        assert await client.evalsha(sha, script.num_keys, meta, delayed) == [1, 1700000000000]
    finally:
        await client.delete(meta, delayed)
        await client.aclose()
