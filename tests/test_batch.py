"""`slmclassify batch`: an OpenAI Batch API file answered offline over a tiny random Llama: one
answer line per request line in order, each choice's log-probability equal to the Hugging Face
forward's, bad lines answered with their error, and a run interrupted and resumed equal to one run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from helpers import invoke
from slmclassify import Classifier
from slmclassify.jobs.sources import read_task
from slmclassify.cli.main import cli
from slmclassify.core.config_check import context_limit
from slmclassify.core.conversation import choice_prompt
from slmclassify.core.reference import reference_scores
from slmclassify.interrupts import Interrupted
from slmclassify.jobs import batch as batch_module

MODEL = "tiny"
"""The id the lines name the model by (`--served-model-name`)."""
CHOICES = ["billing", "technical support", "account"]
TICKETS = ["My card was charged twice.", "The app crashes when I open settings.", "Change my email please.",
           "refund", "login error crash after the update", "Where is my parcel?", "invoice missing", "hello"]


def chat_line(k: int, ticket: str, system: str = "Route the ticket to a team.", **body) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": ticket}]
    return {"custom_id": f"req-{k}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": messages, "structured_outputs": {"choice": CHOICES},
                     "logprobs": True, "top_logprobs": 3, **body}}


def write_lines(path, lines) -> None:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def answers(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_line_answered_in_order_equal_to_the_reference(tmp_path, llama_dir, llama_loaded):
    good = [chat_line(k, t, system="Route the ticket." if k % 3 else "Sort the ticket.") for k, t in
            enumerate(TICKETS)]
    bad = ["not json", "", {"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {}},
           {"custom_id": "y", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}},
           {"method": "POST", "url": "/v1/chat/completions", "body": {}},
           chat_line(99, "hi", model="smollm2-135m-instruct")]  # not the id this run serves
    ids = llama_loaded.tokenizer("Question: who handles refunds?\nAnswer: billing")["input_ids"]
    scored = {"custom_id": "lm-eval", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": [ids], "echo": True, "logprobs": 2, "max_tokens": 0}}
    pooled = [{"custom_id": f"c-{k}", "method": "POST", "url": "/v1/classify",
               "body": {"model": "support", "input": texts}} for k, texts in enumerate([TICKETS[:3], "refund", [""]])]
    lines = good[:3] + bad[:2] + good[3:6] + [scored, pooled[0]] + bad[2:] + pooled[1:] + good[6:]
    src, out = tmp_path / "requests.jsonl", tmp_path / "answers.jsonl"
    write_lines(src, lines)
    task_file = tmp_path / "support.toml"
    task_file.write_text('labels = ["billing", "technical", "account"]\nuser_template = "Ticket: {text}"\n')
    result = invoke("batch", src, "-o", out, "--model", llama_dir, "--served-model-name", MODEL, "--window", "4", "--quiet",
                    "--task", f"support={task_file}")
    answered = len(good) + 1 + len(pooled)
    assert f"lines: {len(lines)} ({answered} answered, {len(bad)} refused)" in result.output
    assert f"(id {MODEL})" in result.output
    offline = Classifier(read_task(task_file), model=llama_loaded)
    got = answers(out)
    assert len(got) == len(lines)
    context = context_limit(llama_loaded.model.config)
    for k, (line, answer) in enumerate(zip(lines, got)):
        if isinstance(line, dict) and line in good:
            assert answer["custom_id"] == line["custom_id"] and answer["error"] is None
            assert answer["response"]["status_code"] == 200
            body = answer["response"]["body"]
            prompt = choice_prompt(llama_loaded.tokenizer, line["body"]["messages"], tuple(CHOICES), context)
            want = reference_scores(llama_loaded.model, list(prompt.prompt_ids), prompt.trie).double().numpy()
            top = {e["token"]: e["logprob"] for e in body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}
            assert np.allclose([top[c] for c in CHOICES], want, atol=1e-4)
            assert body["choices"][0]["message"]["content"] == CHOICES[int(np.argmax(want))]
        elif line in pooled:  # the task's results, as offline classify gives them
            texts = line["body"]["input"]
            want = offline.classify([texts] if isinstance(texts, str) else texts)
            data = answer["response"]["body"]["data"]
            assert [d["label"] for d in data] == [w.label for w in want]
            for d, w in zip(data, want):
                assert np.allclose(d["probs"], [w.probabilities[lab] for lab in offline.task.labels], atol=1e-4) \
                    if w.probabilities else d["probs"] == []
        elif line is scored:  # every prompt token's log-probability, as the forward gives it
            with torch.inference_mode():
                want = torch.log_softmax(llama_loaded.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            lps = answer["response"]["body"]["choices"][0]["logprobs"]["token_logprobs"]
            assert lps[0] is None
            assert np.allclose(lps[1:], want[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy(), atol=1e-4)
        else:
            assert answer["response"] is None
            assert answer["error"]["message"].startswith(f"line {k + 1}: "), answer
    messages = [a["error"]["message"] for a in got if a["error"]]
    assert "not a JSON object" in messages[0] and "not a JSON object" in messages[1]
    assert "url '/v1/embeddings'" in messages[2] and "free-text generation" in messages[3]
    assert "custom_id must be a string" in messages[4]
    assert "the model 'smollm2-135m-instruct' does not exist; GET /v1/models lists 'tiny', 'support'" in messages[5]
    assert len({a["id"] for a in got}) == len(got)


def test_interrupted_and_resumed_equals_one_run(tmp_path, llama_dir, monkeypatch):
    lines = [chat_line(k, t) for k, t in enumerate(TICKETS * 2)]
    src, whole, cut = tmp_path / "requests.jsonl", tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    write_lines(src, lines)
    clock = iter([1_000_000, 1_000_000, 3_000_000, 4_000_000])  # the runs' starts: a resumed run keeps its first's
    monkeypatch.setattr(batch_module, "_now", lambda: next(clock))
    args = ["--model", str(llama_dir), "--served-model-name", MODEL, "--window", "4", "--quiet"]
    invoke("batch", src, "-o", whole, *args)

    original, calls = batch_module._Answerer.window, []

    def interrupted(self, start, window):
        calls.append(start)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return original(self, start, window)

    with monkeypatch.context() as m:
        m.setattr(batch_module._Answerer, "window", interrupted)
        result = CliRunner().invoke(cli, ["batch", str(src), "-o", str(cut), *args])
    assert isinstance(result.exception, Interrupted) and "8 rows done" in str(result.exception)
    assert not cut.exists() and len((tmp_path / "cut.jsonl.partial").read_text().splitlines()) == 8
    refused = CliRunner().invoke(cli, ["batch", str(src), "-o", str(cut), *args])
    assert "pass --resume to continue it" in str(refused.exception)
    result = invoke("batch", src, "-o", cut, *args, "--resume")
    assert "resumed at line 9" in result.output
    assert cut.read_bytes() == whole.read_bytes()


def test_a_changed_input_is_not_resumed(tmp_path, llama_dir, monkeypatch):
    lines = [chat_line(k, t) for k, t in enumerate(TICKETS)]
    src, out = tmp_path / "requests.jsonl", tmp_path / "out.jsonl"
    write_lines(src, lines)
    original = batch_module._Answerer.window

    def interrupted(self, start, window):
        if start > 0:
            raise KeyboardInterrupt
        return original(self, start, window)

    with monkeypatch.context() as m:
        m.setattr(batch_module._Answerer, "window", interrupted)
        CliRunner().invoke(cli, ["batch", str(src), "-o", str(out), "--model", str(llama_dir), "--served-model-name", MODEL, "--window", "4"])
    write_lines(src, [chat_line(0, "something else")] + lines[1:])
    result = CliRunner().invoke(cli, ["batch", str(src), "-o", str(out), "--model", str(llama_dir), "--served-model-name", MODEL, "--window", "4",
                                      "--resume"])
    assert "cannot resume" in str(result.exception) and "input file changed" in str(result.exception)


@pytest.mark.parametrize("args, words", [(["--resume", "--restart"], "--resume and --restart exclude each other"),
                                         (["--prefix-cache-mb", "-1"], "--prefix-cache-mb must be >= 0")])
def test_bad_options_are_refused_before_the_model_loads(tmp_path, args, words):
    src = tmp_path / "requests.jsonl"
    write_lines(src, [chat_line(0, "hi")])
    result = CliRunner().invoke(cli, ["batch", str(src), "-o", str(tmp_path / "o.jsonl"), *args])
    assert words in str(result.exception), result.output


def test_a_line_with_a_lone_surrogate_fails_alone(tmp_path, llama_dir):
    """Before: a chat message or a completions prompt holding a lone surrogate (valid JSON) stopped the
    whole file with `TypeError: TextEncodeInput must be ...`, 0 answers written. Now that line is its
    error, naming the field, and every other line its answer."""
    lines = [chat_line(0, TICKETS[0]), chat_line(1, "hi \ud800 there"), chat_line(2, TICKETS[1]),
             {"custom_id": "p", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "prompt": ["ok", "\ud800"], "echo": True, "logprobs": 1, "max_tokens": 0}},
             chat_line(4, TICKETS[2])]
    src, out = tmp_path / "requests.jsonl", tmp_path / "answers.jsonl"
    write_lines(src, lines)
    result = invoke("batch", src, "-o", out, "--model", llama_dir, "--served-model-name", MODEL, "--quiet")
    assert "lines: 5 (3 answered, 2 refused)" in result.output
    got = answers(out)
    assert [a["custom_id"] for a in got] == ["req-0", "req-1", "req-2", "p", "req-4"]
    assert [a["error"] is None for a in got] == [True, False, True, False, True]
    assert "body.messages[1].content is not valid Unicode (it holds a lone surrogate)" in got[1]["error"]["message"]
    assert "body.prompt[1] is not valid Unicode" in got[3]["error"]["message"]


def test_hostile_lines_fail_alone_among_good_ones(tmp_path, llama_dir, monkeypatch):
    """Before: a `/v1/classify` body whose `model` is a list or an object stopped the whole file
    (`TypeError: unhashable type`), 0 answers written. Now every per-line error, and any error the
    checks did not foresee (planted here), is that line's error object; every other line its answer."""
    import slmclassify.jobs.batch as job

    real = job.chat_prompt

    def planted(body, *args):
        if body["messages"][-1]["content"] == "plant a bug":
            raise TypeError("a bug the checks did not foresee")
        return real(body, *args)

    monkeypatch.setattr(job, "chat_prompt", planted)
    pooled = {"custom_id": "c", "method": "POST", "url": "/v1/classify", "body": {"model": "support", "input": "refund"}}
    hostile = [{**pooled, "custom_id": "list", "body": {"model": ["support"], "input": "refund"}},
               {**pooled, "custom_id": "object", "body": {"model": {"name": "support"}, "input": "refund"}},
               {**pooled, "custom_id": "number", "body": {"model": 3, "input": ["refund"]}},
               {**pooled, "custom_id": "input", "body": {"model": "support", "input": {"text": "refund"}}},
               {**chat_line(9, "x"), "custom_id": "messages", "body": {"model": MODEL, "messages": "hi",
                                                                        "structured_outputs": {"choice": CHOICES}}},
               {**chat_line(9, "x"), "custom_id": 7},
               chat_line(10, "plant a bug")]
    good = [chat_line(0, TICKETS[0]), pooled, chat_line(1, TICKETS[1])]
    lines = [good[0], *hostile[:3], good[1], *hostile[3:], good[2]]
    src, out = tmp_path / "requests.jsonl", tmp_path / "answers.jsonl"
    write_lines(src, lines)
    task_file = tmp_path / "support.toml"
    task_file.write_text('labels = ["billing", "technical", "account"]\nuser_template = "Ticket: {text}"\n')
    result = invoke("batch", src, "-o", out, "--model", llama_dir, "--served-model-name", MODEL, "--quiet", "--task", f"support={task_file}")
    assert f"lines: {len(lines)} (3 answered, {len(hostile)} refused)" in result.output
    got = answers(out)
    assert [a["custom_id"] for a in got] == [line["custom_id"] if isinstance(line["custom_id"], str) else None
                                             for line in lines]
    errors = {a["custom_id"]: a["error"] for a in got}
    assert [a["error"] is None for a in got] == [line in good for line in lines]
    assert "model must be a string, the task's name (got list)" in errors["list"]["message"]
    assert "(got dict)" in errors["object"]["message"] and "(got int)" in errors["number"]["message"]
    assert "input must be a string or a non-empty list of strings" in errors["input"]["message"]
    assert errors["req-10"]["code"] == "server_error"
    assert "TypeError: a bug the checks did not foresee" in errors["req-10"]["message"]
