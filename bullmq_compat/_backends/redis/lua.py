"""Build Lua scripts from sources with ``--- @include`` lines, exactly as upstream BullMQ does.

Node BullMQ ships raw ``<name>-<numkeys>.lua`` files whose ``--- @include "includes/x"`` lines are
expanded at build time. Redis identifies a script by the SHA1 of its text, so to share Redis with
Node workers our expansion must produce byte-identical text. This module is our own
implementation of upstream's rules:

* an include line matches :data:`_INCLUDE_RE` (a JS regex, translated exactly);
* a reference resolves relative to the including file's directory, or through a path mapping
  when it starts with ``<name>``; ``.lua`` is appended when it has no extension;
* including the same file twice from one parent, a cycle, or a missing file is an error;
* expansion is depth-first; each file is emitted at most once per top-level script, at the
  place of its first include, and every other include of it is dropped;
* finally all empty lines are removed.

One addition of ours, never found in upstream files: ``--- @function name "<upstream>/x-N"`` puts
the whole upstream script ``x-N`` there, built exactly as it is loaded on its own, as the body of
``local function name(KEYS, ARGV)``. A script of ours can then run an upstream command unchanged
and do more in the same call (the group layer finishes a job and releases its group's next one).

Our hottest scripts are also built as one Redis Function library (:func:`own_library`, Redis 7
and newer): the same files, but every include (and every include of an embedded upstream script)
is defined once, when the library is loaded, instead of on every call. The scripts' own text, and
an embedded upstream script's body, become the functions' bodies unchanged. Where the library
cannot be used (older Redis, ACL), the same scripts run by EVALSHA.

Upstream's glob includes (``@include "includes/*"``) are not supported: no upstream script uses one.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Optional

from bullmq_compat._errors import BullMQCompatError
from bullmq_compat._wire.upstream import commands_dir

__all__ = [
    "LuaIncludeError", "Script", "Library", "ScriptBuilder", "upstream_scripts", "own_builder", "own_script",
    "own_library", "OWN_LUA_DIR", "UPSTREAM_MAPPING", "LIBRARY_SCRIPTS",
]

OWN_LUA_DIR = Path(__file__).resolve().parent / "lua"
"""Where bullmq-compat's own ``<name>-<numkeys>.lua`` scripts live."""

UPSTREAM_MAPPING = "upstream"
"""Mapping name with which our own Lua includes upstream files: ``@include "<upstream>/includes/x"``."""

# Upstream's patterns are JavaScript regexes with the ``m`` flag. JS and Python differ on what a
# line terminator is (JS also counts \r, \u2028, \u2029 for ^, $ and .) and on \s (JS includes
# \ufeff but not \x1c-\x1f or \x85), so those pieces are spelled out to match JS exactly, rather
# than relying on upstream files happening to use plain \n line ends.
_JS_LT = "\n\r\u2028\u2029"
_JS_BOL = rf"(?:\A|(?<=[{_JS_LT}]))"
_JS_EOL = rf"(?=[{_JS_LT}]|\Z)"
_JS_DOT = rf"[^{_JS_LT}]"
_JS_SPACE = "[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"

# JS: /^[-]{2,3}[ \t]*@include[ \t]+(["'])(.+?)\1[; \t\n]*$/m. The trailing class swallows the
# line's newline and any blank lines after it (all but the last newline), which affects the
# output text, so it is kept as is.
_INCLUDE_RE = re.compile(
    rf"""{_JS_BOL}[-]{{2,3}}[ \t]*@include[ \t]+(["'])({_JS_DOT}+?)\1[; \t\n]*{_JS_EOL}"""
)
# JS: /^\s*[\r\n]/gm
_EMPTY_LINE_RE = re.compile(rf"{_JS_BOL}{_JS_SPACE}*[\r\n]")

# ours: --- @function name "reference" (a whole script as a local function of KEYS and ARGV)
_FUNCTION_RE = re.compile(r"""^---[ \t]*@function[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]+(["'])(.+?)\2[ \t]*$""", re.M)

_SCRIPT_NAME_RE = re.compile(r"([A-Za-z0-9_]+)-(\d+)\.lua\Z")


class LuaIncludeError(BullMQCompatError):
    """A Lua script could not be built: bad name, missing include, duplicate include or cycle."""


@dataclass(frozen=True)
class Library:
    """Scripts of ours as one Redis Function library: ``FUNCTION LOAD`` its ``lua``, then
    ``FCALL functions[script name]`` with the script's keys and arguments."""

    name: str
    lua: str
    functions: Mapping[str, str]


@dataclass(frozen=True)
class Script:
    """A built Lua script, ready for ``SCRIPT LOAD`` / ``EVALSHA``; when it is also in a
    `Library`, ``function`` names it there (callers then try ``FCALL`` first)."""

    name: str
    num_keys: int
    lua: str
    sha: str = field(init=False)
    function: Optional[str] = field(default=None, compare=False, repr=False)
    library: Optional[Library] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.lua.encode("utf-8")).hexdigest())


@dataclass
class _Source:
    """One parsed file: its text with each include line replaced by the included file's token."""

    path: str
    token: str
    text: str
    includes: list[_Source]


def _token(path: str) -> str:
    # A placeholder that cannot occur in Lua by accident; unique per file.
    return "@@" + hashlib.sha1(path.encode("utf-8")).hexdigest()


def _line_of(text: str, fragment: str) -> int:
    pos = text.find(fragment)
    return text.count("\n", 0, pos) + 1 if pos >= 0 else 0


def _with_ext(reference: str) -> str:
    ext = os.path.splitext(os.path.basename(reference))[1]
    return reference if ext not in ("", ".") else reference + ".lua"


class ScriptBuilder:
    """Builds scripts from files, caching every parsed file across all scripts it builds.

    ``mappings`` maps a name to a directory, so that ``@include "<name>/rest"`` resolves to
    ``directory/rest``. A builder made with ``hoist=True`` builds libraries (`build_library`):
    there an ``@function`` line becomes an include of its own, whose includes are the embedded
    script's, so that they too are defined once per library.
    """

    def __init__(self, mappings: Mapping[str, str | os.PathLike[str]] | None = None, *,
                 hoist: bool = False) -> None:
        self._mappings = {name: os.path.abspath(p) for name, p in (mappings or {}).items()}
        self._hoist = hoist
        self._parsed: dict[str, _Source] = {}
        self._built: dict[str, Script] = {}

    def build(self, path: str | os.PathLike[str]) -> Script:
        """Build the script at ``path``, named ``<name>-<numkeys>.lua``."""
        abspath = os.path.abspath(path)
        cached = self._built.get(abspath)
        if cached is not None:
            return cached
        match = _SCRIPT_NAME_RE.match(os.path.basename(abspath))
        if match is None:
            raise LuaIncludeError(f"script file name must be <name>-<numkeys>.lua, got {abspath}")
        if not os.path.isfile(abspath):
            raise LuaIncludeError(f"script not found: {abspath}")
        if self._hoist:
            raise LuaIncludeError("a hoisting builder builds libraries only (build_library)")
        source = self._parse(abspath, [])
        lua = _EMPTY_LINE_RE.sub("", _interpolate(source, set()))
        script = Script(match.group(1), int(match.group(2)), lua)
        self._built[abspath] = script
        return script

    def build_library(self, name: str, paths: list[str | os.PathLike[str]]) -> Library:
        """One Redis Function library of the scripts at ``paths``, named ``name``; each script
        becomes the function ``<name>_<script name>``.

        Every include of every script is defined once, at the library's top level, in the order
        the scripts' builds would first define it; ``rcall`` is a library local that each
        function sets to ``redis.call`` first (``redis.call`` cannot be read while a library
        loads). The scripts' own text, without its include lines, is the function's body.
        """
        if not self._hoist:
            raise LuaIncludeError("build_library needs a builder made with hoist=True")
        processed: set[str] = set()
        definitions: list[str] = []
        registrations: list[str] = []
        functions: dict[str, str] = {}
        for path in paths:
            abspath = os.path.abspath(path)
            match = _SCRIPT_NAME_RE.match(os.path.basename(abspath))
            if match is None or not os.path.isfile(abspath):
                raise LuaIncludeError(f"library script must be an existing <name>-<numkeys>.lua, got {abspath}")
            source = self._parse(abspath, [])
            body = source.text
            for child in source.includes:
                emitted = child.path in processed
                fragment = _interpolate(child, processed)
                processed.add(child.path)
                if not emitted:
                    definitions.append(fragment)
                body = body.replace(child.token, "")
            function = f"{name}_{match.group(1)}"
            functions[match.group(1)] = function
            registrations.append(
                f"redis.register_function('{function}', function(KEYS, ARGV)\nrcall = redis.call\n{body}\nend)\n")
        lua = "".join([f"#!lua name={name}\nlocal rcall\n", *definitions, "\n", *registrations])
        return Library(name, _EMPTY_LINE_RE.sub("", lua), functions)

    def _resolve(self, reference: str, parent: str) -> str:
        """The absolute path ``reference`` (as written in ``parent``) points to."""
        reference = _with_ext(reference)
        if reference.startswith("<"):
            end = reference.find(">")
            if end > 0:
                name = reference[1:end]
                base = self._mappings.get(name)
                if base is None:
                    raise LuaIncludeError(
                        f'no path mapping for "<{name}>" (include "{reference}" in {parent}; '
                        f"known: {sorted(self._mappings) or 'none'})"
                    )
                return os.path.normpath(os.path.join(base, reference[end + 1:].lstrip("/\\")))
        return os.path.normpath(os.path.join(os.path.dirname(parent), reference))

    def _parse(self, path: str, stack: list[str]) -> _Source:
        """Parse ``path`` and (recursively) everything it includes; ``stack`` is the include chain."""
        if path in stack:
            chain = " -> ".join([*stack[stack.index(path):], path])
            raise LuaIncludeError(f"include cycle: {chain}")
        cached = self._parsed.get(path)
        if cached is not None:
            return cached
        try:
            with open(path, encoding="utf-8", newline="") as f:
                original = f.read()
        except FileNotFoundError:
            # Callers check existence first; this only guards against a race.
            raise LuaIncludeError(f"Lua file not found: {path}") from None

        stack.append(path)
        embedded: list[_Source] = []
        text = self._embed_functions(original, path, stack, embedded)
        source = _Source(path=path, token=_token(path), text=text, includes=[])
        # Like upstream, search again from the top after each substitution, and substitute the
        # first occurrence of the matched text (str.replace with count=1 == JS String.replace).
        while (m := _INCLUDE_RE.search(text)) is not None:
            reference = m.group(2)
            child_path = self._resolve(reference, path)
            where = f"{path}:{_line_of(original, m.group(0))}"
            if any(inc.path == child_path for inc in source.includes):
                raise LuaIncludeError(f'"{reference}" is included more than once in {where}')
            if not os.path.isfile(child_path):
                raise LuaIncludeError(f'include not found: "{reference}" (looked for {child_path}) in {where}')
            child = self._parse(child_path, stack)
            source.includes.append(child)
            text = text.replace(m.group(0), child.token, 1)
        stack.pop()
        if embedded:  # hoisting: embedded scripts are includes too, in the order they appear
            source.includes = sorted([*source.includes, *embedded], key=lambda child: text.find(child.token))
        source.text = text
        self._parsed[path] = source
        return source

    def _embed_functions(self, text: str, path: str, stack: list[str], embedded: list[_Source]) -> str:
        """Replace each ``--- @function name "reference"`` line by the built script as a function.

        When hoisting, by the token of an include made for it instead (added to ``embedded``):
        its includes are the embedded script's, its text the function, defined after them."""
        def embed(m: re.Match[str]) -> str:
            reference = m.group(3)
            child_path = self._resolve(reference, path)
            where = f"{path}:{_line_of(text, m.group(0))}"
            if child_path in stack:
                raise LuaIncludeError(f"include cycle: {' -> '.join([*stack, child_path])}")
            if not os.path.isfile(child_path):
                raise LuaIncludeError(f'script not found: "{reference}" (looked for {child_path}) in {where}')
            if self._hoist:
                stack.append(path)
                script = self._parse(child_path, stack)
                stack.pop()
                body = script.text
                for child in script.includes:
                    body = body.replace(child.token, "")
                function = _Source(path=f"{child_path}#{m.group(1)}", token=_token(f"{child_path}#{m.group(1)}"),
                                   text="".join(child.token for child in script.includes)
                                   + f"\nlocal function {m.group(1)}(KEYS, ARGV)\n{body}\nend\n",
                                   includes=list(script.includes))
                embedded.append(function)
                return function.token
            body = self.build(child_path).lua
            return f"local function {m.group(1)}(KEYS, ARGV)\n{body}\nend"

        return _FUNCTION_RE.sub(embed, text)


def _interpolate(source: _Source, processed: set[str]) -> str:
    """Expand ``source``'s includes; ``processed`` holds files already emitted in this script.

    Upstream replaces tokens with JS ``String.replace(token, text)``, which would interpret
    ``$$``, ``$&``, ``$``` and ``$'`` in ``text``. No upstream Lua file contains any of these
    (checked for the pinned release; the byte-identity test would catch a change), so plain
    literal replacement gives the same result.
    """
    text = source.text
    for child in source.includes:
        emitted = child.path in processed
        # Upstream expands the child even when it is dropped; that marks its own includes as
        # processed, which decides where they are emitted later in the script.
        fragment = _interpolate(child, processed)
        if not emitted and fragment:
            text = text.replace(child.token, fragment, 1)
        text = text.replace(child.token, "")
        processed.add(child.path)
    return text


class UpstreamScripts(Mapping[str, Script]):
    """Upstream's scripts by name, each built the first time it is asked for (a process uses a
    dozen of the seventy; building them all cost a Worker's start ~45 ms)."""

    def __init__(self) -> None:
        self._builder = ScriptBuilder()
        self._paths = {match.group(1): path for path in sorted(commands_dir().glob("*-*.lua"))
                       if (match := _SCRIPT_NAME_RE.match(path.name)) is not None}

    def __getitem__(self, name: str) -> Script:
        return self._builder.build(self._paths[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


@functools.cache
def upstream_scripts() -> UpstreamScripts:
    """Every upstream script, keyed by name (e.g. ``"addStandardJob"``); each built once per process."""
    return UpstreamScripts()


@functools.cache
def own_builder() -> ScriptBuilder:
    """The builder for our own Lua, which maps ``<upstream>`` to upstream's commands directory."""
    return ScriptBuilder({UPSTREAM_MAPPING: commands_dir()})


LIBRARY_SCRIPTS = ("moveToFinishedGroup-15.lua",)
"""Our scripts that are also in the function library: those run once per job."""


def own_script(filename: str) -> Script:
    """Build one of our own scripts, ``bullmq_compat/_backends/redis/lua/<name>-<numkeys>.lua`` (cached); one of
    `LIBRARY_SCRIPTS` also names its function in `own_library`."""
    return _own_script(own_builder(), OWN_LUA_DIR, filename)


@functools.cache
def _own_script(builder: ScriptBuilder, directory: Path, filename: str) -> Script:
    # keyed by builder and directory too, so that a new builder (or a test's directory) is seen;
    # spares the hot paths (a group job's finish) building a path on every call
    script = builder.build(directory / filename)
    if directory == OWN_LUA_DIR and filename in LIBRARY_SCRIPTS:
        library = own_library()
        script = dataclasses.replace(script, function=library.functions[script.name], library=library)
    return script


@functools.cache
def own_library() -> Library:
    """`LIBRARY_SCRIPTS` as one function library, named after the scripts' text (so different
    versions of bullmq-compat on one Redis each load their own)."""
    builder = ScriptBuilder({UPSTREAM_MAPPING: commands_dir()}, hoist=True)
    scripts = [own_builder().build(OWN_LUA_DIR / filename) for filename in LIBRARY_SCRIPTS]
    digest = hashlib.sha1("\0".join(script.lua for script in scripts).encode("utf-8")).hexdigest()
    return builder.build_library(f"bullmq_compat_{digest[:16]}", [OWN_LUA_DIR / f for f in LIBRARY_SCRIPTS])
