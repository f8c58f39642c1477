"""What the Lightning runs share: a module that records the samples its training steps see, and a quiet
Trainer on the CPU (imported by the scripts only: the pytest process never imports Lightning)."""

from __future__ import annotations

from typing import Any

import lightning
import torch


class Crash(Exception):
    pass


class Recorder(lightning.LightningModule):
    """Records each training batch's sample indices, in order (``batches``) and per epoch (``seen``);
    raises :class:`Crash` at step ``crash_at`` (a job killed mid-epoch)."""

    def __init__(self, crash_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.batches: list[list[int]] = []
        self.seen: dict[str, list[int]] = {}
        self.crash_at = crash_at

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if len(self.batches) == self.crash_at:
            raise Crash(f"simulated crash at step {self.crash_at}")
        x, indices = batch
        self.batches.append(indices.tolist())
        self.seen.setdefault(str(self.current_epoch), []).extend(indices.tolist())
        return self.layer(x).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(**kwargs: Any) -> lightning.Trainer:
    """A CPU Trainer, one device, 2 epochs, nothing but training (``kwargs`` override)."""
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 2,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    return lightning.Trainer(**{**options, **kwargs})
