"""Lightning restoring a mid-epoch checkpoint, with DataLoaderX and torch's DataLoader; run by
test_integrations.py in two processes, as a restarted job would be:

    python tests/integrations/lightning_resume.py OUTDIR first   # an uninterrupted run, then a run that
                                  # checkpoints every K steps (ModelCheckpoint) and crashes 2 steps later
    python tests/integrations/lightning_resume.py OUTDIR rest    # a new process: fit(ckpt_path=...)

Every variant (loader kind x seeding x K) writes the batches (lists of sample indices) of each run to
OUTDIR/<variant>.json: {"full": [...], "first": [...], "rest": [...]}.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers import preload_worker_modules  # noqa: E402
from tests.integrations.common import make_loader  # noqa: E402
from tests.integrations.lightning_common import Crash, Recorder, trainer  # noqa: E402

KS = (5, 17)  # mid first epoch; mid second epoch (13 batches an epoch)
# torch's loader is the control (it restarts the epoch in a new order): one seeding shows it, both seedings
# are what DataLoaderX must resume.
VARIANTS = [("torch", "global", k) for k in KS] + [("fastloader", s, k) for s in ("global", "generator") for k in KS]


def loader(kind: str, seeding: str) -> Any:
    torch.manual_seed(0)  # the same script start every time
    extra = {"generator": torch.Generator().manual_seed(3)} if seeding == "generator" else {}
    return make_loader(kind, **extra)


def main() -> None:
    preload_worker_modules()
    outdir, mode = Path(sys.argv[1]), sys.argv[2]
    warnings.filterwarnings("ignore")
    for kind, seeding, k in VARIANTS:
        name = f"{kind}_{seeding}_k{k}"
        record_path, ckpt = outdir / f"{name}.json", outdir / f"{name}.ckpt"
        record = json.loads(record_path.read_text()) if record_path.exists() else {}
        model = Recorder()
        if mode == "first":
            trainer().fit(model, train_dataloaders=loader(kind, seeding))
            record["full"], model = model.batches, Recorder(crash_at=k + 2)
            checkpoint = ModelCheckpoint(
                dirpath=outdir, filename=name, every_n_train_steps=k, save_top_k=1, save_on_train_epoch_end=False
            )
            try:
                trainer(callbacks=[checkpoint], enable_checkpointing=True).fit(
                    model, train_dataloaders=loader(kind, seeding)
                )
            except Crash:
                pass
            record["first"] = model.batches[:k]  # what the checkpoint holds; the 2 steps after it are lost
        else:
            torch.manual_seed(1)  # another process state: only the checkpoint may decide the order
            trainer().fit(model, train_dataloaders=loader(kind, seeding), ckpt_path=ckpt)
            record["rest"] = model.batches
        record_path.write_text(json.dumps(record))


if __name__ == "__main__":
    main()
