"""Labelling as a team in a real browser (issue "Labelling for a team", done means): three
annotators and a reviewer on 30 items with overlap 2, each through their own page (a tab of one
headless Chromium, each opened at the address printed for them); the server killed with SIGKILL
half way loses no acknowledged answer and serves the same addresses again; the reviewer decides
every disagreement; the agreement printed equals the reference libraries' on the same answers; the
Parquet export loads with `datasets` with a ClassLabel, the Label Studio file has one annotation per
answer. The screenshot of the reviewer's page (the agreement view) goes to
$SLMCLASSIFY_TEAM_SCREENSHOT when set (docs/label-team.png), else into the test's temporary folder."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from test_label_browser import LABELS, chromium, page_state, press, screenshot, wait_until, write_input  # skips as it does
from label_server import Page


ANNOTATORS = ("alice", "bob", "carol")
TASK_TOML = """user_template = "Ticket: {text}"
[[labels]]
name = "billing"
description = "charges, invoices, refunds"
examples = ["I was charged twice"]
[[labels]]
name = "technical"
description = "the app or the site does not work"
[[labels]]
name = "account"
description = "email, password, closing the account"
"""


def answer_of(who: str, row: int) -> str:
    """Each annotator's answer: mostly the same, bob and carol each differ on some rows."""
    k = row % 3
    if who == "bob" and row % 5 == 0:
        k = (k + 1) % 3
    if who == "carol" and row % 4 == 1:
        k = (k + 2) % 3
    return LABELS[k]


def stored(store: Path) -> dict[tuple[int, str], str]:
    """{(row, who): label} of each person's latest live answer, read from the SQLite file itself."""
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT e.row, e.who, e.label FROM events e JOIN (SELECT MAX(seq) AS seq FROM events "
                            "WHERE undone = 0 GROUP BY row, who) last ON e.seq = last.seq").fetchall()
    finally:
        conn.close()
    return {(row, who): label for row, who, label in rows if label is not None}


def test_three_annotators_and_a_reviewer_on_30_items(tmp_path, llama_dir, run_main):
    krippendorff = pytest.importorskip("krippendorff")
    inter_rater = pytest.importorskip("statsmodels.stats.inter_rater")
    datasets = pytest.importorskip("datasets")
    from sklearn.metrics import cohen_kappa_score

    input_path, task, store = tmp_path / "tickets.csv", tmp_path / "support.toml", tmp_path / "tickets.labels.sqlite"
    texts = write_input(input_path, n=30)
    task.write_text(TASK_TOML)
    (tmp_path / "guide.md").write_text("A refund asked for after a crash is billing.\n")
    common = [str(input_path), "--task", str(task), "--store", str(store), "--model", str(llama_dir), "--seed", "3"]
    args = [*common, "--port", "0", "--annotators", ",".join(ANNOTATORS), "--reviewers", "dana", "--overlap", "2",
            "--guidelines", str(tmp_path / "guide.md")]
    page = Page(args, people=4)
    urls = dict(page.urls)
    assert sorted(urls) == ["alice", "bob", "carol", "dana"] and len(set(urls.values())) == 4
    driver = chromium()
    tabs = {}
    given: dict[tuple[int, str], str] = {}
    killed = False

    def open_tab(who: str) -> None:
        if tabs:
            driver.switch_to.new_window("tab")
        driver.get(urls[who])
        tabs[who] = driver.current_window_handle

    def shown(who: str) -> dict:
        """`who`'s tab, with the state of the moment (reloaded when it shows no item: others' answers
        may have handed it one since its last poll)."""
        driver.switch_to.window(tabs[who])
        ready = "return !document.getElementById('main').classList.contains('stopped') && " \
                "document.getElementById('me').textContent !== ''"
        wait_until(driver, lambda d: d.execute_script(ready))
        state = page_state(driver)
        if state["row"] is None:
            driver.refresh()
            wait_until(driver, lambda d: d.execute_script(ready))
            state = page_state(driver)
        return state

    def turn(who: str) -> bool:
        state = shown(who)
        if state["row"] is None:
            return False
        row = state["row"]
        assert state["text"] == texts[row]
        assert driver.execute_script("return document.getElementById('team-answers').textContent") == ""
        assert driver.find_element("id", "me").text == f"{who} · annotator"
        label = answer_of(who, row)
        after = press(driver, str(LABELS.index(label) + 1))
        assert after["status"] == f"row {row}: {label}"
        given[(row, who)] = label
        return True

    try:
        for who in (*ANNOTATORS, "dana"):
            open_tab(who)
        shown("dana")
        guide = driver.execute_script("return document.getElementById('guide').textContent")
        assert "charges, invoices, refunds" in guide and "I was charged twice" in guide and "after a crash" in guide
        while True:
            moved = [turn(who) for who in ANNOTATORS]
            if not killed and len(given) >= 30:
                page.kill()  # SIGKILL half way: no shutdown code runs
                assert page.proc.returncode == -signal.SIGKILL
                assert stored(store) == given  # every acknowledged answer is on disk
                page = Page(args, people=4)
                assert page.urls == urls  # the same address for each person
                killed = True
            if not any(moved):
                break
        per_row = {}
        for (row, who), label in given.items():
            per_row.setdefault(row, {})[who] = label
        assert sorted(per_row) == list(range(30)) and all(len(by) == 2 for by in per_row.values())
        disputed = {row for row, by in per_row.items() if len(set(by.values())) > 1}
        assert disputed
        reviewed = {}
        while (state := shown("dana"))["row"] is not None:
            row = state["row"]
            seen = driver.execute_script("return document.getElementById('team-answers').textContent")
            assert all(f"{who} {label}" in seen for who, label in per_row[row].items()), seen
            after = press(driver, "1")
            assert after["status"] == f"row {row}: {LABELS[0]}"
            reviewed[row] = LABELS[0]
        assert set(reviewed) == disputed  # the reviewer was handed every disagreement, and nothing else
        assert stored(store) == {**given, **{(row, "dana"): label for row, label in reviewed.items()}}
        driver.refresh()  # the agreement view, fetched at once on load
        wait_until(driver, lambda d: d.find_element("id", "alpha").text not in ("", "–"))
        screenshot(driver, "SLMCLASSIFY_TEAM_SCREENSHOT", tmp_path / "label-team.png")
    finally:
        driver.quit()
        page.kill()

    code, out, err = run_main("label", *common, "--agreement", "--export", tmp_path / "team.parquet")
    assert code == 0, err
    report = json.loads((tmp_path / "tickets.agreement.json").read_text())["questions"][0]
    rows = sorted(per_row)
    table = np.full((len(ANNOTATORS), len(rows)), np.nan)  # reliability data: annotators × items
    for i, row in enumerate(rows):
        for who, label in per_row[row].items():
            table[ANNOTATORS.index(who), i] = LABELS.index(label)
    alpha = krippendorff.alpha(reliability_data=table, level_of_measurement="nominal")
    assert report["overall"]["krippendorff_alpha"]["value"] == pytest.approx(alpha, abs=1e-9)
    counts = np.array([[sum(1 for label in per_row[row].values() if label == name) for name in LABELS] for row in rows])
    assert report["overall"]["fleiss_kappa"]["value"] == pytest.approx(inter_rater.fleiss_kappa(counts), abs=1e-9)
    for pair in report["cohen_kappa"]:
        shared = [r for r in rows if pair["a"] in per_row[r] and pair["b"] in per_row[r]]
        want = cohen_kappa_score([per_row[r][pair["a"]] for r in shared], [per_row[r][pair["b"]] for r in shared])
        assert pair["items"] == len(shared) and pair["value"] == pytest.approx(want, abs=1e-9)
    assert f"{alpha:.2f}" in out  # the printed report says the same
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "team.parquet"),
                               cache_dir=str(tmp_path / "hf"))["train"]
    assert ds.num_rows == 30 and ds.features["label"].names == list(LABELS)
    for r in ds:
        by = per_row[r["row"]]
        want = reviewed.get(r["row"]) or next(iter(by.values()))
        assert ds.features["label"].int2str(r["label"]) == want
    code, out, err = run_main("label", *common, "--export", tmp_path / "tasks.json", "--format", "label-studio")
    assert code == 0, err
    tasks = json.loads((tmp_path / "tasks.json").read_text())
    assert sum(len(t["annotations"]) for t in tasks) == len(given) + len(reviewed)  # one per answer
