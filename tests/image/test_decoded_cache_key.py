"""The decoded cache is keyed by everything that makes its pixels: pixels made one way (the fast or the exact
decode, another PIL) are never served for another; jobs with other transforms on one path keep a file each; a
disk without room for the file is an error naming it and the bytes it needs."""

from __future__ import annotations

import os
from pathlib import Path

import PIL
import pytest
import torch

from fastloader import transforms as T
from fastloader.datasets.folder import ImageFolder
from tests.image.test_decoded_cache import epoch, make_folder


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("key") / "images", count=12)


def _eval(exact: bool) -> T.Compose:
    return T.Compose([T.Resize(40), T.CenterCrop(32)], exact_decode=exact)


@pytest.mark.parametrize(
    ("filled_with", "read_with"), [(False, True), (True, False)], ids=["fast-then-exact", "exact-then-fast"]
)
def test_pixels_cached_by_one_decode_are_never_served_to_the_other(
    jpegs: Path, tmp_path: Path, filled_with: bool, read_with: bool
) -> None:
    uncached = epoch(ImageFolder(jpegs, transform=_eval(read_with)))
    other = epoch(ImageFolder(jpegs, transform=_eval(filled_with)))
    assert not torch.equal(uncached[0], other[0])  # the two decodes differ on these JPEGs: the test can tell
    path = tmp_path / "eval.cache"
    filler = ImageFolder(jpegs, transform=_eval(filled_with))
    filler.set_cache(path)
    assert torch.equal(epoch(filler)[0], other[0])
    assert filler._cache is not None and filler._cache.filled() == len(filler)

    reader = ImageFolder(jpegs, transform=_eval(read_with))
    reader.set_cache(path)
    for _ in range(2):  # filled by the first epoch, read by the second
        images, labels = epoch(reader)
        assert torch.equal(images, uncached[0]) and torch.equal(labels, uncached[1])
    assert filler._cache.filled() == len(filler)  # the other decode's file is left as it was


def test_two_transforms_on_one_path_alternate_without_rebuilding_each_other(
    jpegs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shared.cache"
    transforms = {"a": _eval(False), "b": T.Compose([T.Resize(36), T.CenterCrop(30)])}
    files: dict[str, tuple[str, int]] = {}
    for name, transform in transforms.items():  # each fills its own file
        dataset = ImageFolder(jpegs, transform=transform)
        dataset.set_cache(path)
        epoch(dataset)
        assert dataset._cache is not None and dataset._cache.filled() == len(dataset)
        files[name] = (dataset._cache.path, os.stat(dataset._cache.path).st_ino)

    for name in ("a", "b", "a", "b"):  # the jobs take turns: each finds its file whole, read without a decode
        dataset = ImageFolder(jpegs, transform=transforms[name])
        dataset.set_cache(path)
        assert dataset._cache is not None and dataset._cache.path == files[name][0]
        assert os.stat(dataset._cache.path).st_ino == files[name][1]  # never rebuilt (a rebuild is a new file)
        assert dataset._cache.filled() == len(dataset)
        with monkeypatch.context() as patch:
            patch.setattr(dataset.source, "read", lambda index: pytest.fail(f"item {index} read again"))
            epoch(dataset, workers=0)
    assert files["a"][0] != files["b"][0]


def test_another_pil_gets_a_file_of_its_own(jpegs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoder's version is in the key (Pillow-SIMD's resizes differ from Pillow's, a new libjpeg may round
    otherwise): pixels of another PIL start empty, in another file."""
    dataset = ImageFolder(jpegs, transform=_eval(False))
    dataset.set_cache(tmp_path / "eval.cache")
    epoch(dataset, workers=0)
    assert dataset._cache is not None and dataset._cache.filled() == len(dataset)
    monkeypatch.setattr(PIL, "__version__", "9.9.9")
    upgraded = ImageFolder(jpegs, transform=_eval(False))
    upgraded.set_cache(tmp_path / "eval.cache")
    assert upgraded._cache is not None and upgraded._cache.path != dataset._cache.path
    assert upgraded._cache.filled() == 0 and dataset._cache.filled() == len(dataset)


def test_a_disk_without_room_for_the_cache_names_the_file_and_the_bytes_it_needs(jpegs: Path, tiny_disk: Path) -> None:
    dataset = ImageFolder(jpegs, transform=T.Compose([T.Resize(200), T.CenterCrop(200)]))  # 12 x 120 kB: 1.4 MB
    needed = 4096 + 4096 + 12 * 200 * 200 * 3
    with pytest.raises(OSError, match=rf"{tiny_disk}/eval\.[0-9a-f]{{16}}\.cache: no room .* needs {needed:,} bytes"):
        dataset.set_cache(tiny_disk / "eval.cache")
    assert [entry.name for entry in tiny_disk.iterdir() if not entry.name.endswith(".lock")] == []  # nothing half-made
