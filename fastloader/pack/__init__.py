"""The offline tools: ``fastloader pack`` (any source to LMDB, tar shards or Parquet), ``scan`` and ``verify``.

    source (folder, list, LMDB, RecordIO, TFRecord, tar, Parquet) ─► reader processes (readers.py: read,
    check, re-encode) ─► one writer: the pack engine (engine.py) ─► a sink (sink.py: the contract;
    lmdb_sink.py, tar_sink.py, parquet_sink.py) that owns durability and resume; metadata written last

``--engine ray`` (``ray_engine.py``, the driver; ``ray_shard.py``, one Ray Data task per shard, running
the readers' and sinks' own code; ``ray_job.py``, its record of finished shards and the commit) spreads
the same work over a Ray cluster.

``scan.py`` decodes every item of a source and lists the bad ones; ``verify.py`` checks a finished
pack. Byte layouts live in ``fastloader.formats``; none of this runs during training.
"""

from fastloader.pack.engine import pack
from fastloader.pack.scan import scan
from fastloader.pack.summary import PackSummary
from fastloader.pack.verify import verify

__all__ = ["PackSummary", "pack", "scan", "verify"]
