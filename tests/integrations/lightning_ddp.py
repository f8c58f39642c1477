"""Lightning DDP (2 ranks, CPU) with DataLoaderX and torch's DataLoader; run by test_integrations.py:

    python -m torch.distributed.run --nproc_per_node 2 tests/integrations/lightning_ddp.py OUTDIR

Under torchrun Lightning takes the processes as they are (no launcher of its own). Every configuration
fits 2 epochs; each rank writes the sample indices its training_step saw, per epoch, to
OUTDIR/<config>_<kind>_rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import lightning
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.integrations.common import make_loader  # noqa: E402

# (name, use_distributed_sampler, split, kinds)
CONFIGS = [
    ("lightning_sampler", True, None, ("torch", "fastloader")),  # Lightning inserts its DistributedSampler
    ("lightning_sampler_local_rank", True, "local_rank", ("torch", "fastloader")),  # DataLoaderX splits itself
    ("user_sampler", False, "sampler", ("torch", "fastloader")),  # torch's DistributedSampler passed by the user
    ("user_local_rank", False, "local_rank", ("torch", "fastloader")),
]


class Recorder(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict[str, list[int]] = {}

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, indices = batch
        self.seen.setdefault(str(self.current_epoch), []).extend(indices.tolist())
        return self.layer(x).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    outdir = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    for name, use_distributed_sampler, split, kinds in CONFIGS:
        for kind in kinds:
            trainer = lightning.Trainer(
                accelerator="cpu",
                strategy="ddp",
                devices=2,
                max_epochs=2,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                use_distributed_sampler=use_distributed_sampler,
            )
            model = Recorder()
            trainer.fit(model, train_dataloaders=make_loader(kind, split))
            (outdir / f"{name}_{kind}_rank{rank}.json").write_text(json.dumps(model.seen))


if __name__ == "__main__":
    main()
