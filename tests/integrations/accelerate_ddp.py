"""accelerate (2 processes, CPU) with DataLoaderX and torch's DataLoader; run by test_integrations.py:

    python -m torch.distributed.run --nproc_per_node 2 tests/integrations/accelerate_ddp.py OUTDIR

``accelerator.prepare(loader)`` for the default configuration and ``split_batches=True``; 2 epochs
each; each rank writes the sample indices it received, per epoch, to OUTDIR/<config>_<kind>_rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

from accelerate import Accelerator, DataLoaderConfiguration

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.integrations.common import make_loader  # noqa: E402


def main() -> None:
    outdir = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    for name, split_batches in (("accelerate", False), ("accelerate_split_batches", True)):
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=split_batches))
        for kind in ("torch", "fastloader"):
            prepared = accelerator.prepare(make_loader(kind))
            seen: dict[str, list[int]] = {}
            for epoch in range(2):
                prepared.set_epoch(epoch)  # as accelerate's examples do
                for _x, indices in prepared:
                    seen.setdefault(str(epoch), []).extend(indices.tolist())
            (outdir / f"{name}_{kind}_rank{rank}.json").write_text(json.dumps(seen))
        accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
