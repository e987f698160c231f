"""`fit --echo`: a head's pass reads each text twice (the text, a newline, the text again). The
features are still the fast path's states, equal to the Hugging Face forward's on the echoed prompt;
the head records it, so `classify --head` and `evaluate --head` read the texts as it was fitted;
what would mix the echoed prompt's label scores with the task's zero-shot ones is refused or left out."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from slmclassify import Classifier, EngineSettings, Task
from slmclassify.core.taps import Taps, echoed
from slmclassify.errors import FieldError
from slmclassify.head import Head
from slmclassify.jobs.fit import FitRequest, fit_file

from helpers import labelled, random_texts


def test_echoed_text_is_the_text_twice_and_a_blank_one_stays_blank():
    assert echoed("card lost") == "card lost\ncard lost"
    assert echoed("") == "" and echoed("  ") == "  "
    assert Taps(mean=(2,), echo=True).describe() == "2 (mean), each text read twice (echo)"


@pytest.mark.isa  # the engine's states: its kernels
def test_echoed_states_equal_reference_hidden_states_of_the_echoed_prompt(tiny_loaded):
    """The pass with echoed taps runs the prompt of the echoed text (its ids are those of the task's
    prompt around `echoed(text)`), and every tapped state equals the HF forward's on that whole prompt,
    the mean over both copies and what follows them; an empty text stays empty (one row, no scores)."""
    task = Task(labels=("billing", "technical", "account"), instruction="Sort the ticket.")
    clf = Classifier(task, model=tiny_loaded, settings=EngineSettings(token_budget=120, max_rows=3))
    n_layers = tiny_loaded.model.config.num_hidden_layers
    taps = Taps(last=(n_layers,), mean=tuple(range(1, n_layers)), echo=True)
    texts = random_texts(6, seed=2, max_words=20) + [""]
    encoded = clf.encode(texts, taps)
    plain = clf.encode([echoed(t) for t in texts])
    assert [list(encoded.ids[i]) for i in range(len(texts))] == [list(plain.ids[i]) for i in range(len(texts))]
    assert encoded.status[-1] == "empty" and list(encoded.ids[len(texts) - 1]) == []
    scored = clf.score(encoded, taps=taps)
    assert np.isnan(scored.states[-1]).all() and not np.isnan(scored.states[:-1]).any()
    start = clf.scorer.pool_from
    for i in range(len(texts) - 1):
        ids = encoded.ids[i]
        with torch.inference_mode():
            out = tiny_loaded.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        ref = torch.stack([out.hidden_states[t][0, -1] for t in taps.last]
                          + [out.hidden_states[t][0, start:].mean(0) for t in taps.mean]).numpy()
        diff = np.abs(scored.states[i].reshape(len(taps), -1) - ref).max()
        assert diff <= 1e-4, f"item {i}: max |Δ| {diff}"


def test_echo_cap_counts_each_copy(tiny_loaded):
    """--max-tokens caps the text: echoed, a text within the cap is whole in both copies (not
    'truncated'), and a text over it is truncated as it would be read once."""
    task = Task(labels=("billing", "technical"))
    short, long = "refund please", " ".join(["invoice"] * 40)
    clf = Classifier(task, model=tiny_loaded, settings=EngineSettings(max_text_tokens=8))
    taps = Taps(mean=(1,), echo=True)
    assert clf.encode([short, long]).status == ["ok", "truncated"]
    assert clf.encode([short, long], taps).status == ["ok", "truncated"]


def test_fit_echo_writes_a_head_that_classify_and_evaluate_read_twice(tmp_path, llama_dir, llama_loaded, run_main):
    texts, gold = labelled(8)
    train = tmp_path / "train.csv"
    pd.DataFrame({"text": texts, "gold": gold}).to_csv(train, index=False)
    head_path = tmp_path / "head.npz"
    code, out, err = run_main("fit", str(train), "--gold-column", "gold", "--labels", "money,broken app", "--echo",
                              "--model", str(llama_dir), "-o", str(head_path), "--folds", "3", "--curve", "2")
    assert code == 0, err
    assert "each text read twice (echo)" in out
    assert "zero-shot: not shown (the pass read each text twice, --echo" in out
    assert not any(line.startswith("zero-shot ") and line.split()[1][0].isdigit() for line in out.splitlines())
    head = Head.load(head_path)
    assert head.taps.echo and head.info["zero_shot"] is None

    test_texts, test_gold = labelled(4, seed=5)
    inp = tmp_path / "in.csv"
    pd.DataFrame({"text": test_texts + [""], "gold": test_gold + ["money"]}).to_csv(inp, index=False)
    code, _, err = run_main("classify", str(inp), "-o", str(tmp_path / "out.csv"), "--head", str(head_path),
                            "--labels", "money,broken app", "--model", str(llama_dir), "--quiet")
    assert code == 0, err
    frame = pd.read_csv(tmp_path / "out.csv", keep_default_na=False)
    assert len(frame) == 9 and frame["status"].tolist() == ["ok"] * 8 + ["empty"]
    # classify read the texts twice: its probabilities are the head's on the echoed pass's states, not
    # on the states of the texts read once
    clf = Classifier(Task(labels=("money", "broken app")), model=llama_loaded)
    echoed_states = clf.score(clf.encode(test_texts, head.taps), taps=head.taps).states
    once_states = clf.score(clf.encode(test_texts), taps=head.taps).states
    expected = np.exp(head.log_probabilities(head.features(echoed_states, None)))
    got = frame[[f"p_{lab}" for lab in head.labels]].iloc[:8].astype(float).to_numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert not np.allclose(expected, np.exp(head.log_probabilities(head.features(once_states, None))), atol=1e-6)

    code, _, err = run_main("classify", str(inp), "-o", str(tmp_path / "c.csv"), "--head", str(head_path),
                            "--labels", "money,broken app", "--scorer", "combined", "--model", str(llama_dir))
    assert code == 2 and "--scorer combined multiplies the head's probabilities by zero-shot's, and this head reads " \
                         "each text twice (echo), a prompt whose label scores are not the task's; use --scorer head, " \
                         "or refit the head with `slmclassify fit --no-echo`" in err
    code, out, err = run_main("evaluate", str(inp), "--gold-column", "gold", "--head", str(head_path),
                              "--labels", "money,broken app", "--model", str(llama_dir))
    assert code == 0, err
    assert "each text read twice (echo)" in out and "zero-shot on the same items" not in out


def test_fit_echo_refuses_what_it_cannot_serve_before_reading_a_model(tmp_path):
    texts, gold = labelled(3)
    data = tmp_path / "gold.csv"
    pd.DataFrame({"text": texts, "label": [f"{g};money" for g in gold]}).to_csv(data, index=False)
    with pytest.raises(FieldError, match="echo does not apply to a head from the descriptions"):
        FitRequest(input_path=str(data), output_path=str(tmp_path / "h.npz"), from_descriptions=True, echo=True)
    request = FitRequest(input_path=str(data), output_path=str(tmp_path / "h.npz"), echo=True)
    with pytest.raises(FieldError, match="echo is for a task of one label per item"):
        fit_file(request, Task(labels=("money", "broken app"), multi_label=True), EngineSettings(), model="never-read")
    questions = Task.from_dict({"questions": [{"name": "team", "labels": ["money", "broken app"]},
                                              {"name": "tone", "labels": ["calm", "angry"]}]})
    request = FitRequest(input_path=str(data), output_path=str(tmp_path / "h.npz"), echo=True,
                         gold_columns=(("team", "label"),))
    with pytest.raises(FieldError, match="echo is for a task of one question"):
        fit_file(request, questions, EngineSettings(), model="never-read")


def test_fit_reads_the_texts_once_and_twice_unless_told(tmp_path, llama_loaded):
    """By default `fit` reads both passes and cross-validation chooses among their sets (the head
    keeps whether it reads the texts twice); zero-shot is the once-read pass's. --no-echo, --layers
    and --scores read once; --echo twice only."""
    from slmclassify.core.taps import Taps as T

    texts, gold = labelled(8)
    path = tmp_path / "train.csv"
    pd.DataFrame({"text": texts, "gold": gold}).to_csv(path, index=False)
    task = Task(labels=("money", "broken app"))

    def run(**kw):
        request = FitRequest(str(path), str(tmp_path / "h.npz"), label_column="gold", curve_sizes=(), folds=3, **kw)
        return fit_file(request, task, EngineSettings(), model=llama_loaded)

    both = run()
    assert both.passes == 2 and "mean (echo)" in both.choice and both.zero_shot_comparable
    assert [r.name for r in both.rows][0] == "zero-shot"
    assert Head.load(tmp_path / "h.npz").taps == both.head.taps  # echo or not, as chosen
    once = run(echo=False)
    assert once.passes == 1 and "(echo)" not in once.choice and not once.head.taps.echo
    # the zero-shot row is the same pass's either way
    assert once.rows[0] == both.rows[0]
    assert run(use_scores=True).passes == 1 and not run(use_scores=True).head.taps.echo
    assert run(taps=T(mean=(1,))).passes == 1
    twice = run(echo=True)
    assert twice.passes == 1 and twice.head.taps.echo and not twice.zero_shot_comparable
