#!/usr/bin/env python3
"""Fetch the pinned upstream BullMQ Lua scripts (what `make setup` runs); see bullmq_compat/_wire/fetch.py."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # works before `pip install -e .`

from bullmq_compat._wire.fetch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
