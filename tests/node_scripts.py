"""Run one of interop/*.js (other than cli.js) for a test: ``await run_script("dedup.js", {...})``.

The request is passed as the first argument, or on standard input (``stdin=True``) when it is
too long for a command line; the script's last stdout line is its JSON result.
"""
from __future__ import annotations

import json
from typing import Any

from tests.node import INTEROP, NodeError, run_node


async def run_script(script: str, request: Any, *, stdin: bool = False, timeout: float = 60.0) -> Any:
    payload = json.dumps(request)
    argv = [str(INTEROP / script)] + ([] if stdin else [payload])
    result = await run_node(argv, label=script, budget=timeout, stdin=payload.encode() if stdin else None)
    if isinstance(result, dict) and "error" in result:
        raise NodeError(str(result["error"]), result.get("name"), "")
    return result
