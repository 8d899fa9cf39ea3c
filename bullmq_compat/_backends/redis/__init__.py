"""The Redis backend: upstream's Lua scripts, the key layout, the fast channel and redis-py."""
