"""Task validation, task files, prompt rendering and label tokenisation checks."""

from __future__ import annotations

import pytest

from slmclassify import Classifier, Task, TaskError
from slmclassify.labels import resolve_mode
from slmclassify.prompts import PromptRenderer
from slmclassify.task import Example


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(labels=("a",)), "at least two labels"),
        (dict(labels=("a", "a")), "listed twice"),
        (dict(labels=("a", " ")), "empty"),
        (dict(labels=("a", "b "),), "whitespace"),
        (dict(labels=("a", "b"), user_template="no placeholder"), "--user-template"),
        (dict(labels=("a", "b"), min_confidence=1.5), "--min-confidence"),
        (dict(labels=("a", "b"), mode="best"), "--mode"),
        (dict(labels=("a", "b"), examples=(Example("x", "c"),)), "not in the label set"),
        (dict(labels=("a", "b"), descriptions=("one",)), "one per label"),
    ],
)
def test_invalid_tasks(kwargs, message):
    with pytest.raises(TaskError, match=message):
        Task(**kwargs)


def test_task_file(tmp_path):
    path = tmp_path / "task.toml"
    path.write_text(
        'instruction = "Route tickets."\nuser_template = "Ticket: {text}"\nmin_confidence = 0.7\n'
        '[[labels]]\nname = "billing"\ndescription = "money"\n'
        '[[labels]]\nname = "technical"\n'
        '[[examples]]\ntext = "charged twice"\nlabel = "billing"\n'
    )
    task = Task.from_toml(path)
    assert task.labels == ("billing", "technical")
    assert task.descriptions == ("money", "")
    assert task.examples == (Example("charged twice", "billing"),)
    assert task.min_confidence == 0.7
    assert "- billing: money" in task.system_turn() and "- technical" in task.system_turn()


def test_task_file_rejects_unknown_keys(tmp_path):
    path = tmp_path / "task.toml"
    path.write_text('labels = ["a", "b"]\nlabel_column = "x"\n')
    with pytest.raises(TaskError, match="label_column"):
        Task.from_toml(path)


def test_system_and_user_template_overrides(tiny_tokenizer):
    task = Task(labels=("billing", "technical", "account"),
                system="You classify support tickets. Answer with exactly one of: billing, technical, account.",
                user_template="Ticket: {text}\nCategory:")
    renderer = PromptRenderer(tiny_tokenizer, task)
    assert renderer.linear
    prompt = renderer.render("My card {was} charged")
    assert prompt == (
        "<|im_start|>system\nYou classify support tickets. Answer with exactly one of: billing, technical, account."
        "<|im_end|>\n<|im_start|>user\nTicket: My card {was} charged\nCategory:<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt == tiny_tokenizer.apply_chat_template(renderer.messages("My card {was} charged"),
                                                        tokenize=False, add_generation_prompt=True)


def test_examples_render_as_earlier_turns(tiny_tokenizer):
    task = Task(labels=("billing", "technical"), examples=(Example("charged twice", "billing"),))
    prompt = PromptRenderer(tiny_tokenizer, task).render("app crashed")
    assert "<|im_start|>user\ncharged twice<|im_end|>\n<|im_start|>assistant\nbilling<|im_end|>" in prompt
    assert prompt.index("charged twice") < prompt.index("app crashed")


def test_resolve_mode():
    labels = ("a", "b", "c")
    assert resolve_mode(labels, [(1,), (2,), (3,)], "auto", 99)[0] == "first"
    mode, seqs, reason = resolve_mode(labels, [(1, 5), (2,), (3,)], "auto", 99)
    assert (mode, seqs) == ("full", [(1, 5), (2,), (3,)]) and "several tokens" in reason
    mode, seqs, reason = resolve_mode(labels, [(1,), (1, 4), (3,)], "auto", 99)
    assert mode == "full" and seqs == [(1, 99), (1, 4, 99), (3, 99)] and "share first tokens: a, b" in reason
    with pytest.raises(TaskError, match="share their first token"):
        resolve_mode(labels, [(1,), (1, 4), (3,)], "first", 99)
    with pytest.raises(TaskError, match="tokenise identically"):
        resolve_mode(labels, [(1, 2), (1, 2), (3,)], "auto", 99)


def test_identical_label_tokens_rejected(tiny_loaded, monkeypatch):
    import slmclassify.classifier as classifier_module

    monkeypatch.setattr(classifier_module, "label_sequences", lambda tok, tail, labels: [(5,), (5,)])
    with pytest.raises(TaskError, match="tokenise identically"):
        Classifier(Task(labels=("x", "y")), model=tiny_loaded)
