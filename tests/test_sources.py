"""The task and engine settings from their sources: `core` merges plain data (no file read), `io`
reads the files, `jobs.sources` joins them and gives what the file-reading versions gave."""

from __future__ import annotations

import pytest

from slmclassify import TaskError
from slmclassify.core.settings_sources import NO_CAP, merge_settings
from slmclassify.core.task import merge_task, task_engine_settings
from slmclassify.io.task_files import read_task_file
from slmclassify.jobs.sources import build_task, engine_settings, read_task, task_file_settings

TOML = 'labels = ["a", "b"]\nmin_confidence = 0.6\ntoken_budget = 300\ndevice = "cpu"\n'


def test_core_merges_a_task_files_data_as_the_file(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(TOML)
    data = read_task_file(path)
    assert merge_task(data, source=str(path)) == read_task(path) == build_task(path)
    assert merge_task(data, ("x", "y"), mode="first") == build_task(path, ("x", "y"), mode="first")
    assert task_engine_settings(data) == task_file_settings(path) == {"token_budget": 300, "device": "cpu"}


def test_settings_precedence_flags_then_task_then_saved():
    saved, from_task = {"token_budget": 100, "max_rows": 4}, {"token_budget": 200}
    assert merge_settings(saved, from_task).token_budget == 200
    assert merge_settings(saved, from_task).max_rows == 4
    assert merge_settings(saved, from_task, token_budget=300).token_budget == 300
    assert merge_settings({}, {}, max_text_tokens=NO_CAP).max_text_tokens is None
    assert merge_settings({}, {}) == engine_settings()  # conftest: no saved defaults


def test_an_unreadable_task_file_is_a_task_error(tmp_path):
    with pytest.raises(TaskError, match="task file not found"):
        read_task(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("labels = [")
    with pytest.raises(TaskError, match="is not valid TOML"):
        build_task(tmp_path / "bad.toml")
    with pytest.raises(TaskError, match="is a folder"):
        task_file_settings(tmp_path)
