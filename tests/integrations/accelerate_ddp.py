"""accelerate (2 processes, CPU) with DataLoaderX and torch's DataLoader; run by test_integrations.py:

    python -m torch.distributed.run --nproc_per_node 2 tests/integrations/accelerate_ddp.py OUTDIR

For the default configuration and ``split_batches=True``, each kind prepared as its users prepare it
(torch's loader: ``accelerator.prepare(loader)``; DataLoaderX: ``fastloader.integrations.accelerate.prepare``),
from the same global seed, so that accelerate draws both the same shuffling generator:

* 2 epochs: each rank writes the sample indices it received per epoch to
  OUTDIR/<config>_<kind>_rank<r>.json, and to OUTDIR/<config>_<kind>_checks_rank<r>.json what
  ``gather_for_metrics`` returned, whether a fastloader prefetch thread was alive at each batch, whether
  every image batch arrived as expected (DataLoaderX: normalized floats; torch: the raw uint8), the
  batches' dtype and device, and DataLoaderX's ``stats()`` counts;
* resume: epoch 0, 3 batches of epoch 1, ``save_state``, the rest of epoch 1 and epoch 2; then a new
  Accelerator and loader (another global seed), ``load_state``, and what the loop receives after it:
  OUTDIR/<config>_<kind>_resume_rank<r>.json, with ``end_of_dataloader`` at each resumed batch and, for
  DataLoaderX, the error that iterating ``accelerator.skip_first_batches(loader, 3)`` raised before.

OUTDIR/refused_rank<r>.json: the error for a DataLoaderX that splits the data itself.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fastloader.integrations.accelerate import prepare  # noqa: E402
from tests.helpers import preload_worker_modules  # noqa: E402
from tests.integrations.common import Images, make_loader  # noqa: E402

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
SAVED_AT = 3  # batches of epoch 1 before save_state


def prepared(accelerator: Accelerator, kind: str, seed: int) -> Any:
    torch.manual_seed(seed)  # accelerate draws the sampler's generator seed from torch's global RNG
    if kind == "torch":
        return accelerator.prepare(make_loader(kind, dataset=Images()))
    return prepare(accelerator, make_loader(kind, dataset=Images(), normalize=(MEAN, STD)))


def as_expected(kind: str, images: torch.Tensor, indices: torch.Tensor) -> bool:
    values = indices.view(-1, 1, 1, 1).expand(-1, 3, 2, 2)
    if kind == "torch":
        return images.dtype == torch.uint8 and torch.equal(images, values.to(torch.uint8))
    expected = (values.float() / 255 - 0.5) / 0.25
    return images.dtype == torch.float32 and torch.allclose(images, expected, atol=1e-6)


def prefetching() -> bool:
    return any(thread.name == "fastloader-dataloaderx" and thread.is_alive() for thread in threading.enumerate())


def two_epochs(accelerator: Accelerator, kind: str) -> tuple[dict[str, list[int]], dict[str, Any]]:
    loader = prepared(accelerator, kind, seed=0)
    seen: dict[str, list[int]] = {}
    checks: dict[str, Any] = {"gathered": {}, "threads": {}, "as_expected": True, "dtypes": [], "devices": []}
    for epoch in range(2):
        loader.set_epoch(epoch)  # as accelerate's examples do
        for images, indices in loader:
            checks["threads"].setdefault(str(epoch), []).append(prefetching())
            checks["as_expected"] &= as_expected(kind, images, indices)
            checks["dtypes"].append(str(images.dtype))
            checks["devices"].append(str(images.device))
            gathered = accelerator.gather_for_metrics(indices)
            checks["gathered"].setdefault(str(epoch), []).extend(gathered.tolist())
            seen.setdefault(str(epoch), []).extend(indices.tolist())
    checks["type"] = type(loader).__name__
    checks["stats"] = {key: loader.stats()[key] for key in ("batches", "images")} if kind == "fastloader" else None
    return seen, checks


def resume(config: DataLoaderConfiguration, kind: str, checkpoint: Path) -> dict[str, Any]:
    record: dict[str, Any] = {"saved_at": SAVED_AT, "full": {}, "rest": [], "after": []}
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    loader = prepared(accelerator, kind, seed=1)
    for epoch in range(3):
        for step, (_images, indices) in enumerate(loader):
            record["full"].setdefault(str(epoch), []).append(indices.tolist())
            if epoch == 1 and step == SAVED_AT - 1:
                accelerator.save_state(str(checkpoint))
    # as after a crash: a new Accelerator and loader, another global seed, then accelerate's load_state
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    loader = prepared(accelerator, kind, seed=2)
    accelerator.load_state(str(checkpoint))
    if kind == "fastloader":  # accelerate's recipe for its own loader is refused on fastloader's
        try:
            next(iter(accelerator.skip_first_batches(loader, SAVED_AT)))
            record["skip_refused"] = ""
        except ValueError as error:
            record["skip_refused"] = str(error)
    for _images, indices in loader:
        record["rest"].append(indices.tolist())
        record.setdefault("ends", []).append(accelerator.gradient_state.end_of_dataloader)
    record["after"] = [indices.tolist() for _images, indices in loader]
    return record


def refused() -> str:
    accelerator = Accelerator(cpu=True)
    try:
        prepare(accelerator, make_loader("fastloader", split="sampler"))
    except ValueError as error:
        return str(error)
    return ""


def main() -> None:
    preload_worker_modules()
    outdir = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    warnings.filterwarnings("ignore")
    for name, split_batches in (("accelerate", False), ("accelerate_split_batches", True)):
        config = DataLoaderConfiguration(split_batches=split_batches)
        accelerator = Accelerator(cpu=True, dataloader_config=config)
        for kind in ("torch", "fastloader"):
            seen, checks = two_epochs(accelerator, kind)
            (outdir / f"{name}_{kind}_rank{rank}.json").write_text(json.dumps(seen))
            (outdir / f"{name}_{kind}_checks_rank{rank}.json").write_text(json.dumps(checks))
            record = resume(config, kind, outdir / f"checkpoint_{name}_{kind}")
            (outdir / f"{name}_{kind}_resume_rank{rank}.json").write_text(json.dumps(record))
        accelerator.wait_for_everyone()
    (outdir / f"refused_rank{rank}.json").write_text(json.dumps(refused()))


if __name__ == "__main__":
    main()
