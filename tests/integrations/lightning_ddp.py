"""Lightning DDP (2 ranks, CPU) with DataLoaderX and torch's DataLoader; run by test_integrations.py:

    python -m torch.distributed.run --nproc_per_node 2 tests/integrations/lightning_ddp.py OUTDIR CONFIG

Under torchrun Lightning takes the processes as they are (no launcher of its own). The configuration CONFIG
(one of ``common.LIGHTNING_DDP_CONFIGS``: a launch each, so that each fits a loaded machine's time limit) fits
2 epochs with each kind of loader; each rank writes the sample indices its training_step saw, per epoch, to
OUTDIR/<config>_<kind>_rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import torch.distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers import preload_worker_modules  # noqa: E402
from tests.integrations.common import LIGHTNING_DDP_CONFIGS, make_loader  # noqa: E402
from tests.integrations.lightning_common import Recorder, trainer  # noqa: E402


def main() -> None:
    preload_worker_modules()
    outdir, name = Path(sys.argv[1]), sys.argv[2]
    rank = int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    use_distributed_sampler, split = LIGHTNING_DDP_CONFIGS[name]
    if split is not None:
        # torch's DistributedSampler, made before fit() as a user makes it, asks the process group for the world:
        # start it as Lightning's DDP would (gloo on the CPU); Lightning takes a group already started as it is
        torch.distributed.init_process_group("gloo")
    for kind in ("torch", "fastloader"):
        fit = trainer(strategy="ddp", devices=2, use_distributed_sampler=use_distributed_sampler)
        model = Recorder()
        fit.fit(model, train_dataloaders=make_loader(kind, split))
        (outdir / f"{name}_{kind}_rank{rank}.json").write_text(json.dumps(model.seen))


if __name__ == "__main__":
    main()
