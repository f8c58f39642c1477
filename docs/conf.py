"""Sphinx configuration of fastloader's documentation: ``make docs`` builds it into docs/_build/html.

Why Sphinx (with the furo theme and MyST Markdown): the docstrings already use Sphinx's roles
(:mod:, :class:, :func:) and Google-style "Args:" sections, which autodoc and napoleon read as they
are; the PyTorch ecosystem (torch, torchvision, torchdata, Lightning) documents with Sphinx, so users
find the layout they know. MyST lets the pages be Markdown that also reads well on GitHub.

The build runs offline (CI has package registries only): no intersphinx inventories, no external
link checks. ``nitpicky`` turns every unresolved reference into a warning (an error with ``-W``);
references into other packages cannot resolve without their inventories and are ignored below, by
package, while a broken reference to one of fastloader's own names still fails the build.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sphinx.application import Sphinx

# Document the fastloader of this checkout, whatever else is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fastloader  # noqa: E402

project = "fastloader"
copyright = "the fastloader authors"
release = version = fastloader.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
root_doc = "index"

html_theme = "furo"
html_title = f"fastloader {release}"
# Wide code lines wrap instead of scrolling out of sight (the why is in the file).
html_static_path = ["_static"]
html_css_files = ["code-wrap.css"]

# MyST: anchors for headings down to ###, so [text](page.md#a-heading) links are checked too.
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_default_options = {"members": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

nitpicky = True
# Outside fastloader: the packages it builds on and the standard library. Without their inventories
# (no network) references into them cannot resolve; fastloader's own names are not listed, so a
# reference to one that does not exist fails the build.
_EXTERNAL = "torch torchvision numpy PIL lmdb pyarrow boto3 typing collections pathlib os".split()
nitpick_ignore_regex = [
    (r"py:.*", rf"({'|'.join(_EXTERNAL)})\..*"),
    # torch's docstrings, inherited by fastloader's subclasses (the samplers), use a role for an argument
    (r"py:attr", r"shuffle=True"),
]


def _no_inline_type(app: Sphinx, what: str, name: str, obj: object, options: object, lines: list[str]) -> None:
    """Keep napoleon from reading a property docstring's "Subject: detail" first line as "type: description".

    Napoleon takes the first line of a property's docstring as ``type: description``; fastloader's
    properties use that shape for prose ("Where images are decoded: ..."). Behind a first line that is
    an empty reST comment (it renders as nothing), napoleon reads the docstring as prose."""
    if what == "property" and lines and ":" in lines[0]:
        lines[:0] = ["..", ""]


def setup(app: Sphinx) -> None:
    app.connect("autodoc-process-docstring", _no_inline_type, priority=400)  # before napoleon's (500)
