"""``fields=``: names in the format's naming, Mask and Boxes, checked against what the source has."""

from __future__ import annotations

import pytest

from fastloader.fields.specs import Boxes, Mask, resolve

KINDS = {"txt": "text", "json": "json", "seg.png": "image", "xmin": "array", "score": "float"}
ALIASES = {"image": "image", "label": "label", "jpg": "image", "cls": "label"}


def test_a_sequence_gives_tuples_a_mapping_dicts() -> None:
    layout = resolve(("jpg", "txt", "cls"), KINDS, ALIASES)
    assert not layout.as_dict
    assert [(o.name, o.role, o.kind) for o in layout.outputs] == [
        ("jpg", "image", ""),
        ("txt", "field", "text"),
        ("cls", "label", ""),
    ]
    assert layout.assemble({"jpg": 1, "txt": 2, "cls": 3}) == (1, 2, 3)
    named = resolve({"picture": "image", "mask": Mask("seg.png"), "boxes": Boxes("json", path="b")}, KINDS, ALIASES)
    assert named.as_dict and [o.role for o in named.annotations] == ["mask", "boxes"]
    assert named.assemble({"picture": 1, "mask": 2, "boxes": 3}) == {"picture": 1, "mask": 2, "boxes": 3}


def test_unknown_names_list_what_the_dataset_has() -> None:
    with pytest.raises(ValueError, match=r"no field 'caption' in this dataset; it has \['cls', 'image', 'jpg'"):
        resolve(("jpg", "caption"), KINDS, ALIASES)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((Mask("txt"),), "Mask needs a field of kind image or bytes; 'txt' is text"),
        ((Boxes("score"),), "Boxes needs a field of kind json or array; 'score' is float"),
        ((Boxes(("xmin", "xmin", "xmin", "json")),), "needs four array fields"),
        (("jpg", "image"), "the image twice"),
        (("txt", "txt"), "names an output twice"),
        ((), "at least one"),
    ],
)
def test_bad_fields_are_refused_clearly(fields: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve(fields, KINDS, ALIASES)  # type: ignore[arg-type]


def test_a_single_name_is_not_a_sequence_of_letters() -> None:
    with pytest.raises(TypeError, match=r"write \('txt',\)"):
        resolve("txt", KINDS, ALIASES)


def test_boxes_options_are_checked() -> None:
    with pytest.raises(ValueError, match="format must be one of"):
        Boxes("json", format="xyz")
    with pytest.raises(ValueError, match="4 array fields"):
        Boxes(("a", "b"))  # type: ignore[arg-type]
