"""Runs scripts by EVALSHA (SHA1s computed once), falling back to EVAL when Redis lacks one.

A script that is also in our function library (`Script.function`) runs by FCALL where Redis
serves the library (`FunctionLibraries`), and by EVALSHA where it does not.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Optional, Sequence

from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from bullmq_compat._backends.redis.lua import Library, Script, upstream_scripts

Call = tuple[Script, Sequence[Any], Sequence[Any]]
Execute = Callable[..., Awaitable[Any]]


def _argv(keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    # ioredis sends undefined/null arguments as empty strings; so do we.
    if None not in args:  # the hot calls (moveToActive, moveToFinished) have none
        return [*keys, *args]
    return [*keys, *("" if a is None else a for a in args)]


async def load_once(loading: dict[str, "asyncio.Future[Any]"], key: str, load: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``load()`` once for ``key``, however many callers ask meanwhile: each awaits that run."""
    future = loading.get(key)
    if future is None:
        future = loading[key] = asyncio.ensure_future(load())
        future.add_done_callback(lambda done: loading.pop(key) if loading.get(key) is done else None)
    return await asyncio.shield(future)


def _refused(err: BaseException) -> bool:
    """Redis will not run our functions: no FCALL (before 7.0) or not for this user (ACL)."""
    text = str(err).lower()
    return isinstance(err, NoPermissionError) or getattr(err, "code", "") == "NOPERM" or "unknown command" in text


def _function_missing(err: BaseException) -> bool:
    """Redis lacks the function called (library never loaded here, or flushed): the call did not run."""
    return "function not found" in str(err).lower()


class FunctionLibraries:
    """Whether one Redis serves our function library: loaded there on first need (one load at a
    time, however many calls wait for it), and given up for EVALSHA if Redis refuses it."""

    def __init__(self, enabled: bool = True) -> None:
        self.usable: Optional[bool] = None if enabled else False
        self._loading: dict[str, asyncio.Future[Any]] = {}

    async def call(self, execute: Execute, script: Script, num_keys: int, argv: Sequence[Any],
                   fallback: Callable[[], Awaitable[Any]]) -> Any:
        """``FCALL`` ``script``'s function (``argv``: its ``num_keys`` keys then args), loading the library if
        Redis lacks it (the call did not run then, so it is sent again); ``fallback()`` (EVALSHA)
        when Redis will not serve the library, or keeps losing it (FUNCTION FLUSH meanwhile)."""
        if script.function is None or script.library is None or self.usable is False:
            return await fallback()
        for _ in range(3):
            try:
                return await execute("FCALL", script.function, num_keys, *argv)
            except ResponseError as err:
                if _refused(err):
                    self.usable = False
                    return await fallback()
                if not _function_missing(err):
                    raise
            await self.load(execute, script.library)
            if not self.usable:
                break
        return await fallback()

    async def load(self, execute: Execute, library: Library) -> None:
        await load_once(self._loading, library.name, lambda: self._load(execute, library))

    async def _load(self, execute: Execute, library: Library) -> None:
        try:
            await execute("FUNCTION", "LOAD", library.lua)
        except ResponseError as err:
            if "already exists" not in str(err).lower():  # else: loaded by another client meanwhile
                self.usable = False
                return
        self.usable = True


class ScriptRunner:
    """Script calls over one redis-py client (plain, cluster or Sentinel-backed)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._loaded: set[str] = set()  # SHA1s seen loaded on the server (see call_many)
        # a Redis Cluster would need the library on every master: its scripts run by EVALSHA
        self.functions = FunctionLibraries(enabled=type(client).__name__ != "RedisCluster")

    @staticmethod
    def script(name: str) -> Script:
        return upstream_scripts()[name]

    async def call(self, script: Script | str, keys: Sequence[Any], args: Sequence[Any] = ()) -> Any:
        if isinstance(script, str):
            script = self.script(script)
        argv = _argv(keys, args)

        async def by_sha() -> Any:
            try:
                return await self.client.evalsha(script.sha, len(keys), *argv)
            except NoScriptError:
                # EVAL caches the script server-side, so the next EVALSHA finds it.
                return await self.client.eval(script.lua, len(keys), *argv)

        if script.function is None:
            return await by_sha()
        return await self.functions.call(self.client.execute_command, script, len(keys), argv, by_sha)

    async def call_many(self, calls: Sequence[Call]) -> list[Any]:
        """Many script calls in one round trip; each result or its exception, in order.

        A call refused with NOSCRIPT never ran, so it is safely sent again with EVAL.
        """
        if not calls:
            return []
        # Load missing scripts first: an EVAL re-sent after NOSCRIPT would run after the calls
        # behind it in the pipeline, out of order (add_bulk's ids, for one).
        new = {script.sha: script for script, _, _ in calls if script.sha not in self._loaded}
        if new:
            for (sha, script), present in zip(new.items(), await self.client.script_exists(*new)):
                if not present:
                    await self.client.script_load(script.lua)
            self._loaded.update(new)
        pipe = self.client.pipeline(transaction=False)
        for script, keys, args in calls:
            # execute_command, not pipe.evalsha: a RedisCluster pipeline blocks its evalsha method
            pipe.execute_command("EVALSHA", script.sha, len(keys), *_argv(keys, args))
        results: list[Any] = list(await pipe.execute(raise_on_error=False))
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)
                   or (isinstance(r, ResponseError) and str(r).startswith("NOSCRIPT"))]
        if missing:
            pipe = self.client.pipeline(transaction=False)
            for i in missing:
                script, keys, args = calls[i]
                pipe.execute_command("EVAL", script.lua, len(keys), *_argv(keys, args))
            for i, result in zip(missing, await pipe.execute(raise_on_error=False)):
                results[i] = result
        return results
