"""Object storage (S3-compatible): where a dataset lives when it is not on a local disk.

* ``url.py``: ``s3://bucket/prefix`` addresses;
* ``retry.py``: which failures are retried (throttling, timeouts, reset connections, truncated bodies),
  with exponential backoff and full jitter, and the error that names the object when the budget is spent;
* ``s3.py``: the client (boto3, made after fork in each process): ranged and whole-object reads with
  their length checked and pinned to one version (ETag), streaming downloads resumed where cut, listing,
  uploads (multipart when large);
* ``patterns.py``: brace patterns, globs and lists of ``s3://`` URLs, resolved against listings;
* ``shard_cache.py``: whole shards on local disk under a size limit, shared by every process of the machine.
"""

from fastloader.remote.retry import RetryPolicy
from fastloader.remote.s3 import ObjectInfo, S3Store
from fastloader.remote.shard_cache import ShardCache
from fastloader.remote.url import S3Url

__all__ = ["ObjectInfo", "RetryPolicy", "S3Store", "S3Url", "ShardCache"]
