"""Byte layouts, apart from the code that runs them: what is on disk and how to read and write it.

LMDB records (``lmdb_records``), MXNet RecordIO (``recordio``), TFRecord and ``tf.train.Example``
(``tfrecord``, ``protobuf``), tar shards and the tar pack's manifest (``tar_shards``, ``tar_manifest``),
the memory-mapped index file every dataset's index uses (``index_file``), shard patterns
(``patterns``), the bad-sample list shared by pack, scan and the error policy (``bad_samples``) and the
seven kinds of field values with their encodings (``field_values``).
Datasets read these in the workers; the pack tool writes them offline.
"""

from fastloader.formats.bad_samples import BadSample
from fastloader.formats.field_values import decode_value, encode_value
from fastloader.formats.recordio import IRHeader

__all__ = ["BadSample", "IRHeader", "decode_value", "encode_value"]
