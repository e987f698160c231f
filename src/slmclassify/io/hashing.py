"""The one way a file is hashed: SHA-256 of its bytes (or of its first `length` bytes), read in blocks
so memory stays bounded whatever the file's size. Model caches, head files and a resumed run's
input check all key on this."""

from __future__ import annotations

import hashlib
import os

BLOCK = 1 << 20
"""Bytes read at a time."""


def file_sha256(path: str | os.PathLike, length: int | None = None, *, block: int = BLOCK) -> str | None:
    """Hex SHA-256 of the whole file, or of its first `length` bytes; None when it has fewer than
    `length` (a file cut short cannot match a digest of more bytes)."""
    sha = hashlib.sha256()
    left = length
    with open(path, "rb") as fh:
        while left is None or left > 0:
            data = fh.read(block if left is None else min(left, block))
            if not data:
                if left is None:
                    break
                return None
            sha.update(data)
            if left is not None:
                left -= len(data)
    return sha.hexdigest()
