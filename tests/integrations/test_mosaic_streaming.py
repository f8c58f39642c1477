"""MosaicML streaming's StreamingDataset in DataLoaderX, its own StreamingDataLoader as the control in the same
run (tests/integrations/mosaic_streaming_run.py, in the second environment scripts/setup_streaming_env.sh
makes: streaming pins numpy < 2.2): each sample once per epoch over 2 epochs, the same order, and a mid-epoch
state_dict() / load_state_dict() that resumes as streaming's loader resumes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import run_child

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-streaming" / "bin" / "python"
SAMPLES, BATCH, INTO_EPOCH = 50, 4, 5


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: make test makes it (scripts/setup_streaming_env.sh)")
    return tmp_path_factory.mktemp("mds") / "data"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_streaming_dataset_in_dataloaderx_as_in_its_own_loader(folder: Path, workers: int, tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    run_child(
        [str(PYTHON), str(ROOT / "tests/integrations/mosaic_streaming_run.py"), str(folder), str(workers), str(out)],
        env=env,
    )
    results = json.loads(out.read_text())
    own, ours = results["streaming"], results["fastloader"]
    everything = list(range(SAMPLES))
    assert all(sorted(epoch) == everything for epoch in ours["epochs"])
    assert ours["epochs"] == own["epochs"]
    assert len(ours["seen"]) == INTO_EPOCH * BATCH and sorted(ours["seen"] + ours["rest"]) == everything
    assert ours["state"]["dataset"] == own["state"]  # streaming's own state, as its loader takes it
    assert ours["state"]["dataset"]["sample_in_epoch"] == INTO_EPOCH * BATCH
    assert ours["resumed"][0] == ours["rest"]  # the rest of the interrupted epoch, in its order
    assert sorted(ours["resumed"][1]) == everything
    assert ours["resumed"] == own["resumed"]
