"""Task validation, task files, prompt rendering and label tokenisation checks."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import slmclassify
from slmclassify import Classifier, Task, TaskError
from slmclassify.core.labels import resolve_mode
from slmclassify.core.prompts import PromptRenderer
from slmclassify.core.task import DEFAULT_INSTRUCTION, Example, parse_labels
from slmclassify.io.task_files import write_task_settings
from slmclassify.jobs.sources import build_task, read_task


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(labels=("a",)), "at least two labels"),
        (dict(labels=("a", "a")), "listed twice"),
        (dict(labels=("a", " ")), "empty"),
        (dict(labels=("a", "b "),), "whitespace"),
        (dict(labels=("a", "b"), user_template="no placeholder"), "^user_template must name the item once"),
        # Before: these passed, the braces reached the model as text and the column was never read.
        (dict(labels=("a", "b"), user_template="{subject.__class__}"),
         r"^user_template has a malformed placeholder '\{subject.__class__\}' at character 1 \(a field is named"),
        (dict(labels=("a", "b"), user_template="Item {0}"), r"malformed placeholder '\{0\}' at character 6"),
        (dict(labels=("a", "b"), user_template="Subject: {subject"), r"'\{subject' at character 10 \(it is never closed\)"),
        (dict(labels=("a", "b"), user_template="{text} }"), r"'\}' at character 8 \(a lone \}\)"),
        (dict(labels=("a", "b"), min_confidence=1.5), "^min_confidence must be between 0 and 1"),
        (dict(labels=("a", "b"), mode="best"), "^mode must be one of"),
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
    task = read_task(path)
    assert task.labels == ("billing", "technical")
    assert task.descriptions == ("money", "")
    assert task.examples == (Example("charged twice", "billing"),)
    assert task.min_confidence == 0.7
    assert "- billing: money" in task.system_turn() and "- technical" in task.system_turn()


def test_task_file_rejects_unknown_keys(tmp_path):
    path = tmp_path / "task.toml"
    path.write_text('labels = ["a", "b"]\nlabel_column = "x"\n')
    with pytest.raises(TaskError, match="label_column"):
        read_task(path)


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
    import slmclassify.core.scoring as scoring_module

    monkeypatch.setattr(scoring_module, "label_sequences", lambda tok, tail, labels: [(5,), (5,)])
    with pytest.raises(TaskError, match="tokenise identically"):
        Classifier(Task(labels=("x", "y")), model=tiny_loaded)


@pytest.mark.parametrize("name,value", [("labels", "abc"), ("labels", b"ab"), ("labels", {"a", "b"}),
                                        ("descriptions", "ab")])
def test_task_rejects_a_string_for_a_list(name, value):
    """Regression: Task(labels="abc") silently made the labels a, b, c."""
    kwargs = {"labels": ("a", "b"), name: value}
    with pytest.raises(TaskError, match=rf"^{name} must be a list or tuple of "):
        Task(**kwargs)


@pytest.mark.parametrize("spec,labels", [
    ("a,b,c", ("a", "b", "c")),
    ("a, b,", ("a", "b")),
    ('"x,y",z', ("x,y", "z")),
    ('a, "x,y"', ("a", "x,y")),
    ('"say ""hi""",b', ('say "hi"', "b")),
])
def test_parse_labels_reads_one_csv_line(spec, labels):
    assert parse_labels(spec) == labels


def test_parse_labels_refuses_broken_quoting():
    with pytest.raises(TaskError, match=r"--labels '\"x,y' is not valid CSV .*quote a name that contains a comma"):
        parse_labels('"x,y')


def test_build_task_takes_tuples_and_lets_values_win(tmp_path):
    assert build_task(None, ("yes, definitely", "no")).labels == ("yes, definitely", "no")
    with pytest.raises(TaskError, match="give the labels with labels a,b,c or a task_file file"):
        build_task(None, None)
    path = tmp_path / "task.toml"
    path.write_text('instruction = "Route."\nmode = "full"\n[[labels]]\nname = "a"\ndescription = "d"\n'
                    '[[labels]]\nname = "b"\n')
    task = build_task(path, None, min_confidence=0.7, calibrate=False, default_instruction="unused")
    assert (task.labels, task.descriptions, task.instruction, task.mode, task.min_confidence, task.calibrate) == (
        ("a", "b"), ("d", ""), "Route.", "full", 0.7, False)
    task = build_task(path, ("x", "y"), instruction="Mine.")
    assert (task.labels, task.descriptions, task.instruction) == (("x", "y"), (), "Mine.")
    assert build_task(None, ("a", "b"), default_instruction="Is it?").instruction == "Is it?"
    assert build_task(None, ("a", "b")).instruction == DEFAULT_INSTRUCTION


def test_library_errors_name_fields_and_the_cli_names_flags():
    """Library errors name the field (`window`), not the flag that sets it on the command line
    (`--window`): the CLI maps one to the other, so a library user reads the names they passed."""
    from slmclassify.cli.options import flag_of
    from slmclassify.core.settings import EngineSettings
    from slmclassify.errors import FieldError

    with pytest.raises(FieldError, match=r"^window must be positive, got 0$") as raised:
        EngineSettings(window=0)
    assert raised.value.field == "window" and isinstance(raised.value, TaskError)
    assert raised.value.naming(flag_of) == "--window must be positive, got 0"
    with pytest.raises(FieldError) as raised:
        EngineSettings(max_text_tokens=0)
    assert raised.value.naming(flag_of) == "--max-tokens must be positive, got 0"
    with pytest.raises(FieldError) as raised:  # a value with braces is shown as given, not formatted
        Task(labels=("a", "b"), user_template="{text} {text} {{0}}")
    assert str(raised.value) == ("user_template must name the item once: '{text}' exactly once, or each field once "
                                 "(e.g. 'Subject: {subject}\\n\\n{body}'), got '{text} {text} {{0}}'")
    import pickle

    back = pickle.loads(pickle.dumps(raised.value))  # as Ray sends it: the message, a TaskError
    assert isinstance(back, TaskError) and str(back) == str(raised.value)


def test_library_never_imports_the_cli():
    """Regression: evaluation_run imported cli.build_task (an import cycle library <-> CLI)."""
    package = Path(slmclassify.__file__).parent
    offenders = [str(p.relative_to(package)) for p in sorted(package.rglob("*.py")) if p.name != "cli.py"
                 and re.search(r"^\s*(from \.+cli import|from slmclassify\.cli|import slmclassify\.cli|from \. import cli)",
                               p.read_text(encoding="utf-8"), re.MULTILINE)]
    assert offenders == []


def test_write_task_settings_keeps_comments_and_layout(tmp_path):
    path = tmp_path / "task.toml"
    path.write_text(
        '# the demo task\n'
        'instruction = "min_confidence = 0.1 is not a key here"\n'
        'min_confidence = 0.5  # written by evaluate\n'
        '\n'
        '[[labels]]\n'
        'name = "a"\n'
        '[[labels]]\n'
        'name = "b"\n')
    write_task_settings(str(path), min_confidence=0.7, temperature=1.25)
    assert path.read_text() == (
        '# the demo task\n'
        'instruction = "min_confidence = 0.1 is not a key here"\n'
        'min_confidence = 0.7  # written by evaluate\n'
        'temperature = 1.25\n'
        '\n'
        '[[labels]]\n'
        'name = "a"\n'
        '[[labels]]\n'
        'name = "b"\n')
    task = read_task(path)
    assert (task.min_confidence, task.temperature, task.labels) == (0.7, 1.25, ("a", "b"))


def test_user_folders_come_from_platformdirs(tmp_path, monkeypatch):
    import platformdirs

    from slmclassify.cache import cache_root
    from slmclassify.io.saved_settings import settings_path

    monkeypatch.setattr(platformdirs, "user_config_path", lambda app, appauthor=None: tmp_path / "cfg" / app)
    monkeypatch.setattr(platformdirs, "user_cache_path", lambda app, appauthor=None: tmp_path / "cache" / app)
    assert settings_path() == tmp_path / "cfg" / "slmclassify" / "settings.toml"
    assert cache_root() == tmp_path / "cache" / "slmclassify"


def test_user_folders_follow_xdg_on_linux(tmp_path, monkeypatch):
    from slmclassify.cache import cache_root
    from slmclassify.io.saved_settings import settings_path

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "c"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "k"))
    assert settings_path() == tmp_path / "c" / "slmclassify" / "settings.toml"
    assert cache_root() == tmp_path / "k" / "slmclassify"


def test_python_version_declared_is_the_one_the_code_needs():
    """The code imports tomllib (Python 3.11+): pyproject and README must say 3.11."""
    root = Path(__file__).parents[1]
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    assert pyproject["project"]["requires-python"] == ">=3.11"
    assert "Python ≥ 3.11" in (root / "README.md").read_text()


@pytest.mark.parametrize("template,word", [
    ("{% for m in messages %}{% if m['role'] != 'user' %}{{ m['content'] }}{% endif %}{% endfor %}", "drops"),
    ("{% for m in messages %}{{ m['content'] }}{{ m['content'] }}{% endfor %}", "repeats (2 times)"),
])
def test_chat_template_that_drops_or_repeats_the_item_is_a_task_error(tiny_tokenizer, template, word):
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = template
    with pytest.raises(TaskError, match=re.escape(f"the model's chat template {word} the item text")):
        PromptRenderer(tok, Task(labels=("a", "b")))


def test_prompt_longer_than_the_context_is_a_task_error(tiny_loaded):
    """Regression: a ValueError escaped when the template alone exceeded the model's context (256 here)."""
    task = Task(labels=("billing", "technical"), instruction="refund " * 300, calibrate=False)
    clf = Classifier(task, model=tiny_loaded)
    with pytest.raises(TaskError, match=r"^the prompt without the item text is \d+ tokens, over the \d+ the "
                                        r"model's context leaves for it: shorten the instruction"):
        clf.classify(["hello"])


def test_doubled_braces_are_literal_braces():
    """`{{` and `}}` write a brace (before: `{{literal}}` read a field named literal); the one parser
    serves the fields, the composed item and the one-text user turn."""
    task = Task(labels=("a", "b"), user_template='JSON {{"id": 7}}: {text} }}')
    assert task.fields == ("text",) and not task.multi_field
    assert task.user_turn("the {body} of it") == 'JSON {"id": 7}: the {body} of it }'
    multi = Task(labels=("a", "b"), user_template="{{{subject}}}\n{body}")
    assert multi.fields == ("subject", "body")
    assert multi.compose({"subject": "Refund", "body": "{subject} stays"}) == "{Refund}\n{subject} stays"
