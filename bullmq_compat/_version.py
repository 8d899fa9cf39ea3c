"""Our version (SemVer). Each release pins one upstream BullMQ: see `bullmq_compat._wire.upstream`."""

__version__ = "0.1.0"
