"""Run one of interop/*.js (other than cli.js) for a test: ``await run_script("dedup.js", {...})``.

The request is passed as the first argument, or on standard input (``stdin=True``) when it is
too long for a command line; the script's last stdout line is its JSON result.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from tests.node import INTEROP, ROOT, NodeError, _error_from, _last_json_line, _node_binary


async def run_script(script: str, request: Any, *, stdin: bool = False, timeout: float = 60.0) -> Any:
    binary = _node_binary()
    payload = json.dumps(request)
    argv = [binary, str(INTEROP / script)] + ([] if stdin else [payload])
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=str(ROOT), stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(payload.encode() if stdin else None), timeout)
    except BaseException as exc:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        if isinstance(exc, asyncio.TimeoutError):
            raise NodeError(f"{script} did not finish within {timeout:.0f}s") from None
        raise
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    if proc.returncode != 0:
        raise _error_from(stdout, stderr, proc.returncode)
    result = _last_json_line(stdout, stderr)
    if isinstance(result, dict) and "error" in result:
        raise NodeError(str(result["error"]), result.get("name"), stderr)
    return result
