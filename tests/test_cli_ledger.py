"""``fastloader ledger diff`` / ``show``: the exit status and the line that names the first difference."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data import Dataset

from fastloader import DataLoaderX
from fastloader.cli import main
from tests.helpers import run_python


class Indices(Dataset[int]):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> int:
        return index


def record(path: Path, order: list[int], epochs: int = 2) -> None:
    loader = DataLoaderX(Indices(), batch_size=4, sampler=order, ledger=str(path))
    for _ in range(epochs):
        for _ in loader:
            pass


def test_diff_exits_0_for_the_same_deliveries_and_1_naming_the_first_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    order = list(range(24))
    record(tmp_path / "a", order)
    record(tmp_path / "b", order)
    record(tmp_path / "c", order[:9] + [8] + order[10:])
    assert main(["ledger", "diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out == (
        "same samples, same order in 2 epochs (48 samples; bytes not compared where not digested)\n"
    )
    assert main(["ledger", "diff", str(tmp_path / "a"), str(tmp_path / "c")]) == 1
    assert capsys.readouterr().out == "rank 0, epoch 0, position 9: key 8 delivered twice in B\n"
    assert main(["ledger", "show", str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out == (
        "rank 0, epoch 0: 24 samples (0 with digests)\nrank 0, epoch 1: 24 samples (0 with digests)\n"
    )


def test_a_missing_ledger_is_an_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ledger", "show", str(tmp_path / "nothing")]) == 1
    assert f"{tmp_path / 'nothing'}: no ledger file" in capsys.readouterr().err


def test_the_console_script_diffs_a_torn_ledger_and_says_what_it_ignored(tmp_path: Path) -> None:
    record(tmp_path / "a", list(range(24)), epochs=1)
    record(tmp_path / "b", list(range(24)), epochs=1)
    with open(tmp_path / "b", "ab") as file:
        file.write(b"FLBL\x10")  # a write cut short
    result = run_python(
        "import sys; from fastloader.cli import main; sys.exit(main(sys.argv[1:]))",
        "ledger",
        "diff",
        str(tmp_path / "a"),
        str(tmp_path / "b"),
    )
    assert result.returncode == 0, result.stderr
    assert "the tail a crash cut short" in result.stderr and result.stdout.startswith("same samples, same order")
