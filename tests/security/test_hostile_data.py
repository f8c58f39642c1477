"""Data from strangers: every attack a dataset, index or endpoint we did not make can mount, built for real,
each test asserting the safe outcome. What fastloader promises, and what not yet, is docs/security.md; this
is the list of what is checked, and where (all under tests/security/):

- A link shipped where a derived file goes (``train.bad.tsv -> ../victim/.bashrc``): ``fastloader scan``'s
  default report goes to the user's cache, never beside the data, and a link at that place is refused, its
  target untouched. Here.
- A planted folder index (``train.fastloader-index``) naming ``..`` or absolute keys, or watching nothing:
  rebuilt from the folder, never packed from elsewhere; a link at the index's place replaced, never written
  through. test_planted_folder_index.py.
- Symbolic links and ``../`` or absolute entries leading out of the root (a folder, a file list, a Parquet
  column of paths): refused, named, under ``confine=True``, ``pack --confine`` and ``scan --confine``; read
  and counted without it. test_confine.py.
- A poisoned tar ``.fl-idx`` (labels flipped, offsets swapped, its shard and manifest untouched): ``verify``
  names the sample, a reader rebuilds the index from the shard. test_poisoned_tar_index.py.
- A tampered LMDB record with its CRC32C recomputed: plain ``verify`` passes, ``verify --expect-digest``
  names the record. A TFRecord sidecar index with offsets swapped, dropped or repeated: rebuilt. A RecordIO
  ``.idx`` with two offsets swapped: ``verify`` names the key, a reader refuses. test_tampered_records.py.
- Sizes that lie: a Parquet dictionary that decodes to more than ``max_decode_bytes`` (refused before
  decoding), length fields of RecordIO, TFRecord and tar (pax) headers past the file (a clean error), JSON
  nested 100,000 deep and a ``.npy`` claiming 10**13 values (named, no crash); tar members ``..``,
  absolute, symbolic or hard links, devices (refused, named). test_hostile_headers.py.
- Names that attack the terminal or a page: escape sequences in a tar member's name (printed escaped),
  bad-sample lists (written escaped, read back whole), the doctor's HTML (every string escaped).
  test_hostile_names.py.
- An S3 endpoint on 127.0.0.1 (tests/remote/fake_s3.py) that sends an object longer than listed or
  announced (refused past one byte), trickles a byte at a time (cut at the request's deadline, retried,
  then a RemoteError), or lists forever (bounded). test_hostile_s3.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fastloader.cli import main
from fastloader.storage import default_report_path
from tests.images import write_image_folder

HOSTILE_NAME = "$(touch${IFS}PWNED).jpg"  # a file name of the dataset's choosing, written into the report


def _shipped_dataset(tmp_path: Path) -> tuple[Path, Path]:
    """A dataset a stranger shipped: a folder and a file list of it, one image named to run a command, and
    a link beside each source waiting for the default report, pointing at the user's ``.bashrc``."""
    dataset = tmp_path / "dataset"
    write_image_folder(dataset / "train", count=4, classes=1)
    (dataset / "train" / "class_0" / HOSTILE_NAME).write_bytes(b"not an image")
    names = sorted(path.name for path in (dataset / "train" / "class_0").iterdir())
    (dataset / "train.txt").write_text("".join(f"train/class_0/{name} 0\n" for name in names))
    bashrc = tmp_path / "victim" / ".bashrc"
    bashrc.parent.mkdir()
    bashrc.write_text("export PATH=$HOME/bin:$PATH\n")
    for source in ("train", "train.txt"):
        (dataset / f"{source}.bad.tsv").symlink_to(Path("..") / "victim" / ".bashrc")
    return dataset, bashrc


@pytest.mark.parametrize("source", ["train", "train.txt"])
def test_the_default_report_goes_to_the_cache_and_the_planted_link_is_untouched(
    tmp_path: Path, source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset, bashrc = _shipped_dataset(tmp_path)
    assert main(["scan", str(dataset / source), "--workers", "0", "--no-progress"]) == 0
    assert bashrc.read_text() == "export PATH=$HOME/bin:$PATH\n"
    assert (dataset / f"{source}.bad.tsv").is_symlink()
    report = default_report_path(dataset / source, ".bad.tsv")
    assert report.is_relative_to(tmp_path / "fastloader-cache")  # the test's own $FASTLOADER_CACHE
    assert HOSTILE_NAME in report.read_text()
    assert f"listed in {report}" in capsys.readouterr().out  # the user is told where it went


def test_a_link_at_the_default_location_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset, bashrc = _shipped_dataset(tmp_path)
    report = default_report_path(dataset / "train", ".bad.tsv")
    report.parent.mkdir(parents=True)
    report.symlink_to(bashrc)
    assert main(["scan", str(dataset / "train"), "--workers", "0", "--no-progress"]) != 0
    assert "a symbolic link where fastloader writes a report by default: not followed" in capsys.readouterr().err
    assert bashrc.read_text() == "export PATH=$HOME/bin:$PATH\n" and report.is_symlink()
