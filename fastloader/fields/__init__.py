"""Samples beyond ``(image, label)``: named fields of seven kinds, read from every format.

``fastloader.fields.values`` holds the kinds and their exact encodings (what ``fastloader pack``
writes into any format); sources that carry fields implement :class:`FieldSource`.
"""

from fastloader.fields.values import KINDS, FieldSource, MissingField, field_kinds, read_fields

__all__ = ["KINDS", "FieldSource", "MissingField", "field_kinds", "read_fields"]
