"""Compatibility names for whole-table reading and writing; the code lives in `slmclassify.io`."""

from .io.formats import FORMATS, table_format
from .io.readers import read_table, texts_of
from .io.writers import write_table

__all__ = ["FORMATS", "read_table", "table_format", "texts_of", "write_table"]
