"""Each public package has one door, its ``__init__.py``'s ``__all__``, and every error has one home."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import fastloader
import fastloader.errors


def public_packages() -> list[str]:
    names = ["fastloader"]
    for info in pkgutil.iter_modules(fastloader.__path__, "fastloader."):
        if info.ispkg and not info.name.rsplit(".", 1)[-1].startswith("_"):
            names.append(info.name)
    return names


def every_module() -> list[ModuleType]:
    modules = [fastloader]
    for info in pkgutil.walk_packages(fastloader.__path__, "fastloader."):
        if info.name.endswith("._jpeg"):
            continue  # the compiled extension: its exceptions are wrapped by jpeg_ext
        if info.name.startswith("fastloader.integrations."):
            continue  # each imports its optional framework
        modules.append(importlib.import_module(info.name))
    return modules


def test_every_subpackage_is_listed() -> None:
    assert {"fastloader.datasets", "fastloader.formats", "fastloader.image", "fastloader.loader"} <= set(
        public_packages()
    )


@pytest.mark.parametrize("name", public_packages())
def test_each_public_package_has_a_sorted_door_of_public_names(name: str) -> None:
    package = importlib.import_module(name)
    exported = getattr(package, "__all__", None)
    assert isinstance(exported, list), f"{name}/__init__.py has no __all__"
    assert exported == sorted(exported), f"{name}.__all__ is not sorted: {sorted(exported)}"
    assert len(set(exported)) == len(exported), f"{name}.__all__ names one thing twice"
    private = [
        item for item in exported if item.startswith("_") and not (item.startswith("__") and item.endswith("__"))
    ]
    assert not private, f"{name}.__all__ exports private names: {private}"
    missing = [item for item in exported if not hasattr(package, item)]
    assert not missing, f"{name}.__all__ names what {name} does not hold: {missing}"
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)  # noqa: S102 - what a user's star import gets
    assert set(exported) <= set(namespace)


def test_every_exception_fastloader_defines_is_in_fastloader_errors() -> None:
    elsewhere = sorted(
        f"{module.__name__}.{name}"
        for module in every_module()
        for name, value in vars(module).items()
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__
        if module is not fastloader.errors
    )
    assert not elsewhere, f"exceptions defined outside fastloader.errors: {elsewhere}"


ERRORS = (
    "BatchKillsWorkers",
    "CacheStuck",
    "CorruptJPEGError",
    "DecodeError",
    "DestinationLocked",
    "FastloaderError",
    "FormatError",
    "ImagePathError",
    "JpegDecoderUnavailable",
    "MissingField",
    "ObjectChanged",
    "OutsideRoot",
    "PipelineLost",
    "RemoteError",
    "RequestDeadline",
    "TooManyBadSamples",
    "TruncatedBody",
    "UnsupportedJPEGError",
    "WorkersLost",
)


def test_the_errors_are_fastloader_errors_and_importable_from_one_place() -> None:
    namespace: dict[str, object] = {}
    exec(f"from fastloader.errors import {', '.join(ERRORS)}", namespace)  # noqa: S102 - the one place
    defined = {
        name
        for name, value in vars(fastloader.errors).items()
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == "fastloader.errors"
    }
    assert defined == set(ERRORS)
    errors = fastloader.errors
    assert all(issubclass(getattr(errors, name), errors.FastloaderError) for name in ERRORS)
    # Caught as the built-in a caller expects, without knowing fastloader.
    assert issubclass(errors.RemoteError, OSError) and issubclass(errors.CacheStuck, TimeoutError)
    assert issubclass(errors.RequestDeadline, TimeoutError)  # retried as a timeout is
    assert issubclass(errors.ImagePathError, OSError)
    assert issubclass(errors.PipelineLost, RuntimeError)  # as torch's "DataLoader worker ... exited unexpectedly"
    assert issubclass(errors.MissingField, errors.FormatError) and issubclass(errors.FormatError, ValueError)
