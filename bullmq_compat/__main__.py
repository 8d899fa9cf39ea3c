"""The `bullmq-compat` command line (also `python -m bullmq_compat`)."""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Optional, Sequence

from bullmq_compat._errors import BullMQCompatError

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


async def _keeper(args: argparse.Namespace) -> int:
    from bullmq_compat._groups import GroupKeeper

    keepers = [GroupKeeper(q, args.redis, prefix=args.prefix, sweep_interval=args.sweep_interval)
               for q in args.queue]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [keeper.start() for keeper in keepers]
    print(f"keeper running for {', '.join(args.queue)} on {args.redis}", flush=True)
    await stop.wait()
    for keeper in keepers:
        await keeper.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    return 0


def _lua(args: argparse.Namespace) -> int:
    """Print one of our built Lua scripts (for Node producers of group jobs, see interop/groups.js)."""
    from bullmq_compat._wire.lua import OWN_LUA_DIR, own_script

    matches = sorted(OWN_LUA_DIR.glob(f"{args.name}-*.lua")) or sorted(OWN_LUA_DIR.glob(args.name))
    if not matches:
        names = ", ".join(p.stem.rsplit("-", 1)[0] for p in sorted(OWN_LUA_DIR.glob("*-*.lua")))
        raise BullMQCompatError(f"no script named {args.name!r}; ours are: {names}")
    sys.stdout.write(own_script(matches[0].name).lua)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bullmq-compat", description="Node BullMQ-compatible queues from Python")
    sub = parser.add_subparsers(dest="command", required=True)
    keeper = sub.add_parser("keeper", help="release groups whose jobs were finished by Node workers")
    keeper.add_argument("--queue", action="append", required=True, help="queue name (repeatable)")
    keeper.add_argument("--redis", default=DEFAULT_REDIS, help=f"Redis URL (default {DEFAULT_REDIS})")
    keeper.add_argument("--prefix", default="bull")
    keeper.add_argument("--sweep-interval", type=float, default=5.0, help="seconds between sweeps")
    lua = sub.add_parser("lua", help="print one of our built Lua scripts (e.g. addGroupJob)")
    lua.add_argument("name")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "keeper":
            return asyncio.run(_keeper(args))
        if args.command == "lua":
            return _lua(args)
    except BullMQCompatError as err:
        print(f"bullmq-compat: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
