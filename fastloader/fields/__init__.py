"""Samples beyond ``(image, label)``: named fields of seven kinds, read from every format.

The kinds and their exact encodings are a byte layout (``fastloader.formats.field_values``: what
``fastloader pack`` writes into any format); ``source.py`` is the protocol of a source that carries
fields (:class:`FieldSource`) and how to read them; ``specs.py`` what a dataset's
``fields=`` may ask for (names, :class:`Mask`, :class:`Boxes`); ``reader.py`` reads them for one
sample and moves masks and boxes with the image; ``listing.py`` is ``fastloader fields SRC``::

    from fastloader.fields import Boxes, Mask

    dataset = TarShardDataset("scenes-{000000..000001}.tar", transform=T.Compose([T.RandomResizedCrop(512)]),
                              fields={"image": "jpg", "mask": Mask("seg.png"),
                                      "target": Boxes("json", path="annotations.*.bbox", format="xywh",
                                                      labels="annotations.*.category_id")})
"""

from fastloader.errors import MissingField
from fastloader.fields.source import FieldSource, field_kinds, read_fields
from fastloader.fields.specs import Boxes, Mask
from fastloader.formats.field_values import KINDS

__all__ = ["Boxes", "FieldSource", "KINDS", "Mask", "MissingField", "field_kinds", "read_fields"]
