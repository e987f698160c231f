"""The labelling page with a task of questions: every question of an item answered at once, kept in
the store as one JSON object per answer, a head refitted per question on the same hidden states,
the next item picked by its least sure question, a gold column per question on export; and in a
real browser, keys per question and Enter submitting all of them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from slmclassify.errors import TaskError
from slmclassify.jobs.sources import read_task
from slmclassify.label.answers import Answers, InvalidAnswer
from slmclassify.label.store import LabelStore
from slmclassify.label.strategy import Picker, PoolView

from helpers import tickets, wait_for
from test_questions import SMALL

pytest.importorskip("sklearn")



def small_task(tmp_path, text: str = SMALL):
    path = tmp_path / "triage.toml"
    path.write_text(text)
    return read_task(str(path))


def answer_for(i: int, team: str) -> dict:
    """A made-up answer to every question: each label of each question turns up twice within 6 items."""
    return {"team": team, "priority": ("low", "normal", "urgent")[i % 3],
            "topics": [["refund"], [], ["refund", "delay"]][i % 3]}


def test_answers_of_questions_round_trip_through_the_store_and_are_checked(tmp_path):
    task = small_task(tmp_path)
    store = LabelStore.open(tmp_path / "s.sqlite", {"task": "t"})
    answers = Answers(store, task, {0: 0, 1: 1}, ["h0", "h1"], "in.csv")
    text = answers.encode({"topics": ["delay", "refund"], "team": "account", "priority": "low"})
    assert json.loads(text) == {"team": "account", "priority": "low", "topics": ["refund", "delay"]}
    store.answer(1, "h1", text, "random")
    answers.reload()
    assert answers.given == {1: (2, 0, (0, 1))} and answers.parts[2].given == {1: (0, 1)}
    assert answers.columns() == {1: (2, 3, 6, 7)}  # team 0-2, priority 3-5, topics 6-7
    assert answers.shown(answers.given[1]) == "account · low · refund, delay"
    assert answers.gold(answers.given[1]) == ("account", "low", "refund;delay")
    with pytest.raises(InvalidAnswer, match=r"a task of questions takes an answer to each of \['team', 'priority', "):
        answers.encode({"team": "account", "priority": "low"})
    with pytest.raises(InvalidAnswer, match=r"^label 'high' is not one of question priority's labels"):
        answers.encode({"team": "account", "priority": "high", "topics": []})
    with pytest.raises(InvalidAnswer, match="a multi-label question topics's answer is a list"):
        answers.encode({"team": "account", "priority": "low", "topics": "refund"})
    store.answer(0, "h0", json.dumps({"team": "sales", "priority": "low", "topics": []}))
    with pytest.raises(TaskError, match=r"holds label .* for row 0, which is not in the task's labels \{'team'"):
        Answers(store, task, {0: 0, 1: 1}, ["h0", "h1"], "in.csv")
    store.close()


def test_the_next_item_is_the_one_whose_least_sure_question_is_least_sure():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((4, 8)).astype(np.float32)
    # columns: a (2 labels), b (multi-label, 1 label); every item is sure of one question only
    head = np.array([[0.99, 0.01, 0.5], [0.6, 0.4, 0.99], [0.55, 0.45, 0.02], [0.9, 0.1, 0.7]])
    questions = (("a", slice(0, 2), False, ("x", "y")), ("b", slice(2, 3), True, ("z",)))
    pool = PoolView(head, features, np.ones(4, bool), head, ("a: x", "a: y", "b: z"), questions=questions)
    pick = Picker(3, seed=0, random_share=0.0, cold_per_label=0).pick(pool, {}, set())
    assert pick.row == 0 and pick.reason == "the model is unsure whether z applies (b, P 0.50)"
    pick = Picker(3, seed=0, random_share=0.0, cold_per_label=0).pick(pool, {}, {0})
    assert pick.row == 2 and pick.reason == "the model is unsure about a: x or y (margin 0.10)"


def test_session_of_questions_stores_refits_exports_and_resumes(tmp_path, llama_dir, one_torch_thread):
    from slmclassify.label.session import LabelRequest, LabelSession

    data = tmp_path / "tickets.csv"
    gold = tickets(data, 16)
    task = small_task(tmp_path)
    store = tmp_path / "labels.sqlite"
    request = LabelRequest(str(data), store, first_slice=8, seed=1)
    session = LabelSession.start(request, task, model=str(llama_dir))
    given = {}
    try:
        assert session.wait_ready(120)
        state = session.state()
        assert [q["name"] for q in state["questions"]] == ["team", "priority", "topics"]
        item = state["item"]
        assert set(item["answers"]) == {"team", "priority", "topics"} and set(item["guess"]) == set(item["answers"])
        assert item["answers"]["team"]["guess"] in ("billing", "technical", "account")
        assert isinstance(item["answers"]["topics"]["guess"], list)
        with pytest.raises(InvalidAnswer):
            session.answer(item["row"], "billing")
        for i in range(6):
            item = session.state()["item"]
            given[item["row"]] = answer_for(i, gold[item["text"]])
            session.answer(item["row"], given[item["row"]], item["version"])
        wait_for(lambda: session.state()["scored"] == 17 and not session.state()["fitting"]
                 and all(part.head is not None for part in session.pool.parts))
        state = session.state()
        assert state["labelled"] == 6 and state["counts"]["priority: urgent"] == state["counts"]["topics: delay"] == 2
        assert [q["counts"] for q in state["questions"]][1] == {"low": 2, "normal": 2, "urgent": 2}
        assert state["accuracy"] is None and state["auto_share"] is None  # no honest estimate from 6 answers
        # each question's guess is its own head's now, from the same hidden states
        pos = session.pool.position(state["item"]["row"])
        for part, name in zip(session.pool.parts, ("team", "priority", "topics")):
            assert state["item"]["answers"][name]["probabilities"] == pytest.approx(
                dict(zip(part.labels, part.head_probs[pos])))
        row = state["item"]["row"]
        given[row] = session.accept(row)
        assert given[row] == state["item"]["guess"]
        latest = LabelStore.open(store, session.store.fingerprint).latest()
        assert {r: json.loads(label) for r, (label, _, _) in latest.items()} == given
        assert session.export(str(tmp_path / "out.csv")) == len(given)
        out = pd.read_csv(tmp_path / "out.csv", keep_default_na=False)
        assert list(out.columns) == ["id", "text", "gold_team", "gold_priority", "gold_topics"]
        assert list(out["gold_topics"]) == [";".join(given[r]["topics"]) for r in sorted(given)]
        assert list(out["gold_team"]) == [given[r]["team"] for r in sorted(given)]
        with pytest.raises(TaskError, match=r"run `slmclassify fit` on them with --gold-column NAME=gold_NAME"):
            session.fit(str(tmp_path / "head.npz"))
    finally:
        session.close()

    again = LabelSession.start(request, task, model=str(llama_dir))
    try:
        assert again.state()["labelled"] == len(given)  # continues where it stopped
        assert again.wait_ready(120) and again.state()["item"]["row"] not in given
    finally:
        again.close()
    with pytest.raises(TaskError, match=r"\(labels, task differ; only the store has topics: refund, topics: delay"):
        LabelSession.start(request, small_task(tmp_path, SMALL.replace('"refund", "delay"', '"refunds", "late"')),
                           model=str(llama_dir))


TWO = """
instruction = "Triage."
user_template = "Ticket: {text}"

[[questions]]
name = "team"
labels = ["billing", "technical", "account"]

[[questions]]
name = "topics"
multi_label = true
labels = ["refund", "delay"]
"""


def test_page_of_two_questions_answers_both_by_keyboard(tmp_path, llama_dir):
    """In Chromium: a key answers the focused question and a single answer moves the focus on, Tab /
    Shift+Tab move between questions, a multi-label question's keys toggle, Enter submits both; the
    store holds both answers of every item."""
    import os
    import shutil
    import sqlite3

    missing = None if all(map(shutil.which, ("chromium", "chromedriver"))) else "needs chromium and chromedriver"
    if not os.environ.get("SLMCLASSIFY_REQUIRE_BROWSER"):
        pytest.importorskip("selenium.webdriver", reason="needs selenium (the 'test' extra)")
        if missing:
            pytest.skip(missing)
    assert missing is None, missing
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from label_server import Page
    from test_label_browser import chromium, press, wait_for_item, write_input

    input_path, task, store = tmp_path / "tickets.csv", tmp_path / "two.toml", tmp_path / "tickets.labels.sqlite"
    write_input(input_path, n=20)
    task.write_text(TWO)
    page = Page([str(input_path), "--task", str(task), "--store", str(store), "--model", str(llama_dir),
                 "--port", "0", "--seed", "2"])
    driver = chromium()
    read = """return [...document.querySelectorAll('.question')].map((g) => [g.dataset.question,
        g.classList.contains('focus'), [...g.querySelectorAll('button.on')].map((b) => b.dataset.label)])"""
    body = lambda: driver.find_element(By.TAG_NAME, "body")  # noqa: E731
    targets = [("technical", {"refund"}), ("billing", set()), ("account", {"refund", "delay"}), ("billing", {"delay"})]
    expected = {}
    try:
        driver.get(page.url)
        shown = wait_for_item(driver)
        assert "Tab" in driver.find_element(By.ID, "keys").text
        for i, (team, topics) in enumerate(targets):
            row = shown["row"]
            (_, team_focus, _), (_, topics_focus, guessed) = driver.execute_script(read)
            assert team_focus and not topics_focus
            if i == 1:  # to the second question and back
                body().send_keys(Keys.TAB)
                assert [f for _, f, _ in driver.execute_script(read)] == [False, True]
                body().send_keys(Keys.SHIFT, Keys.TAB)
            body().send_keys(str(["billing", "technical", "account"].index(team) + 1))
            (_, team_focus, team_on), (_, topics_focus, _) = driver.execute_script(read)
            assert team_on == [team] and topics_focus and not team_focus  # answered: on to the next question
            for k, label in enumerate(["refund", "delay"]):  # toggle what differs from the guess shown
                if (label in topics) != (label in guessed):
                    body().send_keys(str(k + 1))
            assert set(driver.execute_script(read)[1][2]) == topics
            shown = press(driver, Keys.ENTER)
            said = ", ".join(label for label in ["refund", "delay"] if label in topics) or "none of them"
            assert shown["status"] == f"row {row}: {team} · {said}", shown["status"]
            expected[row] = {"team": team, "topics": [label for label in ["refund", "delay"] if label in topics]}
            assert shown["row"] not in expected
        driver.save_screenshot(str(tmp_path / "questions.png"))
    finally:
        driver.quit()
        page.kill()
    conn = sqlite3.connect(store)
    stored = {row: json.loads(label) for row, label in conn.execute("SELECT row, label FROM events WHERE undone = 0")}
    conn.close()
    assert stored == expected
