"""`--precision auto` checks the user's own data: the sample is the input's first 200 distinct
non-empty texts (article tickets top up a smaller input, and stand in where there is no data), the
cached decision is keyed by that sample, every command that has data passes it, and a streamed run
still writes every row once and in order. Tiny random Llama; the decision's scoring is spied on,
never timed (the GEMM speed gate is replaced by a fixed candidate list)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from slmclassify import Classifier, EngineSettings, Task
from slmclassify.models import precision as prec
from slmclassify.backends.choice import CACHE_FILE
from slmclassify.cli.main import cli
from slmclassify.models.prepare import load_model
from slmclassify.core.article_tickets import article_tickets

from helpers import interrupt_after, make_input

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TASK = Task(labels=("billing", "technical", "account"), user_template="Ticket: {text}\nCategory:")
LABELS = "billing,technical,account"
WORDS = "card charged twice invoice app crash settings email profile refund login error password".split()


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def checked(monkeypatch):
    """The texts of each auto decision made (the real decision runs, with int8 as the only candidate,
    whatever this CPU's measured speeds)."""
    calls = []
    real = prec._decide

    def spy(loaded, scorer, texts, log=None):
        calls.append(list(texts))
        return real(loaded, scorer, texts, log)

    monkeypatch.setattr(prec, "_decide", spy)
    monkeypatch.setattr(prec, "candidates", lambda measured, device: ["int8"])
    return calls


@pytest.fixture
def int8_agrees(monkeypatch):
    """int8 counts as agreeing with fp32 on every item (the gate then picks it)."""
    real = prec.agreement
    monkeypatch.setattr(prec, "agreement", lambda low, fp32: real(fp32, fp32))


def _texts(n: int, seed: int = 0) -> list[str]:
    """n distinct tickets, marked as the user's."""
    rng = random.Random(seed)
    return [f"input {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for i in range(n)]


AUTO = EngineSettings(device="cpu", precision="auto")


@pytest.mark.isa  # the real decision: the int8 engine scores the sample (`checked`)
def test_the_sample_is_the_first_distinct_non_empty_texts_of_the_input(llama_dir, checked):
    own = _texts(300)
    texts = ["", "   ", None, own[0], own[0], own[1], "", own[0]] + own[2:]
    clf = Classifier(TASK, model=str(llama_dir), settings=AUTO, precision_sample=iter(texts))
    assert checked == [own[:200]]
    decision = clf.loaded.auto_decision
    assert decision["sample"] == "200 items of your input"
    assert decision["tried"]["int8"]["n"] == 200
    assert clf.engine.backend.precision == decision["precision"]


@pytest.mark.isa
def test_auto_keeps_fp32_when_the_input_disagrees_though_article_tickets_agree(llama_dir, checked, monkeypatch):
    """The defect: the check scored article tickets only, so a precision that agreed there was
    picked for data it disagreed on (bf16 on the demo tickets: 200/200 article tickets, 97.3% of
    the demo's own)."""
    real = prec.agreement

    def agreement(low, fp32):  # int8 agrees on the article's tickets, flips every prediction on the input
        return real(-low, fp32) if checked[-1][0].startswith("input") else real(fp32, fp32)

    monkeypatch.setattr(prec, "agreement", agreement)
    clf = Classifier(TASK, model=str(llama_dir), settings=AUTO, precision_sample=_texts(250))
    assert clf.loaded.auto_decision["precision"] == "fp32" == clf.engine.backend.precision
    assert clf.loaded.auto_decision["tried"]["int8"]["agree"] < prec.MIN_AGREEMENT * 200

    without = Classifier(TASK, model=str(llama_dir), settings=AUTO)  # no data: the article's tickets, where int8 agrees
    assert without.loaded.auto_decision["sample"] == "200 article tickets"
    assert without.loaded.auto_decision["precision"] == "int8" == without.engine.backend.precision


@pytest.mark.isa
def test_without_data_the_sample_is_200_distinct_article_tickets(llama_dir, checked):
    clf = Classifier(TASK, model=str(llama_dir), settings=AUTO)
    distinct = list(dict.fromkeys(article_tickets()))
    assert checked == [distinct[:200]]
    assert clf.loaded.auto_decision["sample"] == "200 article tickets"


@pytest.mark.isa
def test_a_small_input_is_topped_up_with_article_tickets_and_says_so(llama_dir, checked):
    own = _texts(5)
    clf = Classifier(TASK, model=str(llama_dir), settings=AUTO, precision_sample=own + own)
    assert len(checked[0]) == 200 and checked[0][:5] == own
    assert set(checked[0][5:]) <= set(article_tickets()) and len(set(checked[0])) == 200
    assert clf.loaded.auto_decision["sample"] == ("5 items of your input + 195 article tickets (your input has "
                                                  "fewer than 200 distinct non-empty texts)")


@pytest.mark.isa
def test_the_cached_decision_is_keyed_by_the_sample(llama_dir, checked, int8_agrees):
    first = Classifier(TASK, model=str(llama_dir), settings=AUTO, precision_sample=_texts(200, seed=1))
    assert len(checked) == 1 and first.loaded.auto_decision["cached"] is False
    assert first.engine.backend.precision == "int8"

    again = Classifier(TASK, model=str(llama_dir), settings=AUTO, precision_sample=_texts(200, seed=1))
    assert len(checked) == 1  # the same texts: not checked again
    assert again.loaded.auto_decision == {**first.loaded.auto_decision, "cached": True}
    assert again.engine.backend.precision == "int8"
    assert "decided earlier on the same sample (cached)" in prec.describe(again.loaded.auto_decision)

    Classifier(TASK, model=str(llama_dir), settings=AUTO, precision_sample=_texts(200, seed=2))  # a new file
    Classifier(TASK.with_overrides(instruction="Sort the ticket."), model=str(llama_dir), settings=AUTO,
               precision_sample=_texts(200, seed=1))  # another task
    assert checked[1:] == [_texts(200, seed=2), _texts(200, seed=1)]


@pytest.mark.isa
def test_a_decision_made_with_another_gate_or_kernels_is_made_again(llama_dir, checked, int8_agrees, monkeypatch):
    Classifier(TASK, model=str(llama_dir), settings=AUTO, precision_sample=_texts(200, seed=1))
    monkeypatch.setattr(prec, "MIN_AGREEMENT", 0.999)
    Classifier(TASK, model=str(llama_dir), settings=AUTO, precision_sample=_texts(200, seed=1))
    monkeypatch.setattr(prec, "CHECK_VERSION", prec.CHECK_VERSION + 1)
    Classifier(TASK, model=str(llama_dir), settings=AUTO, precision_sample=_texts(200, seed=1))
    assert len(checked) == 3


@pytest.mark.isa
def test_auto_is_decided_in_preparation_for_a_task_and_used_as_is(llama_dir, checked, int8_agrees, monkeypatch):
    """`load_model(..., task=, sample=)` makes the decision (what `Classifier(task, model=path)` calls);
    a Classifier given that LoadedModel checks nothing again and leaves it as it is. Without a task,
    auto on a CPU is refused before anything is read."""
    loaded = load_model(str(llama_dir), device="cpu", precision="auto", task=TASK, sample=_texts(200, seed=1))
    assert checked == [_texts(200, seed=1)]
    assert loaded.auto_decision["precision"] == "int8"
    assert loaded.engine.backend.precision == loaded.backend.precision == "int8"
    clf = Classifier(TASK, model=loaded, precision_sample=_texts(200, seed=2))
    assert clf.loaded is loaded and len(checked) == 1

    from slmclassify.errors import TaskError
    from slmclassify.models import loading

    monkeypatch.setattr(loading, "read_model", lambda source: pytest.fail("must refuse before reading"))
    with pytest.raises(TaskError, match="precision auto on a CPU is checked on the task"):
        load_model(str(llama_dir), device="cpu", precision="auto")


@pytest.mark.isa
def test_a_cached_decision_builds_one_engine(llama_dir, checked, int8_agrees, monkeypatch):
    """The decision made once is read back before any engine is built: only the decided precision's."""
    from slmclassify.models import engines

    Classifier(TASK, model=str(llama_dir), settings=AUTO, precision_sample=_texts(200, seed=1))
    built = []
    real = engines.with_backend
    monkeypatch.setattr(engines, "with_backend", lambda loaded, backend, *a, **kw: (
        built.append(backend.precision), real(loaded, backend, *a, **kw))[1])
    again = load_model(str(llama_dir), device="cpu", precision="auto", task=TASK, sample=_texts(200, seed=1))
    assert again.auto_decision["cached"] is True and built == ["int8"] and len(checked) == 1


@pytest.mark.isa
def test_serve_decides_auto_once_with_the_first_task(llama_dir, checked, int8_agrees):
    from slmclassify.serve.server import build_service
    from slmclassify.serve.settings import ServeSettings

    other = TASK.with_overrides(instruction="Sort the ticket.")
    service = build_service({"first": TASK, "second": other}, str(llama_dir), AUTO, ServeSettings())
    assert checked == [list(prec.verification_sample(None).texts)]  # one check: the first task's, on article tickets
    engines = {id(runner.classifier.engine) for runner in service.runners.values()}
    assert len(engines) == 1 and service.runners["second"].classifier.engine.backend.precision == "int8"


def test_input_sample_reads_only_as_far_as_it_needs():
    read = []

    def rows():
        for i in range(1000):
            read.append(i)
            yield "same" if i % 2 else f"text {i}"

    assert prec.input_sample(rows(), n=4) == ["text 0", "same", "text 2", "text 4"]
    assert read == [0, 1, 2, 3, 4]  # the repeat at row 3 is skipped; nothing after row 4 is read
    assert len(prec.input_sample(["x"] * (prec.SAMPLE_SCAN_ROWS + 5) + ["late"])) == 1  # the scan is bounded


# --------------------------------------------------------------------------- the classify job


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.reader(fh))


def _input_texts(path: Path) -> list[str]:
    return [row[1] for row in _rows(path)[1:]]


@pytest.mark.isa
def test_streamed_classify_samples_its_input_and_writes_every_row_in_order(run_main, tmp_path, llama_dir,
                                                                            checked, int8_agrees):
    src = make_input(tmp_path / "in.csv", 300, seed=3)  # ~250 distinct texts: the read-ahead stops mid-file
    auto, fixed = tmp_path / "auto.csv", tmp_path / "int8.csv"
    base = ["--labels", LABELS, "--model", llama_dir, "--window", "16", "--quiet"]
    code, _, err = run_main("classify", src, "-o", auto, "--precision", "auto", *base)
    assert code == 0, err
    assert checked == [prec.input_sample(_input_texts(src))]
    assert "precision auto: int8, checked on 200 items of your input: int8 200/200 agree with fp32" in err
    assert "engine: " in err and "; precision auto: int8, checked on 200 items of your input" in err
    out = _rows(auto)
    assert [row[:2] for row in out] == _rows(src)  # every row once, in order
    code, _, err = run_main("classify", src, "-o", fixed, "--precision", "int8", *base)
    assert code == 0, err
    assert auto.read_bytes() == fixed.read_bytes()  # the same results as the precision it picked


@pytest.mark.isa
def test_classify_from_stdin_samples_it_without_losing_rows(tmp_path, llama_dir, checked):
    src = make_input(tmp_path / "in.csv", 40, seed=4)
    result = CliRunner().invoke(cli, ["classify", "-", "-o", "-", "--format", "csv", "--labels", LABELS, "--model",
                                      str(llama_dir), "--window", "8", "--precision", "auto", "--quiet"],
                                input=src.read_bytes(), catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    own = prec.input_sample(_input_texts(src))
    assert len(own) < 200 and checked[0][:len(own)] == own
    assert f"{len(own)} items of your input + {200 - len(own)} article tickets" in result.stderr
    written = list(csv.reader(result.stdout.splitlines()))
    assert [row[:2] for row in written] == _rows(src)


@pytest.mark.isa
def test_resumed_auto_run_reuses_the_decision_and_is_byte_identical(run_main, monkeypatch, tmp_path, llama_dir,
                                                                   checked):
    src = make_input(tmp_path / "in.csv", 60, seed=5)
    args = ["--labels", LABELS, "--model", llama_dir, "--window", "8", "--quiet", "--precision", "auto"]
    whole, target = tmp_path / "whole.csv", tmp_path / "out.csv"
    code, _, err = run_main("classify", src, "-o", whole, *args)
    assert code == 0, err
    with monkeypatch.context() as m:
        interrupt_after(m, 2)
        code, _, err = run_main("classify", src, "-o", target, *args)
    assert code == 130, err
    code, _, err = run_main("classify", src, "-o", target, "--resume", *args)
    assert code == 0, err
    assert len(checked) == 1  # the resumed session sampled the same first rows: the cached decision
    assert "decided earlier on the same sample (cached)" in err
    assert target.read_bytes() == whole.read_bytes()


def test_resume_refuses_a_partial_written_in_another_precision(run_main, monkeypatch, tmp_path, llama_dir):
    """If the check decides otherwise on resuming (a cleared cache, a changed machine), the rows done
    and the rows to come would be in different precisions: refused, not mixed."""
    src = make_input(tmp_path / "in.csv", 40, seed=6)
    args = ["--labels", LABELS, "--model", llama_dir, "--window", "8", "--quiet", "--precision", "auto"]
    target = tmp_path / "out.csv"
    with monkeypatch.context() as m:
        m.setattr(prec, "_decide", lambda loaded, scorer, texts, log=None: ({"precision": "int8", "tried": {}}, loaded))
        interrupt_after(m, 2)
        code, _, err = run_main("classify", src, "-o", target, *args)
    assert code == 130, err
    cache = prec.cache_root() / CACHE_FILE
    kept = {k: v for k, v in json.loads(cache.read_text()).items() if not k.startswith("auto|")}
    cache.write_text(json.dumps(kept))
    monkeypatch.setattr(prec, "_decide", lambda loaded, scorer, texts, log=None: ({"precision": "fp32", "tried": {}}, loaded))
    code, _, err = run_main("classify", src, "-o", target, "--resume", *args)
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"slmclassify: error: cannot resume {target}: the precision changed (int8 → fp32) since {target}.partial "
        "was started; run with the same input and options, or pass --restart to start over")


# --------------------------------------------------------------------------- the other commands


@pytest.fixture
def labelled(tmp_path) -> tuple[Path, list[str]]:
    texts = _texts(30, seed=7)
    path = tmp_path / "labelled.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        for i, text in enumerate(texts):
            writer.writerow([text, LABELS.split(",")[i % 3]])
    return path, texts


@pytest.mark.parametrize("command", ["verify", "evaluate", "bench", "sweep", "fit"])
def test_every_command_with_data_checks_it(run_main, monkeypatch, tmp_path, llama_dir, labelled, command):
    calls = []
    monkeypatch.setattr(prec, "_decide", lambda loaded, scorer, texts, log=None: calls.append(list(texts))
                        or ({"precision": "fp32", "tried": {}}, loaded))
    path, texts = labelled
    common = ["--labels", LABELS, "--model", llama_dir, "--precision", "auto"]
    args = {
        "verify": ["verify", path, "--n", "2"],
        "evaluate": ["evaluate", path],
        "bench": ["bench", "--input", path, "--n", "30", "--no-llama-cpp"],
        "sweep": ["sweep", path, "--n", "30", "--budgets", "256", "--row-caps", "8", "--windows", "",
                  "--plot", tmp_path / "sweep.png"],
        "fit": ["fit", path, "-o", tmp_path / "head.npz", "--folds", "2", "--curve", "2"],
    }[command]
    code, out, err = run_main(*args, *common)
    assert code == 0, err
    assert len(calls) == 1 and calls[0][:30] == texts
    assert "precision auto: fp32 (no low precision runs faster than float32 here)" in out + err


def test_ray_driver_samples_the_files_in_order_and_actors_check_it(tmp_path, llama_dir, monkeypatch):
    pytest.importorskip("ray")
    from slmclassify import EngineSettings
    from slmclassify.ray.actors import ClassifierActor
    from slmclassify.jobs.ray_classify import first_texts

    own = _texts(150, seed=8) + _texts(150, seed=9)
    for part, texts in (("a", own[:150]), ("b", own[150:])):
        with open(tmp_path / f"{part}.csv", "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([["text"], *([t] for t in texts)])
    sample = first_texts([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")], "text")
    assert sample == prec.input_sample(own) and len(sample) == 200 and sample[150:] == own[150:200]

    calls = []
    monkeypatch.setattr(prec, "_decide", lambda loaded, scorer, texts, log=None: calls.append(list(texts))
                        or ({"precision": "fp32", "tried": {}}, loaded))
    registered = []

    class Board:  # stands in for the run's RunBoard actor: only `register` is called while building
        class register:
            remote = staticmethod(lambda key, info: registered.append(key))

    ClassifierActor(TASK, str(llama_dir), EngineSettings(precision="auto"), "text", "", threads=1,
                    board=Board(), precision_sample=sample)
    assert len(registered) == 1
    assert calls == [sample]
