"""MosaicML streaming's StreamingDataset in DataLoaderX and in its own StreamingDataLoader, side by side.

Run by tests/integrations/test_mosaic_streaming.py in the second environment that scripts/setup_streaming_env.sh
makes (MosaicML streaming pins numpy < 2.2). Usage: ``mosaic_streaming_run.py FOLDER WORKERS OUT.json``;
writes, for each loader, two uninterrupted epochs, and a run interrupted after INTO_EPOCH batches of epoch 0
(the samples seen, the state as a checkpoint keeps it, the rest) resumed in a fresh loader (two epochs).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory

from fastloader import DataLoaderX

SAMPLES = 50
BATCH = 4
INTO_EPOCH = 5


def write(folder: Path) -> None:
    with MDSWriter(out=str(folder), columns={"index": "int", "pixels": "ndarray:uint8"}, size_limit=200) as out:
        for index in range(SAMPLES):
            out.write({"index": index, "pixels": np.full((3, 4, 4), index % 251, dtype=np.uint8)})


def keys(loader: Any) -> list[int]:
    got = []
    for batch in loader:
        if not bool((batch["pixels"][:, 0, 0, 0] == batch["index"] % 251).all()):
            raise AssertionError("a sample's pixels are not its own")
        got.extend(int(key) for key in batch["index"])
    return got


def fresh(kind: Any, folder: Path, workers: int) -> Any:
    gc.collect()  # the previous dataset of this folder lets go of its shared memory
    clean_stale_shared_memory()
    dataset = StreamingDataset(local=str(folder), shuffle=True, shuffle_seed=7, batch_size=BATCH)
    return kind(dataset, batch_size=BATCH, num_workers=workers)


def run(kind: Any, folder: Path, workers: int) -> dict[str, Any]:
    loader = fresh(kind, folder, workers)
    epochs = [keys(loader), keys(loader)]
    del loader
    loader = fresh(kind, folder, workers)
    iterator = iter(loader)
    seen: list[int] = []
    for _ in range(INTO_EPOCH):
        seen.extend(int(key) for key in next(iterator)["index"])
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [int(key) for batch in iterator for key in batch["index"]]
    del iterator, loader
    loader = fresh(kind, folder, workers)
    loader.load_state_dict(state)
    resumed = [keys(loader), keys(loader)]
    del loader
    return {"epochs": epochs, "seen": seen, "rest": rest, "resumed": resumed, "state": state}


def main() -> None:
    folder, workers, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    if not (folder / "index.json").exists():
        write(folder)
    results = {"streaming": run(StreamingDataLoader, folder, workers), "fastloader": run(DataLoaderX, folder, workers)}
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
