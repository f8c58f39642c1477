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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers import preload_worker_modules  # noqa: E402
from tests.integrations.common import make_loader  # noqa: E402
from tests.integrations.lightning_common import Recorder, trainer  # noqa: E402

# (name, use_distributed_sampler, split, kinds)
CONFIGS = [
    ("lightning_sampler", True, None, ("torch", "fastloader")),  # Lightning inserts its DistributedSampler
    ("lightning_sampler_local_rank", True, "local_rank", ("torch", "fastloader")),  # DataLoaderX splits itself
    ("user_sampler", False, "sampler", ("torch", "fastloader")),  # torch's DistributedSampler passed by the user
    ("user_local_rank", False, "local_rank", ("torch", "fastloader")),
]


def main() -> None:
    preload_worker_modules()
    outdir = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    for name, use_distributed_sampler, split, kinds in CONFIGS:
        for kind in kinds:
            fit = trainer(strategy="ddp", devices=2, use_distributed_sampler=use_distributed_sampler)
            model = Recorder()
            fit.fit(model, train_dataloaders=make_loader(kind, split))
            (outdir / f"{name}_{kind}_rank{rank}.json").write_text(json.dumps(model.seen))


if __name__ == "__main__":
    main()
