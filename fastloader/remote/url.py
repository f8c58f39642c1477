"""``s3://bucket/key/prefix`` addresses."""

from __future__ import annotations

import os
from dataclasses import dataclass

SCHEME = "s3://"


def is_remote(path: str | os.PathLike[str]) -> bool:
    """True for an ``s3://`` address."""
    return isinstance(path, str) and path.startswith(SCHEME)


@dataclass(frozen=True)
class S3Url:
    """A bucket and a key (or key prefix, without a trailing slash) in it."""

    bucket: str
    key: str

    @classmethod
    def parse(cls, url: str) -> S3Url:
        if not is_remote(url):
            raise ValueError(f"{url}: not an s3://bucket/prefix address")
        bucket, _, key = url[len(SCHEME) :].partition("/")
        if not bucket or "/" in bucket:
            raise ValueError(f"{url}: no bucket name (expected s3://bucket/prefix)")
        return cls(bucket, key.strip("/"))

    def child(self, name: str) -> S3Url:
        """The object ``name`` under this prefix."""
        return S3Url(self.bucket, f"{self.key}/{name}" if self.key else name)

    def parent(self) -> S3Url:
        """The prefix this key is directly under (the bucket itself for a top-level key)."""
        return S3Url(self.bucket, self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"
