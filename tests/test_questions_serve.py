"""A task of several questions (`core/questions.py`) in `serve` and on Ray: the service answers each
question per item as offline `Classifier.classify` does, refuses the shapes that hold one label
distribution per text, and `classify --ray` writes the single-process run's file."""

from __future__ import annotations

import pytest

from slmclassify import Classifier, EngineSettings, Task

from helpers import random_texts, ray_texts
from test_questions import COLUMNS, SMALL, triage_task

TEXTS = random_texts(6, seed=12) + [""]


def client(tasks: dict[str, Task], loaded):
    """The app in-process, a TestClient (its lifespan starts and stops the scheduler's worker)."""
    pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from slmclassify.serve import ServeSettings
    from slmclassify.serve.app import create_app
    from slmclassify.serve.server import build_service

    return TestClient(create_app(build_service(tasks, loaded, EngineSettings(), ServeSettings())))


def assert_answer(got: dict, want) -> None:
    """One question's answer as the API gives it equals offline `want` (that question's Result)."""
    assert got["label"] == want.label and got["labels"] == list(want.labels), (got, want)
    assert got["needs_review"] == want.needs_review
    if want.confidence is None:
        assert got["confidence"] is None and got["probabilities"] == {}
    else:
        assert got["confidence"] == pytest.approx(want.confidence, abs=1e-4)
        assert got["probabilities"] == pytest.approx(want.probabilities, abs=1e-4), (got, want)


def test_serve_answers_each_question_as_offline_classify(tmp_path, llama_loaded):
    task = triage_task(tmp_path)
    want = Classifier(task, model=llama_loaded).classify(TEXTS)
    with client({"triage": task, "plain": Task(labels=("billing", "technical"))}, llama_loaded) as c:
        answer = c.post("/v1/classify", json={"task": "triage", "texts": TEXTS})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert len(results) == len(TEXTS)
        for got, w in zip(results, want):
            assert set(got) == {"answers", "needs_review", "status"}
            assert list(got["answers"]) == ["team", "priority", "topics"]
            assert got["status"] == w.status and got["needs_review"] == w.needs_review
            for name, a in got["answers"].items():
                assert set(a) == {"label", "labels", "confidence", "needs_review", "probabilities"}
                assert_answer(a, w.answers[name])
        assert results[-1]["status"] == "empty" and results[-1]["answers"]["topics"]["labels"] == []
        one = c.post("/v1/classify", json={"task": "triage", "text": TEXTS[0]}).json()["results"]
        assert one == results[:1]
        # a single-question task beside it keeps its shape
        plain = c.post("/v1/classify", json={"task": "plain", "text": TEXTS[0]}).json()["results"][0]
        assert "answers" not in plain and plain["label"] in ("billing", "technical")

        described = {t["name"]: t for t in c.get("/v1/tasks").json()["tasks"]}
        assert described["triage"]["questions"] == [
            {"name": "team", "question": "", "labels": ["billing", "technical", "account"], "multi_label": False,
             "min_confidence": 0.5, "calibrated": True},
            {"name": "priority", "question": "", "labels": ["low", "normal", "urgent"], "multi_label": False,
             "min_confidence": 0.4, "calibrated": True},
            {"name": "topics", "question": "", "labels": ["refund", "delay"], "multi_label": True,
             "min_confidence": 0.5, "calibrated": False}]
        assert "labels" not in described["triage"] and "questions" not in described["plain"]
        assert [m["id"] for m in c.get("/v1/models").json()["data"]][:2] == ["triage", "plain"]
        metrics = c.get("/metrics").text  # items counted per task and status, as a task of one question's
        statuses = [w.status for w in want] + [want[0].status]
        for status in set(statuses):
            assert f'slmclassify_items_total{{status="{status}",task="triage"}} {statuses.count(status)}.0' in metrics
        assert c.get("/openapi.json").status_code == 200


def test_the_pooling_shape_refuses_a_task_of_questions_and_chat_still_answers(tmp_path, llama_loaded):
    """vLLM's pooling `/v1/classify` holds one label distribution per text: a task of questions is
    refused in one line that says what to send. The OpenAI endpoints score the request's own choices,
    never the task's labels, so naming the task as `model` answers as naming the model does."""
    task = triage_task(tmp_path)
    with client({"triage": task}, llama_loaded) as c:
        for path in ("/v1/classify", "/classify"):
            refused = c.post(path, json={"model": "triage", "input": ["My card was charged twice."]})
            assert refused.status_code == 422
            error = refused.json()["error"]
            assert error == ("task 'triage' asks several questions (team, priority, topics): vLLM's pooling shape "
                             "holds one label distribution per text; send {\"task\": \"triage\", \"texts\": [...]} "
                             "for each question's answers")
        model = c.get("/v1/models").json()["data"][-1]["id"]  # the loaded model: the pooling alias of one task
        assert c.post("/v1/classify", json={"model": model, "input": "x"}).status_code == 422
        chat = {"messages": [{"role": "user", "content": "Route: my card was charged twice."}],
                "guided_choice": ["billing", "technical"], "logprobs": True, "top_logprobs": 2}
        by_task = c.post("/v1/chat/completions", json={"model": "triage", **chat})
        by_model = c.post("/v1/chat/completions", json={"model": model, **chat})
        assert by_task.status_code == 200, by_task.text
        assert by_task.json()["choices"] == by_model.json()["choices"]


def test_cli_ray_writes_the_single_process_file_for_a_task_of_questions(local_ray, llama_dir, tmp_path):
    """`classify --ray` on a task of questions (a multi-label one among them, its list column of labels
    joined in CSV by the driver with that question's separator) writes the same file as a
    single-process run, byte for byte."""
    import pandas as pd
    from click.testing import CliRunner

    from slmclassify.cli.main import cli

    # the tiny model's P(yes) is ~1e-7: thresholds below it choose both topics, joined by the question's separator
    (tmp_path / "triage.toml").write_text(SMALL.replace("calibrate = false", "calibrate = false\n"
                                                        "thresholds = [1e-12, 1e-12]\nlabel_separator = \"|\""))
    pd.DataFrame({"id": range(40), "text": ray_texts(40, seed=9)}).to_csv(tmp_path / "in.csv", index=False)
    common = ["--model", str(llama_dir), "--task", str(tmp_path / "triage.toml"), "--quiet", "--no-verify"]
    runner = CliRunner()
    for name, ray in (("one", ()), ("ray", ("--ray", "--actors", "2", "--block-rows", "16"))):
        run = runner.invoke(cli, ["classify", str(tmp_path / "in.csv"), "-o", str(tmp_path / f"{name}.csv"), *ray,
                                  *common], catch_exceptions=False)
        assert run.exit_code == 0, run.output
    one, on_ray = ((tmp_path / f"{name}.csv").read_text().splitlines() for name in ("one", "ray"))
    assert one[0] == "id,text," + ",".join(COLUMNS)
    assert len(on_ray) == len(one) == 41 and any(",refund|delay," in line for line in one)
    for a, b in zip(one, on_ray):  # both sides of the first row that differs
        assert a == b, f"single process:\n{a}\non Ray:\n{b}"


def test_a_batch_files_pooling_line_naming_a_task_of_questions_gets_its_own_error(tmp_path, llama_dir):
    """`slmclassify batch`: a vLLM-pooling `/v1/classify` line holds one label distribution per
    text, so a line naming a task of questions is refused on its own line, as `serve` refuses it;
    the other lines are answered."""
    import json

    from test_batch import invoke, write_lines

    triage_task(tmp_path)
    lines = [{"custom_id": "q", "method": "POST", "url": "/v1/classify", "body": {"model": "triage", "input": "hi"}},
             {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "triage", "messages": [{"role": "user", "content": "Sort: refund please"}],
                       "structured_outputs": {"choice": ["billing", "technical"]}}}]
    write_lines(tmp_path / "in.jsonl", lines)
    result = invoke("batch", tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl", "--model", llama_dir, "--quiet",
                    "--task", f"triage={tmp_path / 'triage.toml'}")
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert result.exit_code == 0, result.output
    assert got[0]["response"] is None and "asks several questions (team, priority, topics)" in got[0]["error"]["message"]
    assert got[1]["error"] is None and got[1]["response"]["status_code"] == 200


def test_the_loadtest_check_compares_every_questions_answer():
    """`slmclassify loadtest` against a task of questions: each response's every answer is compared
    with offline's (label and probabilities), and a differing answer is a mismatch naming both."""
    from slmclassify.bench.service_load import _Checker

    def result(team: str, p: float) -> dict:
        return {"status": "ok", "needs_review": False, "answers": {
            "team": {"label": team, "probabilities": {"billing": p, "technical": 1 - p}},
            "priority": {"label": "low", "probabilities": {"low": 0.7, "urgent": 0.3}}}}

    class Response:
        headers = {"x-request-id": "r"}

        def __init__(self, body):
            self.body = body

        def json(self):
            return {"results": [self.body]}

    check = _Checker([result("billing", 0.8)], tolerance=1e-4)
    check(0, "r", Response(result("billing", 0.8 + 1e-5)))
    assert check.checked == 1 and check.mismatched == 0 and check.max_diff == pytest.approx(1e-5)
    check(0, "r", Response(result("technical", 0.4)))
    assert check.mismatched == 1 and "got technical/low (ok), offline billing/low (ok)" in check.examples[0]
