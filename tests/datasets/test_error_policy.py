"""Bad samples under each policy: raise names the key, skip drops, replace keeps batches exact;
counted across real worker processes, budgeted, and excluded from a `fastloader scan` report."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fastloader import DataLoaderX
from fastloader import transforms as T
from fastloader.datasets import ImageFolder, LMDBDataset, RecordIODataset, TarShardDataset, TFRecordDataset
from fastloader.datasets.error_policy import TooManyBadSamples
from fastloader.pack.scan import scan
from tests.images import image_bytes, write_image_folder

BAD = ["class_0/zz_truncated.jpg", "class_1/zz_empty.jpg", "class_2/zz_text.jpg"]


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    write_image_folder(root, count=33)
    truncated = image_bytes(3)
    (root / "class_0" / "zz_truncated.jpg").write_bytes(truncated[: len(truncated) // 3])
    (root / "class_1" / "zz_empty.jpg").write_bytes(b"")
    (root / "class_2" / "zz_text.jpg").write_text("not an image")
    return root


def dataset(root: Path, fused: bool) -> ImageFolder:
    transform = T.Compose([T.Resize(24), T.CenterCrop(24)]) if fused else None
    return ImageFolder(root, transform=transform, index_path=root.parent / f"index-{fused}")


@pytest.mark.parametrize("fused", [True, False])
def test_raise_names_the_key(folder: Path, fused: bool) -> None:
    ds = dataset(folder, fused)
    ds.set_error_policy("raise", quarantine=folder.parent / "q.tsv")
    bad = next(i for i in range(len(ds)) if ds.source.key(i) == BAD[1])
    with pytest.raises(Exception, match="zz_empty.jpg|empty"):
        ds[bad]
    assert ds.error_stats()["bad_samples"] == 1


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("workers", [0, 2])
def test_replace_keeps_batch_sizes_and_counts_every_bad_sample_once(folder: Path, fused: bool, workers: int) -> None:
    ds = dataset(folder, fused)
    ds.set_error_policy("replace", quarantine=folder.parent / "q.tsv")
    loader = DataLoaderX(ds, batch_size=6, num_workers=workers, collate_fn=None if fused else lambda b: b)
    for _ in range(2):
        sizes = [len(batch[1]) if fused else len(batch) for batch in loader]
        assert sizes == [6] * 6, "replace keeps every batch full"
    stats = loader.stats()
    assert stats["bad_samples"] == 3 and sum(stats["by_reason"].values()) == 3
    assert sorted(line.split("\t")[1] for line in (folder.parent / "q.tsv").read_text().splitlines()) == BAD


def test_skip_drops_bad_samples_from_their_batch(folder: Path) -> None:
    ds = dataset(folder, fused=True)
    ds.set_error_policy("skip", quarantine=folder.parent / "q.tsv")
    images = torch.cat([images for images, _ in DataLoaderX(ds, batch_size=6, num_workers=2)])
    assert images.shape[0] == 33 and images.dtype == torch.uint8


TRAIN = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip()])


@pytest.mark.parametrize("mode", ["raise", "skip", "replace"])
def test_a_batch_of_good_samples_is_the_same_under_any_policy(folder: Path, mode: str) -> None:
    """Decoded at once, as without a policy: the same pixels, the same random draws after it."""
    plain = ImageFolder(folder, transform=TRAIN, index_path=folder.parent / "index")
    policed = ImageFolder(folder, transform=TRAIN, index_path=folder.parent / "index")
    policed.set_error_policy(mode, quarantine=folder.parent / "q.tsv")
    good = [i for i in range(len(plain)) if plain.source.key(i) not in BAD]
    torch.manual_seed(1)
    expected, after = plain.__getitems__(good), torch.rand(1)
    torch.manual_seed(1)
    got = policed.__getitems__(good)
    assert torch.equal(got.images, expected.images) and torch.equal(got.labels, expected.labels)
    assert torch.equal(torch.rand(1), after) and policed.error_stats()["bad_samples"] == 0


def test_a_batch_with_bad_samples_is_what_image_by_image_gives(folder: Path) -> None:
    """A batch that holds bad samples goes image by image from where it started: the substitutes and the random
    crops of each item as one at a time gives them (replace), the good ones alone (skip)."""
    ds, one_by_one = (ImageFolder(folder, transform=TRAIN, index_path=folder.parent / "index") for _ in range(2))
    # Each its own quarantine: both meet the bad samples for the first time (found bad, they are never read again).
    ds.set_error_policy("replace", quarantine=folder.parent / "q.tsv")
    one_by_one.set_error_policy("replace", quarantine=folder.parent / "q1.tsv")
    everything = list(range(len(ds)))
    torch.manual_seed(2)
    batch = ds.__getitems__(everything)
    torch.manual_seed(2)
    items = [one_by_one[i] for i in everything]
    assert torch.equal(batch.images, torch.stack([image for image, _ in items]))
    assert batch.labels.tolist() == [label for _, label in items] and ds.error_stats()["bad_samples"] == 3
    fixed = dataset(folder, fused=True)
    fixed.set_error_policy("skip", quarantine=folder.parent / "q2.tsv")
    good = [i for i in everything if fixed.source.key(i) not in BAD]
    skipped = fixed.__getitems__(everything)
    assert torch.equal(skipped.images, torch.stack([fixed[i][0] for i in good]))
    assert skipped.labels.tolist() == [fixed[i][1] for i in good]


def test_an_excluded_good_sample_in_a_batch_is_never_read(folder: Path) -> None:
    ds = dataset(folder, fused=True)
    ds.set_error_policy("replace", exclude=[4], quarantine=folder.parent / "q.tsv")
    read = ds.source.read
    ds.source.read = lambda index: pytest.fail("read an excluded sample") if index == 4 else read(index)  # type: ignore[method-assign]
    batch = ds.__getitems__([3, 4, 5])
    assert torch.equal(batch.images, torch.stack([ds[3][0], ds[5][0], ds[5][0]]))  # 5 stands in for 4


def test_the_budget_turns_a_flood_into_one_clear_error(folder: Path) -> None:
    ds = dataset(folder, fused=True)
    ds.set_error_policy("replace", max_errors=2, quarantine=folder.parent / "q.tsv")
    with pytest.raises(TooManyBadSamples, match="3 bad samples, more than max_errors allows"):
        for _ in DataLoaderX(ds, batch_size=6):
            pass


def test_a_scan_report_excludes_samples_before_they_are_read(folder: Path) -> None:
    report = scan(folder, workers=0, progress=False)
    ds = dataset(folder, fused=True)
    ds.set_error_policy("raise", exclude=report.report, quarantine=folder.parent / "q.tsv")
    batches = list(DataLoaderX(ds, batch_size=6))
    assert sum(len(labels) for _, labels in batches) == 36
    assert ds.error_stats()["bad_samples"] == 0 and ds.error_stats()["excluded"] == 3


def test_bad_arguments_are_named(folder: Path) -> None:
    ds = dataset(folder, fused=True)
    with pytest.raises(ValueError, match="on_error"):
        ds.set_error_policy("ignore")
    with pytest.raises(ValueError, match="max_errors"):
        ds.set_error_policy("skip", max_errors=-1)


def bad_among_good(count: int = 10, bad: int = 3) -> list[bytes]:
    images = [image_bytes(i) for i in range(count)]
    images[bad] = images[bad][:200]  # truncated
    return images


def write_lmdb(path: Path, images: list[bytes]) -> Path:
    from fastloader.pack.lmdb_sink import LMDBSink

    sink = LMDBSink(path, {"test": "bad among good"})
    for i, data in enumerate(images):
        sink.add(i, f"img{i}.jpg", i, data)
    sink.finish(None, {})
    return path


def write_recordio(path: Path, images: list[bytes]) -> Path:
    from fastloader.formats.recordio import RecordIOWriter, single_label
    from fastloader.formats.recordio import pack as pack_record

    with RecordIOWriter(path, path.with_suffix(".idx")) as writer:
        for i, data in enumerate(images):
            writer.write(i, pack_record(single_label(i, i), data))
    return path


def write_tfrecord(path: Path, images: list[bytes]) -> Path:
    from fastloader.formats.protobuf import bytes_feature, encode_example, int64_feature
    from fastloader.formats.tfrecord import TFRecordWriter

    with TFRecordWriter(path) as writer:
        for i, data in enumerate(images):
            writer.write(encode_example({"image/encoded": bytes_feature(data), "image/class/label": int64_feature(i)}))
    return path


def write_tar(path: Path, images: list[bytes]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for i, data in enumerate(images):
            for name, blob in ((f"s{i:02d}.jpg", data), (f"s{i:02d}.cls", str(i).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    return path


@pytest.mark.parametrize(
    ("kind", "write", "open_dataset"),
    [
        (
            "lmdb",
            write_lmdb,
            lambda p, tf: LMDBDataset(p, transform=tf),
        ),
        (
            "rec",
            write_recordio,
            lambda p, tf: RecordIODataset(p, transform=tf),
        ),
        (
            "tfrecord",
            write_tfrecord,
            lambda p, tf: TFRecordDataset(str(p), transform=tf),
        ),
        (
            "tar",
            write_tar,
            lambda p, tf: TarShardDataset(str(p), transform=tf),
        ),
    ],
)
def test_every_dataset_type_replaces_a_bad_record(
    tmp_path: Path, kind: str, write: object, open_dataset: object
) -> None:
    path = write(tmp_path / f"data.{kind}", bad_among_good())  # type: ignore[operator]
    ds = open_dataset(path, T.Compose([T.Resize(16), T.CenterCrop(16)]))  # type: ignore[operator]
    ds.set_error_policy("replace", quarantine=tmp_path / "q.tsv")
    labels = torch.cat([labels for _, labels in DataLoaderX(ds, batch_size=4, num_workers=2)]).tolist()
    assert len(labels) == 10 and 3 not in labels and labels.count(4) == 2, "record 3 replaced by record 4"
    assert ds.error_stats()["bad_samples"] == 1


def _bytes_read() -> int:
    """Bytes this process has read through read() calls so far (Linux's /proc/self/io ``rchar``)."""
    try:
        with open("/proc/self/io", encoding="ascii") as io_stats:
            return next(int(line.split()[1]) for line in io_stats if line.startswith("rchar:"))
    except (OSError, StopIteration):
        pytest.skip("no /proc/self/io here")


def test_thousands_of_bad_samples_read_the_quarantine_once(tmp_path: Path) -> None:
    """Each bad sample reads only what was appended since the last one: the bytes read stay
    proportional to the file, not to its size times the number of bad samples."""
    from fastloader.datasets.error_policy import ErrorPolicy

    quarantine = tmp_path / "q.tsv"
    policy = ErrorPolicy("replace", 100_000, None, quarantine, ())
    before = _bytes_read()
    for i in range(4000):
        policy.record(i, f"class_{i % 7}/image_{i:06d}.jpg", "undecodable: OSError: broken data stream")
    read = _bytes_read() - before
    size = quarantine.stat().st_size
    assert policy.stats()["bad_samples"] == 4000
    assert read < 3 * size, f"read {read:,} bytes for a {size:,}-byte quarantine: not linear"


def test_counts_meet_across_processes_and_the_budget_trips_at_the_exact_sample(tmp_path: Path) -> None:
    """Another process's 300 bad samples, then this one's: max_errors=500 trips at this process's 201st,
    and a key the other process reported is not counted twice."""
    from fastloader.datasets.error_policy import ErrorPolicy
    from tests.helpers import run_python

    quarantine = tmp_path / "q.tsv"
    policy = ErrorPolicy("replace", 10_000, 500, quarantine, ())
    policy.record(0, "mine/first.jpg", "empty: 0 bytes")  # read from the start by this process, before the other's
    other = run_python(
        "import sys\n"
        "from fastloader.datasets.error_policy import ErrorPolicy\n"
        "policy = ErrorPolicy('replace', 10_000, 500, sys.argv[1], ())\n"
        "for i in range(299):\n"
        "    policy.record(i, f'other/{i}.jpg', 'undecodable: broken')\n"
        "print(policy.stats()['bad_samples'])\n",
        str(quarantine),
    )
    assert other.returncode == 0, other.stderr
    assert other.stdout.split() == ["300"]
    policy.record(1, "other/5.jpg", "undecodable: broken")  # the other's: not a new one
    for i in range(200):
        policy.record(1000 + i, f"mine/{i}.jpg", "undecodable: broken")
    assert policy.stats()["bad_samples"] == 500
    with pytest.raises(TooManyBadSamples, match="501 bad samples, more than max_errors allows"):
        policy.record(5000, "mine/one-too-many.jpg", "undecodable: broken")


def test_a_quarantine_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    import os

    from fastloader.datasets.error_policy import ErrorPolicy

    os.mkfifo(tmp_path / "q.fifo")
    with pytest.raises(ValueError, match="quarantine must be a regular file"):
        ErrorPolicy("replace", 10, None, tmp_path / "q.fifo", ())


def test_a_failure_found_later_goes_through_the_same_policy(tmp_path: Path) -> None:
    """recover(): a sample that failed after it was read (the GPU decoder's case) is recorded once, then
    raised, skipped or replaced by the next good one, as a failure inside the dataset is."""
    from fastloader.datasets.error_policy import ErrorPolicy
    from fastloader.errors import DecodeError

    bad = {3, 4}

    def produce(index: int) -> str:
        if index in bad:
            raise DecodeError(f"#{index}: cannot decode image")
        return f"sample {index}"

    def key(index: int) -> str:
        return f"#{index}"

    error = DecodeError("#3: cannot decode image (on the GPU)")
    for mode, expected in (("skip", None), ("replace", "sample 5")):
        policy = ErrorPolicy(mode, 10, quarantine=tmp_path / f"{mode}.tsv")
        assert policy.recover(3, key, error, produce) == expected
        found = [(sample.position, sample.reason) for sample in policy.bad_samples()]
        assert found[0] == (3, "DecodeError: #3: cannot decode image (on the GPU)")
        assert [position for position, _ in found] == ([3] if mode == "skip" else [3, 4])
    strict = ErrorPolicy("raise", 10, quarantine=tmp_path / "raise.tsv")
    with pytest.raises(DecodeError, match="on the GPU"):
        strict.recover(3, key, error, produce)
    assert [sample.key for sample in strict.bad_samples()] == ["#3"]
    with pytest.raises(TooManyBadSamples, match=r"sample 3 \(#3\) and the 16 after it are all bad"):
        ErrorPolicy("replace", 40, quarantine=tmp_path / "flood.tsv").recover(3, key, error, lambda i: produce(3))


def test_a_bad_sample_with_a_non_utf8_name_logs_a_line_a_utf8_file_can_hold(tmp_path: Path) -> None:
    """A Latin-1 file name on a UTF-8 system (a lone surrogate after surrogateescape) is logged escaped:
    a log handler writing UTF-8 (a file, a CI log) would otherwise fail on the line."""
    import logging

    from fastloader.datasets.error_policy import ErrorPolicy

    log = tmp_path / "run.log"
    handler = logging.FileHandler(log, encoding="utf-8")
    handler.handleError = lambda record: pytest.fail(f"the log line could not be written: {record.msg}")  # type: ignore[method-assign]
    logger = logging.getLogger("fastloader")
    logger.addHandler(handler)
    try:
        name = b"caf\xe9.jpg".decode("utf-8", "surrogateescape")
        ErrorPolicy("skip", None, None, tmp_path / "quarantine.tsv", ()).record(4, name, f"{name}: cannot decode")
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert "bad sample caf\\xe9.jpg (position 4): caf\\xe9.jpg: cannot decode" in log.read_text(encoding="utf-8")
