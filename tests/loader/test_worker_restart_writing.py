"""A worker SIGKILLed while it is blocked writing its result (the OOM killer's usual victim when training is slower
than loading) never hangs the loader (fastloader.loader.worker_restart, fastloader.loader.result_pipes).

Each sample carries more bytes than a pipe holds, so a worker whose result the loader does not read yet blocks in
its write. The training loop takes one batch and stops; the test waits until a worker is blocked in a pipe write
(its kernel wait channel says so), SIGKILLs it (or SIGSTOPs it) and lets the loop go on. Each scenario runs in a
child process, so that a hang is bounded by the child's guard and fails with the child's output.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from fastloader import DataLoaderX
from fastloader.datasets.error_policy import ErrorPolicy
from tests.helpers import blocked_writing, pid_alive, run_python, wait_until

N, BATCH = 32, 2
PAYLOAD = 256 * 1024  # more than a pipe's 64 KiB: a result nobody reads keeps its worker blocked in the write
_BLOCKED_S = 120.0  # guard: how long the scenario waits for a worker to block in its write


class Heavy(Dataset[tuple[int, bytes]]):
    """Sample i is ``(i, PAYLOAD bytes)``; each worker leaves a file named by its pid. Error policy ``mode``."""

    def __init__(self, pids: Path, quarantine: Path, mode: str) -> None:
        self.pids = pids
        self.error_policy = ErrorPolicy(mode, N, quarantine=quarantine)

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> tuple[int, bytes]:
        if torch.utils.data.get_worker_info() is not None:
            (self.pids / str(os.getpid())).touch()
        return index, bytes(PAYLOAD)


def _writer(pids: Path) -> int:
    """The pid of a worker blocked writing its result (waits for one)."""
    found: list[int] = []

    def one_blocked() -> bool:
        found[:] = [int(entry.name) for entry in pids.iterdir() if blocked_writing(int(entry.name))]
        return bool(found)

    if not wait_until(one_blocked, _BLOCKED_S):
        raise RuntimeError("no worker blocked writing its result")
    return found[0]


def scenario(folder: str, mode: str, how: str, timeout: float) -> None:
    """Run in a child: take one batch, SIGKILL (``how="kill"``) or SIGSTOP (``"stop"``) a worker blocked writing
    its result, then take the rest. Prints ``{"batches": [...]}`` or ``{"error": ...}`` as JSON."""
    pids = Path(folder) / "pids"
    pids.mkdir()
    dataset = Heavy(pids, Path(folder) / "quarantine.tsv", mode)
    loader = DataLoaderX(dataset, batch_size=BATCH, num_workers=2, timeout=timeout, stall_warning=None)
    iterator = iter(loader)
    got = [next(iterator)[0].tolist()]  # the loop stops here: the workers' next results stay unread
    victim = _writer(pids)
    out: dict[str, object] = {}
    try:  # under "raise" torch's error comes as soon as the worker dies (its SIGCHLD handler, in this thread)
        if how == "kill":
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: not pid_alive(victim), _BLOCKED_S)
        else:
            os.kill(victim, signal.SIGSTOP)
        got.extend(batch[0].tolist() for batch in iterator)
        out["batches"] = got
    except RuntimeError as error:
        out["error"] = str(error)
    finally:
        if how == "stop":
            os.kill(victim, signal.SIGKILL)  # a stopped process would hold the child's exit (workers are joined)
    print(json.dumps(out), flush=True)


def _run(tmp_path: Path, mode: str, how: str = "kill", timeout: float = 0) -> dict[str, object]:
    args = (str(tmp_path), mode, how, timeout)
    code = f"from tests.loader.test_worker_restart_writing import scenario; scenario(*{args!r})"
    started = time.monotonic()
    child = run_python(code)
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the child wrote no result (exit {child.returncode}):\n{child.stderr[-4000:]}"
    result: dict[str, object] = json.loads(lines[-1])
    result["stderr"], result["seconds"] = child.stderr, time.monotonic() - started
    return result


@pytest.mark.parametrize("mode", ["skip", "replace"])
@pytest.mark.parametrize("timeout", [0, 20])
def test_a_worker_killed_while_writing_its_result_is_restarted_and_its_batch_made_again(
    tmp_path: Path, mode: str, timeout: float
) -> None:
    """Nothing was lost (the killed worker's result never arrived whole): every sample comes once, in order.
    With ``timeout=`` set too: the partial message the dead worker left never blocks the wait."""
    result = _run(tmp_path, mode, timeout=timeout)
    assert result.get("batches") == [[i, i + 1] for i in range(0, N, BATCH)], result
    assert "restarting it" in str(result["stderr"])


def test_under_raise_a_worker_killed_while_writing_ends_the_run_with_torchs_error(tmp_path: Path) -> None:
    result = _run(tmp_path, "raise")
    assert "is killed by signal: Killed" in str(result.get("error")), result


@pytest.mark.parametrize("mode", ["skip", "replace"])
def test_a_worker_stopped_in_the_middle_of_its_result_lets_the_timeout_fire(tmp_path: Path, mode: str) -> None:
    """A worker that wrote part of a message and writes no more (stopped): ``timeout=`` raises torch's error,
    the partial message is never waited for."""
    result = _run(tmp_path, mode, how="stop", timeout=3)
    assert "timed out after 3 seconds" in str(result.get("error")), result
