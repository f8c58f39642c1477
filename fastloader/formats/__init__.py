"""Byte layouts, apart from the code that runs them: what is on disk and how to read and write it.

LMDB records (``lmdb_records``), MXNet RecordIO (``recordio``), TFRecord and ``tf.train.Example``
(``tfrecord``, ``protobuf``), tar shards and the tar pack's manifest (``tar_shards``, ``tar_manifest``),
the memory-mapped index file every dataset's index uses (``index_file``), shard patterns
(``patterns``) and the bad-sample list shared by pack, scan and the error policy (``bad_samples``).
Datasets read these in the workers; the pack tool writes them offline.
"""
