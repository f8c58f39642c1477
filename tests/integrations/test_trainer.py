"""Hugging Face Trainer's ``resume_from_checkpoint`` with DataLoaderX, in 2 real processes (gloo on CPU),
torch's DataLoader as the control in the same run (tests/integrations/trainer_resume.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
from tests.integrations.test_integrations import HERE, torchrun  # noqa: E402
from tests.integrations.trainer_resume import EPOCHS, INTO_EPOCH, PER_EPOCH  # noqa: E402


@pytest.mark.timeout(300)
def test_trainer_resumes_mid_epoch_on_the_uninterrupted_samples(tmp_path: Path) -> None:
    torchrun(str(HERE / "trainer_resume.py"), tmp_path)
    records = {
        kind: [json.loads((tmp_path / f"{kind}_rank{r}.json").read_text()) for r in range(2)]
        for kind in ("torch", "fastloader", "unmixed")
    }
    for kind in ("torch", "fastloader"):
        for rank, record in enumerate(records[kind]):
            full, resumed, at = record["full"], record["resumed"], record["at"]
            assert record["error"] == "" and len(full) == EPOCHS * PER_EPOCH and at == PER_EPOCH + INTO_EPOCH
            # the rest of epoch 1 and epoch 2, batch by batch: nothing lost, nothing twice, in the same order
            assert resumed == full[at:], (kind, rank)
            # accelerate's end of the data at each epoch's last batch only (gradient sync, gather's padding drop)
            last = [len(full[at : PER_EPOCH * 2]) - 1, len(resumed) - 1]
            assert [i for i, end in enumerate(record["ends"]) if end] == last, (kind, rank)
    # the same shuffle: DataLoaderX reads accelerate's batches of torch's loader
    assert [r["full"] for r in records["fastloader"]] == [r["full"] for r in records["torch"]]
    for record in records["unmixed"]:  # the Trainer's own skip_first_batches: refused, never trained on
        assert record["resumed"] == [] and "ExactResumeMixin" in record["error"]
