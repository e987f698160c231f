"""`io.hashing.file_sha256`, the one way a file is hashed (model caches, head files, a resumed
run's input check): the whole file or its first `length` bytes, whatever the block size."""

from __future__ import annotations

import hashlib

import pytest

from slmclassify.io.hashing import file_sha256

DATA = bytes(range(256)) * 41  # 10,496 bytes: several blocks of the sizes below, and a partial one


@pytest.fixture
def path(tmp_path):
    file = tmp_path / "data.bin"
    file.write_bytes(DATA)
    return file


@pytest.mark.parametrize("block", [1, 7, 1000, 1 << 20])
def test_whole_file_is_its_sha256_whatever_the_block(path, block):
    assert file_sha256(path, block=block) == hashlib.sha256(DATA).hexdigest()
    assert file_sha256(str(path), block=block) == hashlib.sha256(DATA).hexdigest()  # a str path too


@pytest.mark.parametrize("length", [0, 1, 999, 1000, 1001, len(DATA)])
@pytest.mark.parametrize("block", [7, 1000])
def test_first_length_bytes(path, length, block):
    assert file_sha256(path, length, block=block) == hashlib.sha256(DATA[:length]).hexdigest()


def test_a_file_shorter_than_length_has_no_digest(path):
    """A file cut short cannot match the digest of more bytes than it holds."""
    assert file_sha256(path, len(DATA) + 1) is None
    assert file_sha256(path, len(DATA) + 1, block=7) is None


def test_an_empty_file(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert file_sha256(empty) == hashlib.sha256(b"").hexdigest()
    assert file_sha256(empty, 0) == hashlib.sha256(b"").hexdigest()
    assert file_sha256(empty, 1) is None


def test_a_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        file_sha256(tmp_path / "missing")
