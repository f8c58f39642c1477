"""Byte-level readers and writers of the packed formats (LMDB records, RecordIO, TFRecord, tar shards)."""
