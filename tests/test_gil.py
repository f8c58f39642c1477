"""fastloader.gil: whether the GIL is on, and which module turned it back on (``fastloader info`` / ``doctor``)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from fastloader import gil
from fastloader.image import jpeg_ext


@pytest.mark.skipif(hasattr(sys, "_is_gil_enabled"), reason="Python 3.13+ has free-threaded builds")
def test_before_3_13_the_gil_is_on_and_the_report_says_why() -> None:
    assert gil.gil_enabled() and not gil.free_threaded_build()
    assert gil.gil_report() == f"on (Python 3.{sys.version_info.minor} has no free-threaded build)"


def test_the_module_the_interpreter_warned_for_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warning CPython gives on a free-threaded build when a module without Py_MOD_GIL_NOT_USED loads, given
    here by a module of this test (3.11 has no free-threaded build to load a real one in)."""
    (tmp_path / "gil_taker.py").write_text(
        "import warnings\n"
        "warnings.warn(\"The global interpreter lock (GIL) has been enabled to load module 'gil_taker', which has"
        " not declared that it can run safely without the GIL. To override this behavior and keep the GIL disabled"
        ' (at your own risk), run with PYTHON_GIL=0 or -Xgil=0.", RuntimeWarning)\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: True, raising=False)
    monkeypatch.setattr(sysconfig, "get_config_var", lambda name: 1 if name == "Py_GIL_DISABLED" else None)
    report = gil.gil_report(("numpy", "gil_taker", "no_such_module_here"))
    assert report.startswith("on: turned back on by importing gil_taker,")
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    assert gil.gil_report(("numpy",)).startswith("off (free-threaded Python")


@pytest.mark.skipif(not jpeg_ext.AVAILABLE, reason="the JPEG extension is not built")
def test_the_extension_declares_it_needs_no_gil() -> None:
    """Its source declares Py_MOD_GIL_NOT_USED for free-threaded builds (checked running where one is installed)."""
    source = (Path(jpeg_ext.__file__).parent / "_jpeg.c").read_text()
    assert "PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED)" in source
    if gil.free_threaded_build():
        code = "import sys, fastloader.image._jpeg; print(sys._is_gil_enabled())"
        assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
