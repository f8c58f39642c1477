"""Where batches go: resolve_device on this machine (CUDA cases run in tests/gpu)."""

from __future__ import annotations

import pytest
import torch

from fastloader.loader.device import resolve_device

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour; see tests/gpu")


def test_default_is_cpu_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device(None, None) == torch.device("cpu")
    assert resolve_device(2, None) == torch.device("cpu")  # a DDP script still runs on a laptop


def test_explicit_cuda_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device(None, "cuda:0")


@pytest.mark.parametrize("bad", [-1, 1.0, "0", True])
def test_local_rank_must_be_a_non_negative_int(bad: object) -> None:
    with pytest.raises(ValueError, match="local_rank"):
        resolve_device(bad, None)  # type: ignore[arg-type]


def test_bad_local_rank_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "zero")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        resolve_device(None, None)


def test_explicit_cpu_device() -> None:
    assert resolve_device(0, "cpu") == torch.device("cpu")
