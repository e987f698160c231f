"""Reading and writing the user's tables in chunks (CSV, JSONL, Parquet; `-` for stdin/stdout).

`formats` names formats and checks paths before any work; `readers` yields the input a chunk of
rows at a time (memory bounded by the chunk, never by the file); `writers` appends chunks to an
output (CSV rows, JSONL lines, Parquet row groups). `read_table`/`write_table` are the
whole-table conveniences built on the same readers and writers.

The other files the commands read and write, each as plain data (no core type is imported here):
`labelled` (texts with gold labels for evaluate/fit), `task_files` (TOML task files),
`saved_settings` (the user's saved defaults), `plots` (evaluate's PNGs), `hashing` (the one file
hash), `checkpoint` and `lock` (the resumable output and its lock).
"""

from .formats import FORMATS, check_output, table_format
from .readers import TableReader, item_texts, open_table, read_table, texts_of
from .writers import ChunkWriter, write_table

__all__ = ["FORMATS", "ChunkWriter", "TableReader", "check_output", "open_table", "read_table", "table_format",
           "texts_of", "item_texts", "write_table"]
