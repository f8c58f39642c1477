"""ParquetDataset over real Parquet files written as Hugging Face writes image datasets: columns,
fields, nulls, several files and row groups, random and shard-aware access, workers."""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import fastloader.datasets.parquet as parquet_dataset
from fastloader.datasets import ParquetDataset, ParquetSource
from fastloader.datasets.base import Source
from fastloader.errors import FormatError, MissingField
from fastloader.fields.source import FieldSource, aliases, field_kinds, read_fields
from fastloader.image.pil import decode_pil
from fastloader.samplers import ShardWindowSampler
from tests.helpers import run_child

REPO = Path(__file__).resolve().parents[2]
CLASSES = ["cat", "dog", "fish"]
HF_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def pixels_of(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, (12 + i % 5, 16, 3), dtype=np.uint8)


def png(i: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels_of(i)).save(out, format="PNG")
    return out.getvalue()


def row(i: int) -> dict[str, Any]:
    """Row i of the toy dataset, as Python values (None: a null), with a few nulls on purpose."""
    return {
        "image": {"bytes": png(i), "path": f"img_{i}.png"},
        "label": None if i == 13 else i % 3,
        "caption": None if i % 7 == 3 else f"a photo n°{i} 🐟",
        "embedding": None if i == 5 else [float(i) + 0.25, -1.5, 3e-8 * i],
        "meta": {"width": 16, "source": f"site{i % 2}", "tags": ["x", "y"][: i % 3]},
        "score": None if i == 8 else i / 3,
    }


def hf_table(rows: list[dict[str, Any]]) -> pa.Table:
    schema = pa.schema(
        [
            ("image", HF_IMAGE),
            ("label", pa.int64()),
            ("caption", pa.string()),
            ("embedding", pa.list_(pa.float32())),
            ("meta", pa.struct([("width", pa.int64()), ("source", pa.string()), ("tags", pa.list_(pa.string()))])),
            ("score", pa.float64()),
        ],
        # What `datasets` puts in every file it writes: the features, with the ClassLabel names.
        metadata={
            b"huggingface": json.dumps(
                {
                    "info": {
                        "features": {
                            "image": {"_type": "Image"},
                            "label": {"names": CLASSES, "_type": "ClassLabel"},
                            "caption": {"dtype": "string", "_type": "Value"},
                        }
                    }
                }
            ).encode()
        },
    )
    return pa.Table.from_pylist(rows, schema=schema)


def write_hf_dataset(directory: Path, sizes: list[int], row_group_size: int = 4) -> list[dict[str, Any]]:
    """``train-0000K-of-0000N.parquet`` files of ``sizes`` rows, in row groups of ``row_group_size``."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = [row(i) for i in range(sum(sizes))]
    start = 0
    for number, size in enumerate(sizes):
        name = f"train-{number:05d}-of-{len(sizes):05d}.parquet"
        pq.write_table(hf_table(rows[start : start + size]), directory / name, row_group_size=row_group_size)
        start += size
    return rows


@pytest.fixture()
def hf_dir(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    return tmp_path / "data", write_hf_dataset(tmp_path / "data", [10, 7, 9])


def test_hugging_face_files_read_back_exactly(hf_dir) -> None:
    directory, rows = hf_dir
    source = ParquetSource(directory)
    assert isinstance(source, Source) and isinstance(source, FieldSource)
    assert len(source) == 26 and source.classes == CLASSES
    assert field_kinds(source) == {"caption": "text", "embedding": "array", "meta": "json", "score": "float"}
    assert aliases(source) == {"image": "image", "label": "label"}
    assert source.labels().tolist() == [-1 if r["label"] is None else r["label"] for r in rows]  # across row groups
    files = sorted(str(directory / name) for name in os.listdir(directory))
    order = list(range(len(source)))
    random.Random(0).shuffle(order)
    for i in order:  # random access across files and row groups
        expected = rows[i]
        file = 0 if i < 10 else 1 if i < 17 else 2
        row_in_file = i - (0, 10, 17)[file]
        assert source.read(i) == expected["image"]["bytes"]
        assert source.label(i) == (-1 if expected["label"] is None else expected["label"])
        assert source.key(i) == source.location(i) == f"{files[file]}#{row_in_file}"
        values = read_fields(source, i)
        present = {n: value for n, value in expected.items() if n not in ("image", "label") and value is not None}
        assert values.keys() == present.keys()
        if "caption" in present:
            assert values["caption"] == present["caption"]
        if "embedding" in present:
            assert values["embedding"].dtype == np.float32
            assert values["embedding"].tolist() == np.array(present["embedding"], np.float32).tolist()
        assert values["meta"] == present["meta"]
        if "score" in present:
            assert values["score"] == present["score"]  # float64: bit for bit


def test_default_items_decode_to_the_right_pixels_with_class_names(hf_dir) -> None:
    directory, rows = hf_dir
    dataset = ParquetDataset(str(directory / "train-*.parquet"))
    assert dataset.classes == CLASSES and dataset.class_to_idx == {"cat": 0, "dog": 1, "fish": 2}
    for i in (0, 9, 10, 13, 25):
        image, label = dataset[i]
        assert isinstance(image, Image.Image) and np.array_equal(np.asarray(image), pixels_of(i))
        assert label == (-1 if i == 13 else i % 3)  # a null label is "no label"


def test_samples_with_fields_as_tuples_or_dicts(hf_dir) -> None:
    directory, rows = hf_dir
    pairs = ParquetDataset(directory, fields=("image", "caption", "label"))
    image, caption, label = pairs[1]
    assert np.array_equal(np.asarray(image), pixels_of(1)) and (caption, label) == (rows[1]["caption"], 1)
    named = ParquetDataset(directory, fields={"vec": "embedding", "meta": "meta", "score": "score"})
    sample = named[4]
    assert sample["vec"].dtype == np.float32 and sample["vec"].tolist() == np.float32(rows[4]["embedding"]).tolist()
    assert (sample["meta"], sample["score"]) == (rows[4]["meta"], rows[4]["score"])
    with pytest.raises(MissingField, match=r"train-00000-of-00003.parquet#3: no field 'caption'"):
        pairs[3]


def test_nulls_are_missing_fields_naming_the_key_and_column(hf_dir) -> None:
    directory, _ = hf_dir
    source = ParquetSource(directory)
    key = source.key(3)
    with pytest.raises(MissingField, match=f"{key}: no field 'caption' \\(null in column 'caption'\\)"):
        source.read_field(3, "caption")
    with pytest.raises(MissingField, match="#5: no field 'embedding'"):
        source.read_field(5, "embedding")
    with pytest.raises(KeyError, match="no field 'nope'"):
        source.read_field(0, "nope")
    assert source.label(13) == -1


def test_sequential_and_shard_window_access_read_each_row_group_once(hf_dir) -> None:
    directory, rows = hf_dir
    source = ParquetSource(directory, cache_row_groups=2)
    # Row groups of 4 rows: files of 10, 7 and 9 rows make groups of 4, 4, 2 | 4, 3 | 4, 4, 1.
    assert source.shard_starts().tolist() == [0, 4, 8, 10, 14, 17, 21, 25, 26]
    assert [source.read(i) for i in range(len(source))] == [r["image"]["bytes"] for r in rows]
    assert source.cache_info()["column_reads"] == 8  # one image column chunk per row group
    clone = pickle.loads(pickle.dumps(source))  # a fresh process-local state: nothing read yet
    sampler = ShardWindowSampler(ParquetDataset(directory), window=2, seed=3)
    order = list(sampler)
    assert sorted(order) == list(range(26)) and order != list(range(26))
    for i in order:
        assert clone.read(i) == rows[i]["image"]["bytes"] and clone.label(i) in (-1, i % 3)
    info = clone.cache_info()
    assert info["column_reads"] == 2 * 8 and info["cached_row_groups"] == 2  # image + label, once per group


def test_columns_found_by_name_and_given_explicitly(tmp_path: Path) -> None:
    n = 6
    table = pa.table(
        {
            "__key__": [f"sample{i:03d}" for i in range(n)],
            "jpg": [png(i) for i in range(n)],
            "cls": pa.array([i % 2 for i in range(n)], pa.int32()),
            "label": [f"text label {i}" for i in range(n)],  # a string "label" is a field, not the label
            "seg.png": pa.array([png(i + 50) for i in range(n)], pa.large_binary()),
            "mask": pa.array([{"bytes": png(i + 100), "path": None} for i in range(n)], HF_IMAGE),
            "tags": pa.array([f"t{i % 2}" for i in range(n)]).dictionary_encode(),
            "flag": [i % 2 == 0 for i in range(n)],
            "box": pa.array([[i, i + 1, 8, 9] for i in range(n)], pa.list_(pa.int16(), 4)),
            "when": pa.array([i * 86400 for i in range(n)], pa.timestamp("s")),
            "attrs": pa.array([[("w", i), ("h", 2)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
            "words": pa.array([["a", "b"][: i % 3] for i in range(n)], pa.list_(pa.string())),
            "extra": pa.array([None] * n, pa.null()),
        }
    )
    pq.write_table(table, tmp_path / "wds.parquet")
    source = ParquetSource(tmp_path / "wds.parquet")
    assert source.field_kinds() == {
        "label": "text",
        "seg.png": "bytes",
        "mask": "image",
        "tags": "text",
        "flag": "int",
        "box": "array",
        "when": "text",
        "attrs": "json",
        "words": "json",
    }
    assert source.field_aliases() == {"jpg": "image", "cls": "label"}
    assert (source.key(4), source.read(4), source.label(3), source.classes) == ("sample004", png(4), 1, None)
    fields = read_fields(source, 2)
    assert (fields["label"], fields["seg.png"], fields["mask"]) == ("text label 2", png(52), png(102))
    assert (fields["tags"], fields["flag"], fields["when"]) == ("t0", 1, "1970-01-03 00:00:00")
    assert fields["box"].dtype == np.int16 and fields["box"].tolist() == [2, 3, 8, 9]
    assert (fields["attrs"], fields["words"]) == ({"w": 2, "h": 2}, ["a", "b"])
    # Given explicitly: the mask is the image, "cls" is a field, and no label column means -1.
    other = ParquetSource(tmp_path / "wds.parquet", image_column="mask", key_column="tags")
    assert (other.read(1), other.key(1), other.label(1)) == (png(101), "t1", 1)
    assert "jpg" in other.field_kinds() and "mask" not in other.field_kinds()
    nolabel = pa.table({"png": [png(0)], "caption": ["x"]})
    pq.write_table(nolabel, tmp_path / "nolabel.parquet")
    assert ParquetSource(tmp_path / "nolabel.parquet").label(0) == -1


def test_bad_columns_and_files_are_named(tmp_path: Path, hf_dir) -> None:
    pq.write_table(pa.table({"caption": ["no image here"]}), tmp_path / "text.parquet")
    with pytest.raises(FormatError, match=r"text.parquet: no image column found: pass image_column="):
        ParquetSource(tmp_path / "text.parquet")
    with pytest.raises(FormatError, match=r"no column 'pixels' for the image"):
        ParquetSource(tmp_path / "text.parquet", image_column="pixels")
    with pytest.raises(FormatError, match=r"image column 'caption' holds string, not binary image bytes"):
        ParquetSource(tmp_path / "text.parquet", image_column="caption")
    pq.write_table(pa.table({"image": [png(0)], "caption": ["x"]}), tmp_path / "one.parquet")
    with pytest.raises(FormatError, match=r"label column 'caption' holds string, not integers"):
        ParquetSource(tmp_path / "one.parquet", label_column="caption")
    pq.write_table(pa.table({"image": pa.array([png(0), None])}), tmp_path / "null.parquet")
    with pytest.raises(FormatError, match=r"null.parquet#1: no image \(null in column 'image'\)"):
        ParquetSource(tmp_path / "null.parquet").read(1)
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(FormatError, match="junk.parquet: not a readable Parquet file"):
        ParquetSource(tmp_path / "junk.parquet")
    (tmp_path / "fastloader-cache").mkdir(exist_ok=True)
    directory, _ = hf_dir
    pq.write_table(pa.table({"image": [png(0)], "other": [1]}), directory / "zzz.parquet")
    with pytest.raises(FormatError, match="zzz.parquet: its columns differ from"):
        ParquetSource(directory)
    with pytest.raises(FileNotFoundError, match="no \\*.parquet file"):
        ParquetSource(tmp_path / "fastloader-cache")  # a directory without Parquet files


def test_open_files_are_bounded(hf_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, rows = hf_dir
    monkeypatch.setattr(parquet_dataset, "_MAX_OPEN_FILES", 2)
    source = ParquetSource(directory, cache_row_groups=1)
    for i in [0, 12, 20, 1, 25, 11]:  # across the three files, back and forth
        assert source.read(i) == rows[i]["image"]["bytes"]
        assert source.cache_info()["open_files"] <= 2


def to_tensor(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image).copy())


def test_dataloader_with_two_workers_gives_the_single_process_samples(hf_dir) -> None:
    directory, rows = hf_dir
    dataset = ParquetDataset(directory, transform=to_tensor)
    expected = [dataset[i] for i in range(len(dataset))]
    sampler = ShardWindowSampler(dataset, window=2, seed=1)
    order = list(sampler)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, sampler=order)
    got = list(loader)
    assert len(got) == len(order)
    for index, (image, label) in zip(order, got):
        assert torch.equal(image, expected[index][0]) and label == expected[index][1]
        assert torch.equal(image, to_tensor(decode_pil(rows[index]["image"]["bytes"])))


def test_importing_fastloader_does_not_import_pyarrow_and_its_absence_is_explained(hf_dir) -> None:
    directory, _ = hf_dir
    code = (
        "import sys\n"
        "import fastloader, fastloader.datasets, fastloader.pack, fastloader.cli\n"
        "assert 'pyarrow' not in sys.modules, 'pyarrow imported by import fastloader'\n"
        "sys.modules['pyarrow'] = None  # as if it were not installed\n"
        "from fastloader.datasets import ParquetDataset\n"
        "try:\n"
        "    ParquetDataset(sys.argv[1])\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "pip install fastloader[parquet]" in out.stdout


BOMB_ROWS, BOMB_TEXT = 3000, "a" * 100_000  # one row group decoding to 300 MB, a few KB of file
DEFAULT_LIMIT = 256 << 20  # ParquetSource's max_decode_bytes


def write_bomb(path: Path, encoding: str = "delta", rows: int = BOMB_ROWS, text: str = BOMB_TEXT) -> Path:
    """One row group of ``rows`` tiny images and as many copies of ``text``, which ``encoding`` (a
    dictionary, the delta of each string against the previous one, or plain) and zstd shrink to a few KB.
    Without the Arrow schema a reader would read the dictionary back as (the issue's foreign file: a
    string column with a dictionary page), so that nothing but the Parquet encoding tells its values repeat."""
    caption = pa.array([text]).dictionary_encode().take(pa.array(np.zeros(rows, np.int32)))  # no copy per row
    table = pa.table({"image": [png(0)] * rows, "caption": caption})
    options: dict[str, Any] = {"use_dictionary": encoding == "dictionary", "store_schema": False}
    if encoding == "delta":
        options["column_encoding"] = {"caption": "DELTA_BYTE_ARRAY"}
    if encoding == "plain":
        table = table.set_column(1, "caption", caption.cast(pa.string()))
    pq.write_table(table, path, row_group_size=rows, compression="zstd", **options)
    return path


@pytest.mark.parametrize("encoding", ["delta", "plain"])
def test_a_read_may_decode_only_so_much_whatever_the_encoding(tmp_path: Path, encoding: str) -> None:
    path = write_bomb(tmp_path / f"{encoding}.parquet", encoding, rows=300, text="b" * 20_000)  # decodes to 6 MB
    assert path.stat().st_size < 64_000
    source = ParquetSource(path, max_decode_bytes=1 << 20)
    assert source.read(5) == png(0)  # the image column alone is decoded: it fits
    message = rf"{path}#5: field 'caption': cannot read column 'caption' of row group 0 in {path}: it decodes to more"
    with pytest.raises(FormatError, match=message + r" than max_decode_bytes=1,048,576 bytes"):
        source.read_field(5, "caption")
    # Plain pages hold what they decode to: the footer says so, and nothing is decoded.
    before = "refused before decoding" in str(pytest.raises(FormatError, source.read_field, 6, "caption").value)
    assert before == (encoding == "plain")
    assert source.cache_info() == {
        "column_reads": 1,  # the image's: the caption's chunk was refused once, then at once
        "cached_row_groups": 1,
        "open_files": 1,
        "refused_column_chunks": 1,
    }
    assert ParquetSource(path, max_decode_bytes=8 << 20).read_field(5, "caption") == "b" * 20_000
    with pytest.raises(ValueError, match="max_decode_bytes must be a positive integer"):
        ParquetSource(path, max_decode_bytes=0)


# Reads the caption of every row (or every few) in a fresh process and prints what each gave (its length or the error),
# with the most pyarrow's memory pool held at once: what the read allocated, and nothing else.
READ_CAPTIONS = (
    "import json, sys\n"
    "import pyarrow as pa\n"
    "from fastloader.datasets import ParquetSource\n"
    "from fastloader.errors import FormatError\n"
    "source = ParquetSource(sys.argv[1], max_decode_bytes=int(sys.argv[2]))\n"
    "outcomes = []\n"
    "for index in range(0, len(source), int(sys.argv[3])):\n"
    "    try:\n"
    "        outcomes.append(len(source.read_field(index, 'caption')))\n"
    "    except FormatError as error:\n"
    "        outcomes.append(str(error))\n"
    "print(json.dumps([outcomes, pa.default_memory_pool().max_memory(), source.cache_info()]))\n"
)


def read_captions(path: Path, limit: int, step: int = 1) -> tuple[list[Any], int, dict[str, int]]:
    """The caption of every ``step``-th row, the most pyarrow held at once, the reads (see READ_CAPTIONS)."""
    command = [sys.executable, "-c", READ_CAPTIONS, str(path), str(limit), str(step)]
    out = run_child(command, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    outcomes, peak, info = json.loads(out.stdout)
    return outcomes, peak, info


def test_a_dictionary_value_is_decoded_once_however_many_rows_refer_to_it(tmp_path: Path) -> None:
    """The issue's file, smaller: one 4 MB value in a dictionary page, referred to by 1,024 rows (4 GB as
    plain strings), in a few KB. Read as a dictionary it costs its value (pages, decompression and the
    dictionary: a few copies of 4 MB), where decoding 16 rows first, as reads did, allocated 64 MB."""
    value = 4 << 20
    path = write_bomb(tmp_path / "bomb.parquet", "dictionary", rows=1024, text="c" * value)
    assert path.stat().st_size < 8_000
    outcomes, peak, info = read_captions(path, 16 << 20, step=64)  # each read copies its 4 MB out: not all
    assert outcomes == [value] * 16
    assert peak < 6 * value, peak
    assert info["column_reads"] == 1 and info["refused_column_chunks"] == 0


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="measures the peak memory Linux reports")
def test_a_few_kb_that_decode_to_300_mb_are_refused_within_bounded_memory(tmp_path: Path) -> None:
    """Delta-encoded strings (each the previous one's prefix): the pages hold a few KB, so the footer cannot
    tell. A reader process (torch loaded, as in training) grows by less than the default limit and half as
    much again (one batch being decoded, the allocator): 310 MB. Decoding the whole column took 590-750 MB."""
    path = write_bomb(tmp_path / "bomb.parquet")
    assert path.stat().st_size < 8_000
    # The peak is the kernel's VmHWM of the reader's own memory (reset just before the read): ru_maxrss
    # would carry over the peak of this test process, which forked it after building a 300 MB table.
    code = (
        "import json, re, sys\n"
        "import torch, pyarrow.parquet\n"
        "from fastloader.datasets import ParquetSource\n"
        "from fastloader.errors import FormatError\n"
        "def memory(name):\n"
        "    with open('/proc/self/status') as status:\n"
        "        return int(re.search(name + r':\\s+(\\d+) kB', status.read()).group(1)) << 10\n"
        "source = ParquetSource(sys.argv[1])\n"
        "with open('/proc/self/clear_refs', 'w') as clear:\n"
        "    clear.write('5')  # the peak starts again from here\n"
        "baseline = memory('VmRSS')\n"
        "try:\n"
        "    outcome = len(source.read_field(5, 'caption'))\n"
        "except FormatError as error:\n"
        "    outcome = str(error)\n"
        "print(json.dumps([outcome, baseline, memory('VmHWM')]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = run_child([sys.executable, "-c", code, str(path)], env=env)
    assert out.returncode == 0, out.stderr
    outcome, baseline, peak = json.loads(out.stdout)
    assert baseline > 100 << 20  # python, torch and pyarrow: what every reader process holds anyway
    assert peak - baseline < 1.5 * DEFAULT_LIMIT, (baseline, peak)
    assert isinstance(outcome, str) and outcome.startswith(f"{path}#5: field 'caption': cannot read column 'caption'")
    assert "row group 0" in outcome and "max_decode_bytes=268,435,456" in outcome
