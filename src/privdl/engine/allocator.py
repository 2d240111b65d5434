"""glibc ``malloc`` tuning for training loops: :mod:`privdl.malloc` (kept there so the ``privdl``
command can apply it without importing torch, which :mod:`privdl.engine` does)."""

from privdl.malloc import MMAP_THRESHOLD, TRIM_THRESHOLD, tune_allocator

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator"]
