from __future__ import annotations

import uuid
from typing import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from tests._redis_server import redis_for_tests


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis for the whole session: REDIS_URL, a testcontainers Redis, or our own redis-server."""
    with redis_for_tests() as url:
        yield url


@pytest.fixture
def queue_name() -> str:
    """A queue name no other test uses, so tests never need to flush Redis."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain redis-py client, for asserting on what is stored."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()
