"""The persisted folder / file-list index: reused while the tree is unchanged, rebuilt when it changes,
built once by concurrent processes, cheap to pickle, and clear about malformed file lists."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastloader.datasets.folder import FileListDataset, FileListSource, FolderSource
from fastloader.datasets.folder_index import FOLDER_KIND, FORMAT_VERSION, IndexMeta
from fastloader.errors import FormatError, MissingField
from fastloader.fields.source import read_fields
from fastloader.formats.index_file import read_index, write_index


def make_tree(root: Path, layout: dict[str, int]) -> Path:
    """``root/<class>/<n>.jpg`` files (empty: the index never opens them), with aged directories."""
    for name, count in layout.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            (root / name / f"{i:05d}.jpg").touch()
    age(root)
    return root


def age(root: Path) -> None:
    """Date every directory a minute back, as data written well before training is: an index built
    within seconds of a change is (rightly) not trusted and would be rebuilt."""
    past = time.time() - 60
    for directory, _, _ in os.walk(root):
        os.utime(directory, (past, past))


def build_id(source: FolderSource | FileListSource) -> int:
    """When the index file as it is now was scanned (unique per build): call right after constructing ``source``."""
    kind = FOLDER_KIND if isinstance(source, FolderSource) else "filelist"
    return IndexMeta.of(read_index(source.index_path, kind, FORMAT_VERSION)).scanned_at_ns


def only_png(path: str) -> bool:
    return path.endswith(".png")


def test_second_construction_reuses_the_index(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", {"a": 3, "b": 2})
    first = FolderSource(root)
    assert first.index_path == str(tmp_path / "data.fastloader-index"), "beside the root by default"
    stat, first_id = os.stat(first.index_path), build_id(first)
    second = FolderSource(root)
    assert build_id(second) == first_id
    assert (
        os.stat(second.index_path).st_ino == stat.st_ino and os.stat(second.index_path).st_mtime_ns == stat.st_mtime_ns
    )
    assert [second.key(i) for i in range(len(second))] == ["a/00000.jpg", "a/00001.jpg", "a/00002.jpg"] + [
        "b/00000.jpg",
        "b/00001.jpg",
    ]
    assert second.labels().dtype == np.int64 and second.labels().tolist() == [0, 0, 0, 1, 1]


def test_rebuild_after_adding_a_file_in_a_nested_directory(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "a" / "sub" / "deep").mkdir(parents=True)
    (root / "a" / "sub" / "deep" / "x.jpg").touch()
    make_tree(root, {"b": 1})
    before = FolderSource(root)
    assert len(before) == 2
    before_id = build_id(before)
    (root / "a" / "sub" / "deep" / "y.png").touch()
    after = FolderSource(root)
    assert build_id(after) != before_id
    assert [after.key(i) for i in range(len(after))] == ["a/sub/deep/x.jpg", "a/sub/deep/y.png", "b/00000.jpg"]


def test_rebuild_after_removing_a_class_and_after_renaming_a_file(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", {"a": 1, "b": 2, "c": 1})
    assert FolderSource(root).classes == ["a", "b", "c"]
    for file in (root / "b").iterdir():
        file.unlink()
    (root / "b").rmdir()
    source = FolderSource(root)
    assert source.classes == ["a", "c"] and source.labels().tolist() == [0, 1]
    age(root)
    (root / "c" / "00000.jpg").rename(root / "c" / "renamed.jpg")
    assert FolderSource(root).key(1) == "c/renamed.jpg"


def test_an_index_built_right_after_a_change_is_rebuilt_at_the_next_load(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", {"a": 1})
    (root / "a" / "new.jpg").touch()  # the directory's mtime is now: too close to the scan to trust
    first_id = build_id(FolderSource(root))
    second = FolderSource(root)
    assert build_id(second) != first_id and len(second) == 2


def test_rebuild_flag_and_changed_filter_rescan(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", {"a": 2})
    (root / "a" / "p.png").touch()
    age(root)
    default_id = build_id(FolderSource(root))
    assert build_id(FolderSource(root)) == default_id
    assert build_id(FolderSource(root, rebuild=True)) != default_id
    pngs = FolderSource(root, is_valid_file=only_png)
    assert [pngs.key(i) for i in range(len(pngs))] == ["a/p.png"]
    pngs_id = build_id(pngs)
    assert build_id(FolderSource(root, is_valid_file=only_png)) == pngs_id, "a named filter is reused"
    lambda_ids = {build_id(FolderSource(root, is_valid_file=lambda p: p.endswith(".png"))) for _ in range(2)}
    assert len(lambda_ids) == 2, "a lambda cannot be recognised, so it is never reused"
    assert len(FolderSource(root)) == 3


def test_a_corrupt_or_foreign_index_is_rebuilt(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", {"a": 2})
    index_path = tmp_path / "custom.idx"
    index_path.write_bytes(b"not an index at all")
    source = FolderSource(root, index_path=index_path)
    assert source.index_path == str(index_path) and len(source) == 2
    other = make_tree(tmp_path / "other", {"z": 1})
    assert FolderSource(other, index_path=index_path).classes == ["z"], "an index of another root is not reused"


def _construct(root: str, queue: Any) -> None:
    source = FolderSource(root)
    queue.put(build_id(source))


def test_concurrent_processes_build_once(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", {f"c{i}": 50 for i in range(20)})
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = [context.Process(target=_construct, args=(str(root), queue)) for _ in range(3)]
    for process in processes:
        process.start()
    ids = [queue.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert len(set(ids)) == 1, "one process built the index, the others reused it"
    assert build_id(FolderSource(root)) == ids[0]


def test_pickle_carries_the_path_not_the_arrays(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", {"a": 3000, "b": 3000})
    source = FolderSource(root)
    assert source.key(5999) == "b/02999.jpg"  # opened in this process: must not leak into the pickle
    blob = pickle.dumps(source)
    assert os.path.getsize(source.index_path) > 100_000
    assert len(blob) < 2_000, len(blob)
    clone = pickle.loads(blob)
    assert len(clone) == 6000 and clone.key(3000) == "b/00000.jpg" and clone.label(3000) == 1


def test_a_reader_of_a_rebuilt_index_listing_other_files_fails_clearly(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", {"a": 2})
    stale = pickle.loads(pickle.dumps(FolderSource(root)))
    (root / "a" / "00000.jpg").rename(root / "a" / "zzz.jpg")
    FolderSource(root, rebuild=True)
    with pytest.raises(FormatError, match="index was rebuilt after this dataset was made"):
        stale.key(0)


def test_a_rebuild_listing_the_same_files_does_not_disturb_readers(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "data", {"a": 2})
    source = FolderSource(root)
    copy = pickle.loads(pickle.dumps(source))  # as a worker receives it
    FolderSource(root, rebuild=True)  # e.g. another rank, or a rebuild forced by coarse timestamps
    assert [copy.key(i) for i in range(2)] == [source.key(i) for i in range(2)]


def test_a_symlink_loop_is_not_followed_forever(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "a" / "sub").mkdir(parents=True)
    (root / "a" / "sub" / "x.jpg").touch()
    os.symlink(root / "a", root / "a" / "sub" / "up")
    os.symlink(root, root / "a" / "to_root")
    source = FolderSource(root)
    assert [source.key(i) for i in range(len(source))] == ["a/sub/x.jpg"]


def test_missing_root_and_empty_root_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        FolderSource(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder in .*empty"):
        FolderSource(tmp_path / "empty")


def test_file_list_whitespace_index_is_reused_and_rebuilt_on_change(tmp_path: Path) -> None:
    listing = tmp_path / "train.txt"
    listing.write_text("a/with space.jpg 3\n\n/abs/b.jpg\t0\r\nc.jpg  12\n")
    os.utime(listing, (time.time() - 60,) * 2)
    source = FileListSource(listing, root="/data")
    source_id = build_id(source)
    assert [source.key(i) for i in range(3)] == ["a/with space.jpg", "/abs/b.jpg", "c.jpg"]
    assert [source.path(i) for i in range(3)] == ["/data/a/with space.jpg", "/abs/b.jpg", "/data/c.jpg"]
    assert source.labels().tolist() == [3, 0, 12] and source.classes is None
    assert build_id(FileListSource(listing)) == source_id
    assert FileListSource(listing).path(0) == str(tmp_path / "a" / "with space.jpg"), "default root: the list's dir"
    listing.write_text("only.jpg 1\n")
    assert [FileListSource(listing).key(i) for i in range(1)] == ["only.jpg"] and len(FileListSource(listing)) == 1


def test_file_list_csv_with_and_without_header(tmp_path: Path) -> None:
    with_header = tmp_path / "with.csv"
    with_header.write_text('path,label\nx/1.jpg,0\n"y/with,comma.jpg",1\n')
    without = tmp_path / "without.CSV"
    without.write_text("x/1.jpg,0\n\ny/2.jpg, 1\n")
    first = FileListSource(with_header, classes=["cat", "dog"])
    assert [first.key(i) for i in range(2)] == ["x/1.jpg", "y/with,comma.jpg"] and first.labels().tolist() == [0, 1]
    assert first.class_to_idx == {"cat": 0, "dog": 1}
    second = FileListSource(without)
    assert [second.key(i) for i in range(2)] == ["x/1.jpg", "y/2.jpg"] and second.labels().tolist() == [0, 1]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.txt", "a.jpg 1\nlonely.jpg\n", r"bad.txt, line 2: expected 'path label'"),
        ("bad.txt", "a.jpg 1\nb.jpg one\n", r"bad.txt, line 2: label 'one' is not an integer"),
        ("bad.txt", "a.jpg,1\n", r"bad.txt, line 1: .*CSV lists must be named \*.csv"),
        ("bad.csv", "path,label\na.jpg,1\nb.jpg,2,3\n", r"bad.csv, line 3: expected 2 fields"),
        ("bad.csv", "a.jpg,1\nb.jpg,x\n", r"bad.csv, line 2: label 'x' is not an integer"),
        ("empty.txt", "\n\n", r"empty.txt: the file list has no entries"),
    ],
)
def test_malformed_file_lists_name_the_file_and_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(FormatError, match=message):
        FileListSource(tmp_path / name)


def test_file_list_labels_must_fit_the_classes(tmp_path: Path) -> None:
    listing = tmp_path / "l.txt"
    listing.write_text("a.jpg 0\nb.jpg 2\n")
    with pytest.raises(ValueError, match=r"l.txt: labels run from 0 to 2, outside the 2 classes"):
        FileListSource(listing, classes=["x", "y"])
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        FileListSource(tmp_path / "missing.txt")


# -- file lists with text columns -----------------------------------------------------------------


def texts(source: FileListSource, name: str) -> list[str]:
    return [source.read_field(i, name) for i in range(len(source))]


def test_csv_columns_under_a_header_are_text_fields_kept_exactly(tmp_path: Path) -> None:
    listing = tmp_path / "captions.csv"
    rows = [
        "path,label,caption,meta\n",
        'a.jpg,0,a plain caption,{"w": 3}\n',
        'b.jpg,1," a caption, with a comma and ""quotes""\nover two lines ",\n',  # an empty cell: ""
        "c d.jpg, 2 ,ünïcode ✓ 🐱,x\r\n",
    ]
    listing.write_bytes("".join(rows).encode("utf-8"))
    source = FileListSource(listing)
    assert source.fields == ("caption", "meta") and source.field_kinds() == {"caption": "text", "meta": "text"}
    assert [source.key(i) for i in range(3)] == ["a.jpg", "b.jpg", "c d.jpg"] and source.labels().tolist() == [0, 1, 2]
    assert texts(source, "caption") == [
        "a plain caption",
        ' a caption, with a comma and "quotes"\nover two lines ',
        "ünïcode ✓ 🐱",
    ]
    assert texts(source, "meta") == ['{"w": 3}', "", "x"]
    assert read_fields(source, 1) == {"caption": texts(source, "caption")[1], "meta": ""}
    assert source.field_aliases() == {"label": "label"}
    assert FileListDataset(listing, fields={"c": "caption", "y": "label"})[2] == {"c": "ünïcode ✓ 🐱", "y": 2}
    with pytest.raises(MissingField, match=r"c d\.jpg: no field 'path' \(the list's text columns: caption, meta\)"):
        source.read_field(2, "path")
    index = read_index(source.index_path, "filelist", FORMAT_VERSION)
    assert index.arrays["field0"].dtype == np.uint8 and index.arrays["field0_offsets"].tolist()[0] == 0


def test_tsv_columns_named_path_and_label_anywhere_and_lists_without_labels(tmp_path: Path) -> None:
    named = tmp_path / "named.tsv"
    named.write_text('caption\tclass\tpath\tlabel\n"quoted" as is\tcat\timgs/1.jpg\t4\n\tdog\timgs/2.jpg\t5\n')
    source = FileListSource(named)
    assert source.fields == ("caption", "class") and [source.key(i) for i in range(2)] == ["imgs/1.jpg", "imgs/2.jpg"]
    assert source.labels().tolist() == [4, 5] and texts(source, "caption") == ['"quoted" as is', ""]
    assert texts(source, "class") == ["cat", "dog"]
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("caption,path\na cat,1.jpg\na dog,2.jpg\n")
    unlabelled = FileListSource(pairs)
    assert unlabelled.labels().tolist() == [-1, -1] and texts(unlabelled, "caption") == ["a cat", "a dog"]
    assert unlabelled.field_aliases() == {}
    positional = tmp_path / "positional.csv"
    positional.write_text("file,class,note\n1.jpg,3,n\n")
    first_two = FileListSource(positional)
    assert first_two.key(0) == "1.jpg" and first_two.label(0) == 3 and first_two.fields == ("note",)
    assert first_two.field_aliases() == {"class": "label"}
    plain = tmp_path / "plain.tsv"
    plain.write_text("a b.jpg\t1\nc.jpg\t2\n")
    assert FileListSource(plain).field_kinds() == {} and FileListSource(plain).key(0) == "a b.jpg"
    txt = tmp_path / "plain.txt"
    txt.write_text("a b.jpg 1\n")
    assert FileListSource(txt).field_kinds() == {} and FileListSource(txt).key(0) == "a b.jpg"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.csv", "a.jpg,1,extra\n", r"bad.csv, line 1: expected 2 fields 'path,label' \(more columns need a header"),
        (
            "bad.csv",
            "path,label,caption\na.jpg,1\n",
            r"bad.csv, line 2: expected 3 fields \(path,label,caption\), got 2",
        ),
        ("bad.tsv", "path\tlabel\tx\tx\n", r"bad.tsv, line 1: the header row must name every column once"),
        ("bad.csv", "path,label,,x\n", r"bad.csv, line 1: the header row must name every column once"),
        ("bad.csv", "path,image\na.jpg,b\n", r"bad.csv, line 1: a column named 'image' cannot be a field"),
        ("bad.csv", "name\na.jpg\n", r"bad.csv, line 1: a header row names a 'path' column or at least two"),
    ],
)
def test_malformed_tables_name_the_file_and_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(FormatError, match=message):
        FileListSource(tmp_path / name)


def test_a_cell_that_is_not_utf8_fails_when_read_naming_item_and_field(tmp_path: Path) -> None:
    listing = tmp_path / "latin.csv"
    listing.write_bytes(b"path,label,caption\nd\xe9j\xe0.jpg,0,caf\xe9\nok.jpg,1,fine\n")
    source = FileListSource(listing)
    assert source.key(0) == "d\udce9j\udce0.jpg" and source.read_field(1, "caption") == "fine"
    with pytest.raises(FormatError, match=r"d.j.\.jpg: field 'caption': not UTF-8 text"):
        source.read_field(0, "caption")


def test_an_index_of_the_first_list_format_is_rebuilt(tmp_path: Path) -> None:
    listing = tmp_path / "old.csv"
    listing.write_text("path,label,caption\na.jpg,0,hello\n")
    os.utime(listing, (time.time() - 60,) * 2)
    source = FileListSource(listing)
    index = read_index(source.index_path, "filelist", FORMAT_VERSION)
    old_meta = {**index.meta, "settings": "list-format:1"}
    del old_meta["fields"], old_meta["label_column"]  # as the first format wrote it: paths and labels only
    old_arrays = {name: array for name, array in index.arrays.items() if not name.startswith("field")}
    write_index(source.index_path, "filelist", FORMAT_VERSION, old_meta, old_arrays)
    assert IndexMeta.of(read_index(source.index_path, "filelist", FORMAT_VERSION)).fields == ()
    again = FileListSource(listing)
    assert again.fields == ("caption",) and again.read_field(0, "caption") == "hello"
    assert IndexMeta.of(read_index(source.index_path, "filelist", FORMAT_VERSION)).settings == "list-format:2"


def test_workers_read_text_fields_from_the_mapped_index(tmp_path: Path) -> None:
    listing = tmp_path / "many.csv"
    listing.write_text("path,label,caption\n" + "".join(f"{i}.jpg,{i % 3},caption {i}\n" for i in range(100)))
    source = FileListSource(listing)
    blob = pickle.dumps(source)
    assert len(blob) < 2000 and b"caption 5" not in blob  # the index stays on disk
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_caption, (blob, 57)) == "caption 57"


def _caption(blob: bytes, index: int) -> Any:
    return pickle.loads(blob).read_field(index, "caption")
