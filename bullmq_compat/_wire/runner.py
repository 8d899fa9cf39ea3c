"""Runs scripts by EVALSHA (SHA1s computed once), falling back to EVAL when Redis lacks one."""
from __future__ import annotations

from typing import Any, Sequence

from redis.exceptions import NoScriptError, ResponseError

from bullmq_compat._wire.lua import Script, upstream_scripts

Call = tuple[Script, Sequence[Any], Sequence[Any]]


def _argv(keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    # ioredis sends undefined/null arguments as empty strings; so do we.
    return [*keys, *("" if a is None else a for a in args)]


class ScriptRunner:
    """Script calls over one redis-py client (plain, cluster or Sentinel-backed)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._loaded: set[str] = set()  # SHA1s seen loaded on the server (see call_many)

    @staticmethod
    def script(name: str) -> Script:
        return upstream_scripts()[name]

    async def call(self, script: Script | str, keys: Sequence[Any], args: Sequence[Any] = ()) -> Any:
        if isinstance(script, str):
            script = self.script(script)
        argv = _argv(keys, args)
        try:
            return await self.client.evalsha(script.sha, len(keys), *argv)
        except NoScriptError:
            # EVAL caches the script server-side, so the next EVALSHA finds it.
            return await self.client.eval(script.lua, len(keys), *argv)

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
