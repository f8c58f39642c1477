"""Hugging Face Trainer (2 processes, CPU) resuming mid-epoch; run by test_trainer.py:

    python -m torch.distributed.run --nproc_per_node 2 tests/integrations/trainer_resume.py OUTDIR

For each kind, a Trainer trains 3 epochs, saving a checkpoint every step, then a new Trainer resumes
from the checkpoint 3 batches into epoch 1 (``resume_from_checkpoint``), as after a crash:

* "torch": the control, torch's DataLoader through ``accelerator.prepare``;
* "fastloader": a DataLoaderX through ``fastloader.integrations.accelerate.prepare``, the Trainer with
  ``ExactResumeMixin``;
* "unmixed": the same without the mixin (the Trainer's resume calls accelerate's ``skip_first_batches``).

OUTDIR/<kind>_rank<r>.json: the sample indices of each batch the model received in the full run and in
the resumed one, ``end_of_dataloader`` at each resumed batch, the batch the resume started at, and the
error the resume raised ("" if none).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from transformers import Trainer, TrainingArguments  # noqa: E402

from fastloader import DataLoaderX  # noqa: E402
from fastloader.integrations.accelerate import prepare  # noqa: E402
from fastloader.integrations.transformers import ExactResumeMixin  # noqa: E402

LENGTH, BATCH, EPOCHS, INTO_EPOCH = 50, 4, 3, 3
PER_EPOCH = 7  # 25 samples a rank: 7 batches, the last padded by accelerate


class Named(Dataset[dict[str, Any]]):
    """Item i names itself: the model records which samples each batch holds."""

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": torch.tensor([float(index)]), "labels": torch.tensor([0.0]), "index": index}


class Recorder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        self.seen: list[list[int]] = []
        self.ends: list[bool] = []
        self.gradient_state: Any = None

    def forward(self, x: torch.Tensor, labels: torch.Tensor, index: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append(index.tolist())
        self.ends.append(bool(self.gradient_state.end_of_dataloader))
        return {"loss": ((self.linear(x) - labels) ** 2).mean()}


class TorchTrainer(Trainer):
    def get_train_dataloader(self) -> Any:
        loader = DataLoader(self.train_dataset, batch_size=BATCH, shuffle=True)
        return self.accelerator.prepare(loader)


class UnmixedTrainer(Trainer):
    def get_train_dataloader(self) -> Any:
        loader = DataLoaderX(self.train_dataset, batch_size=BATCH, shuffle=True)
        return prepare(self.accelerator, loader)


class FastloaderTrainer(ExactResumeMixin, UnmixedTrainer):
    pass


KINDS = {"torch": TorchTrainer, "fastloader": FastloaderTrainer, "unmixed": UnmixedTrainer}


def train(kind: str, outdir: Path, resume: str | None = None) -> tuple[Recorder, str]:
    """Train (or resume) ``kind``; the one checkpoint saved is the resume's, 3 batches into epoch 1."""
    args = TrainingArguments(
        output_dir=str(outdir),
        use_cpu=True,
        per_device_train_batch_size=BATCH,
        num_train_epochs=EPOCHS,
        save_strategy="steps",
        save_steps=PER_EPOCH + INTO_EPOCH,  # one optimizer step a batch
        report_to=[],
        logging_steps=10_000,
        remove_unused_columns=False,
        seed=0,
        disable_tqdm=True,
    )
    model = Recorder()
    trainer = KINDS[kind](model=model, args=args, train_dataset=Named())
    model.gradient_state = trainer.accelerator.gradient_state
    try:
        trainer.train(resume_from_checkpoint=resume)
    except ValueError as error:
        return model, str(error)
    return model, ""


def main() -> None:
    outdir = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    for kind in KINDS:
        full, _ = train(kind, outdir / kind / "full")
        step = PER_EPOCH + INTO_EPOCH
        resumed, error = train(
            kind, outdir / kind / "resumed", resume=str(outdir / kind / "full" / f"checkpoint-{step}")
        )
        record = {"full": full.seen, "resumed": resumed.seen, "ends": resumed.ends, "at": step, "error": error}
        (outdir / f"{kind}_rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
