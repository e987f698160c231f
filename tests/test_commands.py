"""Options of the scoring commands: the item-token cap, --labels quoting, verify's report, probes."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from slmclassify.classifier import DEFAULT_MAX_TEXT_TOKENS, EngineSettings
from slmclassify.cli.main import cli, main
from slmclassify.core.encode import EncodedItems
from slmclassify.core.settings_sources import NO_CAP
from slmclassify.jobs.sources import engine_settings
from slmclassify.core.verify import PROBE_MAX_TOKENS, VerifyReport, pick_probes

pytestmark = pytest.mark.usefixtures("one_torch_thread")



def test_default_item_cap():
    assert EngineSettings().max_text_tokens == DEFAULT_MAX_TEXT_TOKENS == 512
    assert engine_settings().max_text_tokens == 512
    assert engine_settings(max_text_tokens=1000).max_text_tokens == 1000
    assert engine_settings(max_text_tokens=NO_CAP).max_text_tokens is None
    assert f"default {DEFAULT_MAX_TEXT_TOKENS}" in CliRunner().invoke(cli, ["classify", "--help"]).output


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_max_tokens_must_be_positive_or_none(run_main, tmp_path, value):
    src = tmp_path / "in.csv"
    src.write_text("text\nhello\n")
    code, out, err = run_main("classify", src, "-o", tmp_path / "o.csv", "--labels", "a,b", "--max-tokens", value)
    assert (code, out) == (2, "")
    assert err == (f"slmclassify: error: --max-tokens must be a positive number of tokens or 'none' (no cap), "
                   f"got '{value}'\n")


def test_classify_reports_the_cap_and_none_removes_it(llama_dir, tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("text\n" + "refund " * 60 + "\nlogin\n")
    args = ["classify", str(src), "-o", str(tmp_path / "o.csv"), "--labels", "billing,technical",
            "--model", str(llama_dir), "--no-verify"]
    capped = CliRunner().invoke(cli, [*args, "--max-tokens", "20"], catch_exceptions=False)
    assert ("item texts: cut at 20 tokens (status truncated; --max-tokens N raises the cap, none removes it)"
            in capped.stderr.splitlines())
    assert (tmp_path / "o.csv").read_text().splitlines()[1].endswith(",truncated")
    whole = CliRunner().invoke(cli, [*args, "--max-tokens", "none"], catch_exceptions=False)
    assert "item texts: no cap (cut only at the model's context)" in whole.stderr.splitlines()
    assert (tmp_path / "o.csv").read_text().splitlines()[1].endswith(",ok")


def test_labels_with_a_quoted_comma(llama_dir, tmp_path):
    """Regression: --labels '"x,y",z' gave the labels '"x', 'y"' and 'z'."""
    src = tmp_path / "in.csv"
    src.write_text("text\nhello\n")
    result = CliRunner().invoke(cli, ["verify", str(src), "--labels", '"x,y",z', "--model", str(llama_dir)],
                                catch_exceptions=False)
    labels_line = next(line for line in result.stderr.splitlines() if line.startswith("labels: "))
    assert labels_line.startswith("labels: 'x,y' -> ") and "; 'z' -> " in labels_line


def test_verify_prints_label_tokens_and_honours_calibrate(llama_dir, tmp_path):
    """Regression: verify printed no label tokenisation and ignored --calibrate."""
    src = tmp_path / "in.csv"
    src.write_text("text\nMy card was charged twice.\nThe app crashes.\n")
    args = ["verify", str(src), "--labels", "billing,technical", "--model", str(llama_dir)]
    on = CliRunner().invoke(cli, args, catch_exceptions=False).stderr.splitlines()
    off = CliRunner().invoke(cli, [*args, "--no-calibrate"], catch_exceptions=False).stderr.splitlines()
    assert on[0].endswith("; calibrated: True") and off[0].endswith("; calibrated: False")
    assert on[1].startswith("labels: 'billing' -> ") and "; 'technical' -> " in on[1]
    assert on[-1].startswith("2/2 probes agree with the per-item path, max |Δ log-prob| ")
    assert " (identical predictions); per-item path " in on[-1] and on[-1].endswith(" on the probes")


@pytest.mark.parametrize("n,seconds,expected", [(2, 0.4, "5.0 items/s"), (2, 2.0, "1.0 items/s"),
                                                (2, 5.0, "2.5 s per item"), (0, 0.0, "no probes")])
def test_reference_speed_shows_slow_probes(n, seconds, expected):
    """Regression: 'per-item path 0.0 items/s' hid probes that took seconds each."""
    report = VerifyReport(indices=tuple(range(n)), agree=n, max_abs_diff=0.0, reference_seconds=seconds)
    assert report.reference_speed() == expected


def _encoded(lengths):
    n = len(lengths)
    return EncodedItems(tokens=np.ones(sum(lengths), dtype=np.int32),
                        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                        status=["ok" if k else "empty" for k in lengths], prefix_ids=[], cached=np.zeros(n, dtype=bool))


def test_probes_leave_out_huge_items():
    # rows:      0   1     2   3    4   5
    lengths = [10, 9000, 30, 20, 1024, 0]
    assert PROBE_MAX_TOKENS == 1024
    assert pick_probes(_encoded(lengths), 8) == [0, 2, 3, 4]          # row 1 is too long, row 5 empty
    assert pick_probes(_encoded(lengths), 2) == [0, 4]                # shortest and longest of the short ones
    assert pick_probes(_encoded(lengths), 8, max_tokens=None) == [0, 1, 2, 3, 4]
    assert pick_probes(_encoded([5000, 4000, 3000]), 2) == [1, 2]     # none short enough: the shortest two
