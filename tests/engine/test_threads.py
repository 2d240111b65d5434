"""privdl.engine.threads.one_thread: one intra-op thread inside, the caller's count after."""

from __future__ import annotations

import pytest
import torch

from privdl.engine.threads import one_thread


def test_one_thread_inside_and_the_callers_count_restored_even_on_error() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="boom"), one_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
