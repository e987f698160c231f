"""The article workload generator and the bench/sweep commands (schema only: no timing asserts)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from slmclassify.bench.article import article_batched
from slmclassify.bench.compare import E_ROUNDS, non_embedding_params, roofline, run_bench, vendor_kernel
from slmclassify.cli.main import cli
from slmclassify.core.article_tickets import ARTICLE_TASK, BASE_TICKETS, FILLER, article_tickets

try:
    import ctranslate2  # noqa: F401  (the optional (i) rows: `pip install 'slmclassify[ctranslate2]'`)

    CT2 = True
except ImportError:
    CT2 = False


def test_workload_is_the_articles():
    tickets = article_tickets(600)
    assert tickets == article_tickets(600)  # deterministic
    assert len(tickets) == 600 and len(set(tickets)) == 335  # the same base + length repeats
    words = [len(t.split()) for t in tickets]
    assert min(words) == 12 and max(words) == 400
    assert all(t.startswith(BASE_TICKETS[i % 3].rstrip(".")) for i, t in enumerate(tickets))
    assert article_tickets(150) == tickets[:150]
    long_one = tickets[int(np.argmax(words))]
    assert FILLER[0] in long_one.split()
    # the first draws of lognormal(log 60, 0.9) with seed 0, as the article generates them
    expected = np.clip(np.random.default_rng(0).lognormal(np.log(60), 0.9, size=600), 12, 400).astype(int)
    assert words == expected.tolist()


@pytest.mark.e2e
def test_workload_prompt_lengths_with_our_tokenizer():
    """The article reports 48 / 94 / 449 min / median / max prompt tokens with Qwen's tokenizer;
    SmolLM2's tokenizer (the embedded model) gives 50 / 96 / 451 for the same prompts. The prompts are
    encoded by the scorer a Classifier builds (`Classifier.encode` is `scorer.encode`), without the
    Classifier's model work (schedule measurement, prefix prefill, content-free prior: ~90% of the time)."""
    from slmclassify import EngineSettings, load_model
    from slmclassify.core.scoring import Scorer

    loaded = load_model()
    scorer = Scorer.build(ARTICLE_TASK, loaded.tokenizer, loaded.model.config, EngineSettings(max_text_tokens=None))
    lengths = [len(ids) for ids in scorer.encode(article_tickets(600)).ids]  # uncut
    assert (min(lengths), int(np.median(lengths)), max(lengths)) == (50, 96, 451)


def short_tickets(n: int) -> list[str]:
    """Article tickets that fit the tiny model's 256-position context untruncated."""
    return [t for t in article_tickets(600) if len(t.split()) <= 30][:n]


def test_bench_report_schema(llama_loaded):
    from slmclassify.backends.device import cpu_native

    side = llama_loaded.tokenizer.padding_side
    report = run_bench(llama_loaded, short_tickets(12), ARTICLE_TASK, log=lambda m: None)
    assert llama_loaded.tokenizer.padding_side == side  # the shared tokenizer is left as it was
    data = report.to_json()
    low = [p for p in ("int8", "bf16") if cpu_native(p)]
    peers = ["fp32", "int8"] if CT2 else []
    assert data["schema"] == 1
    assert set(data["machine"]) >= {"cpu", "threads", "torch", "transformers", "date"}
    assert data["matmul_gflops"] > 0
    names = [r["name"] for r in data["rows"]]
    vendor = vendor_kernel(llama_loaded)  # (k): d on the fastest vendor float32 GEMM, where d runs the ordered one
    k = [f"k ours fp32 {vendor}"] if vendor else []
    assert names[0].startswith("a ") and names[3].startswith("d ") and len(names) == 10 + len(k + low) + len(peers)
    assert names[7 : 7 + len(k)] == k
    if k:
        row = data["rows"][7]
        assert row["agree"] == 12 and row["vs_d"] > 0 and "not batch-invariant" in row["description"]
    # (g): ours in the other precisions this CPU runs natively, after the float32 rows; (m) the labels
    # as a multi-label task; (q) three questions in one pass; then (i)
    low = k + low  # the rows after (k) count from it
    assert names[7 + len(k) : 7 + len(low)] == [f"g ours {p}" for p in low[len(k):]]
    assert names[7 + len(low)] == "m ours multi-label (3)"
    assert names[8 + len(low)] == "q ours 3 questions (5+3+3)"
    assert names[9 + len(low)] == "s ours 3-field schema (5+3+3)"
    assert [n.removesuffix(" per item").removesuffix(" batched") for n in names[10 + len(low):]] == \
           [f"i ctranslate2 {p}" for p in peers]  # each precision's faster mode
    assert all(n.endswith((" per item", " batched")) for n in names[10 + len(low):])
    q = data["rows"][8 + len(low)]
    # its own figures: whole runs interleaved with one question's and three single-question runs'
    assert q["agree"] == 12 and q["max_abs_diff"] < 1e-3 and q["vs_d"] is None
    for key in ("cost_vs_one", "faster_than_three"):
        rounds = q["ratios"][f"{key}_rounds"]
        assert len(rounds) == 3 and q["ratios"][key] > 0
        assert f"{q['ratios'][key]:.2f}x" in q["description"]
        assert f"(rounds {min(rounds):.2f}-{max(rounds):.2f})" in q["description"]
    # (s): the three fields as a Pydantic schema through the service's path, as offline classify answers them
    structured = data["rows"][9 + len(low)]
    assert structured["agree"] == 12 and structured["max_abs_diff"] < 1e-4 and structured["vs_d"] is None
    assert len(structured["ratios"]["cost_vs_one_rounds"]) == 3 and structured["ratios"]["cost_vs_one"] > 0
    assert f"{structured['ratios']['cost_vs_one']:.2f}x a one-field" in structured["description"]
    assert data["engine"].startswith("cpu fp32 (")
    for row in data["rows"]:
        assert set(row) >= {"name", "seconds", "items_per_s", "tokens_per_s", "padding", "speedup",
                            "agree", "items", "max_abs_diff", "roofline"}
        assert row["items"] == 12
        if not row["name"].startswith(("g ", "i ctranslate2 int8")):
            assert row["agree"] == 12  # every float32 path predicts what the loop predicts
            assert row["max_abs_diff"] < 1e-3
    ours = data["rows"][3]
    assert ours["peak_rss_mb"] > 0
    # (k), (g) and (i) timed interleaved with (d): the speed-up over (a) is (row over d) x (d over a),
    # its seconds d's over (row over d), so that no row timed at another moment enters the ratio.
    for row in data["rows"][7:]:
        if row["name"].startswith(("q ", "s ")):
            continue
        assert row["vs_d"] > 0 and row["padding"] == (ours["padding"] if row["name"][0] in "gkm" else None)
        assert row["seconds"] == pytest.approx(ours["seconds"] / row["vs_d"])
        assert row["speedup"] == pytest.approx(row["vs_d"] * ours["speedup"])
    assert all(row["vs_d"] is None for row in data["rows"][:4])
    for row in data["rows"][4:7]:  # (e): whole runs interleaved with whole runs of (d)
        assert row["vs_d"] > 0 and row["seconds"] == pytest.approx(ours["seconds"] / row["vs_d"])
        # each round's ratio is kept, so a reader can tell a difference from the rounds' noise
        assert len(row["vs_d_rounds"]) == E_ROUNDS and row["vs_d"] == pytest.approx(np.median(row["vs_d_rounds"]), abs=1e-3)
        assert f"(rounds {min(row['vs_d_rounds']):.2f}-{max(row['vs_d_rounds']):.2f})" in row["description"]
    assert all(row["vs_d_rounds"] is None for row in data["rows"] if not row["name"].startswith("e "))
    # The roofline's inputs, recomputed: useful tokens are every item's prompt after the shared prefix.
    from slmclassify import Classifier

    clf = Classifier(ARTICLE_TASK.with_overrides(mode="first"), model=llama_loaded)
    ids = clf.encode(short_tickets(12)).ids
    assert data["work_tokens"] == sum(len(i) for i in ids) - 12 * len(clf.prefix_ids)
    assert data["flops_per_token"] == 2 * LLAMA_NON_EMBEDDING
    for row in report.rows:
        expected = (roofline(report.work_tokens, report.flops_per_token, row.seconds, report.matmul_gflops)
                    if row.name[0] in "degk" else None)  # g: ours in low precision, against the fp32 rate
        assert row.roofline == expected


def test_roofline_formula():
    # 10^6 useful tokens x 148096 FLOP each in 2 s = 74.048 GFLOP/s, against a 100 GFLOP/s matmul rate
    assert roofline(1_000_000, 148_096, 2.0, 100.0) == pytest.approx(0.74048, rel=1e-12)


# Tiny models of conftest: hidden 64, MLP 128, 4 heads of 16, 2 kv heads, 2 layers. Per layer:
# q 64*64 + k 64*32 + v 64*32 + o 64*64 + MLP 3*64*128 + 2 norms of 64 = 36992; + the final norm (64).
LLAMA_NON_EMBEDDING = 2 * 36992 + 64
QWEN2_NON_EMBEDDING = LLAMA_NON_EMBEDDING + 2 * (64 + 32 + 32)  # q/k/v biases


def test_non_embedding_params_tied(llama_loaded):
    model = llama_loaded.model
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert non_embedding_params(model) == LLAMA_NON_EMBEDDING


def test_non_embedding_params_untied(tiny_tokenizer):
    from conftest import _model

    model = _model("qwen2", len(tiny_tokenizer))
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    assert non_embedding_params(model) == QWEN2_NON_EMBEDDING


def test_article_batches_restore_the_padding_side(llama_loaded):
    tok = llama_loaded.tokenizer
    before = tok.padding_side
    article_batched(llama_loaded, ["a b c", "a"], ("billing", "technical"), np.arange(2))
    assert tok.padding_side == before == "right"


def test_bench_cli_prints_table_then_json(llama_dir, tmp_path):
    out = tmp_path / "bench.json"
    data = tmp_path / "tickets.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in short_tickets(6)))
    result = CliRunner().invoke(cli, ["bench", "--n", "6", "--input", str(data), "--model", str(llama_dir),
                                      "--json", str(out)], catch_exceptions=False)
    lines = result.stdout.strip().splitlines()
    assert "speedup" in result.stdout and "a article per-item loop" in result.stdout
    last = json.loads(lines[-1])
    assert last == json.loads(out.read_text())
    k = sum(r["name"].startswith("k ") for r in last["rows"])
    from slmclassify import load_model

    assert k == (1 if vendor_kernel(load_model(str(llama_dir))) else 0)
    assert [r["agree"] for r in last["rows"] if not r["name"].startswith(("g ", "i "))] == [6] * (10 + k)  # (m), (q), (s)
    assert [r["agree"] for r in last["rows"] if r["name"].startswith("i ctranslate2 fp32")] == [6] * CT2
    assert "engine: cpu fp32 (" in result.stdout


def test_bench_cli_no_ctranslate2_skips_the_i_rows(llama_dir, monkeypatch):
    import slmclassify.bench.ctranslate2

    monkeypatch.setattr(slmclassify.bench.ctranslate2, "measure", lambda *a: pytest.fail("--no-ctranslate2 ran it"))
    result = CliRunner().invoke(cli, ["bench", "--n", "3", "--model", str(llama_dir), "--no-ctranslate2"],
                                catch_exceptions=False)
    assert result.exit_code == 0 and "i ctranslate2: skipped (switched off)" in result.stderr
    assert not any(r["name"].startswith("i ") for r in json.loads(result.stdout.splitlines()[-1])["rows"])


def test_bench_rows_runs_only_the_rows_asked_besides_a_to_d(llama_dir, monkeypatch, run_main):
    """`--rows g` is (a)-(d) and the other precisions' rows; `--rows none` (a)-(d) alone (what a
    one-off script of rows a and d did); an unknown letter is refused naming the letters, before
    the model loads."""
    import slmclassify.bench.compare as compare

    monkeypatch.setattr(compare, "_ablations", lambda *a: pytest.fail("--rows g ran the ablations"))
    args = ["bench", "--n", "3", "--model", str(llama_dir), "--no-llama-cpp"]
    only_g = CliRunner().invoke(cli, [*args, "--rows", "g"], catch_exceptions=False)
    assert only_g.exit_code == 0, only_g.output
    letters = [r["name"][0] for r in json.loads(only_g.stdout.splitlines()[-1])["rows"]]
    assert letters[:4] == ["a", "b", "c", "d"] and set(letters[4:]) <= {"g"}
    alone = CliRunner().invoke(cli, [*args, "--rows", "none"], catch_exceptions=False)
    assert [r["name"][0] for r in json.loads(alone.stdout.splitlines()[-1])["rows"]] == ["a", "b", "c", "d"]
    code, _out, err = run_main(*args, "--rows", "e,x")
    assert code != 0 and "error: --rows 'e,x'" in err and "g (ours in each other precision)" in err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback


def test_sweep_cli_plots_and_saves(llama_dir, tmp_path, monkeypatch):
    from slmclassify.io.saved_settings import saved_settings

    task = tmp_path / "task.toml"
    task.write_text('# my task\nlabels = ["billing", "technical"]  # two\n[[examples]]\ntext = "x"\nlabel = "billing"\n')
    png = tmp_path / "sweep.png"
    result = CliRunner().invoke(cli, ["sweep", "--n", "6", "--budgets", "64,256", "--row-caps", "2,8",
                                      "--model", str(llama_dir), "--plot", str(png), "--save",
                                      "--task", str(task), "--save-to-task"], catch_exceptions=False)
    assert png.stat().st_size > 1000
    assert task.read_text().startswith('# my task\nlabels = ["billing", "technical"]  # two\n')
    best = [line for line in result.stdout.splitlines() if line.startswith("best:")]
    assert len(best) == 1
    saved = saved_settings()
    assert saved["token_budget"] in (64, 256) and saved["max_rows"] in (2, 8)
    assert f"--token-budget {saved['token_budget']} --max-rows {saved['max_rows']}" in best[0]
    from slmclassify.jobs.sources import read_task, task_file_settings

    assert task_file_settings(task) == saved
    assert read_task(task).labels == ("billing", "technical")


def test_bench_cli_llama_cpp_row_and_opt_out(llama_dir, llama_loaded, tmp_path, monkeypatch):
    """(f) runs on a .gguf model when llama-cpp-python is importable; --no-llama-cpp skips it."""
    import slmclassify.bench.compare
    import slmclassify.models.prepare

    calls = []

    def fake_llama_cpp(gguf_path, prompts, labels, tokenizer):
        calls.append(gguf_path)
        return np.zeros((len(prompts), len(labels)))

    monkeypatch.setattr(slmclassify.models.prepare, "load_model", lambda model, device=None, precision=None, **kw: llama_loaded)
    monkeypatch.setattr(slmclassify.bench.compare, "llama_cpp_scores", fake_llama_cpp)
    data = tmp_path / "tickets.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in short_tickets(4)))
    args = ["bench", "--n", "4", "--input", str(data), "--model", str(tmp_path / "model.gguf")]

    with_f = json.loads(CliRunner().invoke(cli, args, catch_exceptions=False).stdout.splitlines()[-1])
    names = [r["name"][0] for r in with_f["rows"]]
    peers = 2 if CT2 else 0
    k = 1 if vendor_kernel(llama_loaded) else 0
    s = names.count("s")  # (s) is left out where no ticket's conversation fits the tiny model's context
    assert names == (list("abcdeee") + ["k"] * k + ["g"] * (len(names) - 10 - k - peers - s) + ["m", "q"] + ["s"] * s
                     + ["i"] * peers + ["f"])
    assert calls == [str(tmp_path / "model.gguf")]

    without_f = json.loads(CliRunner().invoke(cli, [*args, "--no-llama-cpp"], catch_exceptions=False).stdout.splitlines()[-1])
    assert len(without_f["rows"]) == len(names) - 1 and len(calls) == 1



@pytest.mark.skipif(not CT2, reason="ctranslate2 is not installed (pip install 'slmclassify[ctranslate2]')")
def test_ctranslate2_scores_equal_the_reference(tiny_loaded, tmp_path):
    """(i)'s scores, per item and batched, in float32 equal the per-item reference path (Llama and
    Qwen2 with its biases): the conversion, the static prompt, the token strings and the last
    logits row of a ragged batch are all right. int8 still names the same labels."""
    from slmclassify import Classifier
    from slmclassify.bench.article import first_ids
    from slmclassify.bench.ctranslate2 import CT2Scorer, converted

    clf = Classifier(ARTICLE_TASK.with_overrides(mode="first"), model=tiny_loaded)
    encoded = clf.encode(short_tickets(10))
    assert encoded.cached.all() and len({len(encoded.own(i)) for i in range(10)}) > 3  # ragged
    reference = clf.reference(encoded, range(10))
    folder = converted(tiny_loaded.model, tiny_loaded.tokenizer, tmp_path)
    first = first_ids(tiny_loaded.tokenizer, ARTICLE_TASK.labels).tolist()
    fp32 = CT2Scorer(folder, "fp32", tiny_loaded.tokenizer, first, clf.prefix_ids, threads=1, batch_rows=4)
    for scores in (fp32.per_item(encoded), fp32.batched(encoded)):
        assert np.abs(scores - reference).max() < 1e-4, np.c_[scores, reference]
    int8 = CT2Scorer(folder, "int8", tiny_loaded.tokenizer, first, clf.prefix_ids, threads=1)
    assert (int8.per_item(encoded).argmax(1) == reference.argmax(1)).mean() >= 0.8


@pytest.mark.skipif(not CT2, reason="ctranslate2 is not installed (pip install 'slmclassify[ctranslate2]')")
def test_ctranslate2_converts_once(llama_loaded, tmp_path, monkeypatch):
    import ctranslate2.converters

    from slmclassify.bench.ctranslate2 import converted

    folder = converted(llama_loaded.model, llama_loaded.tokenizer, tmp_path)
    assert folder.parent == tmp_path and folder.name.startswith("ctranslate2-") and (folder / "model.bin").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no work folder left
    monkeypatch.setattr(ctranslate2.converters, "TransformersConverter", lambda *a: pytest.fail("converted twice"))
    assert converted(llama_loaded.model, llama_loaded.tokenizer, tmp_path) == folder


def test_ctranslate2_rows_skipped_without_the_package(llama_loaded, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    lines = []
    report = run_bench(llama_loaded, short_tickets(4), ARTICLE_TASK, log=lines.append)
    assert not any(r.name.startswith("i ") for r in report.rows)
    assert "  i ctranslate2: skipped (ctranslate2 is not installed: pip install 'slmclassify[ctranslate2]' " \
           "(ctranslate2==4.8.5))" in lines


@pytest.mark.parametrize("option,value,instead", [("--token-budget", "512", "--budgets"), ("--max-rows", "8", "--row-caps")])
def test_sweep_refuses_the_options_it_varies(run_main, monkeypatch, option, value, instead):
    """Regression: sweep silently ignored --token-budget and --max-rows."""
    import slmclassify.models.prepare

    monkeypatch.setattr(slmclassify.models.prepare, "load_model", lambda model, *a, **kw: pytest.fail("must refuse before loading"))
    code, out, err = run_main("sweep", option, value)
    assert (code, out) == (2, "")
    assert err == (f"slmclassify: error: sweep varies {option} itself: list the values to try with {instead} "
                   f"(e.g. {instead} {value})\n")


@pytest.mark.parametrize("args,cap,calibrate", [([], 512, True), (["--max-tokens", "40", "--no-calibrate"], 40, False),
                                                (["--max-tokens", "none"], None, True)])
def test_sweep_honours_max_tokens_and_calibrate(run_main, monkeypatch, llama_loaded, args, cap, calibrate):
    """Regression: sweep silently ignored --max-tokens and --calibrate."""
    import slmclassify.models.prepare
    import slmclassify.bench.sweep
    from slmclassify.classifier import DEFAULT_MAX_TEXT_TOKENS
    from slmclassify.bench.sweep import SweepPoint

    seen = {}

    def fake_sweep(loaded, task, texts, budgets, rows, max_text_tokens, log):
        seen.update(cap=max_text_tokens, calibrate=task.calibrate)
        return [SweepPoint(64, 2, 1.0, 0.0, 1, 1.0)]

    monkeypatch.setattr(slmclassify.models.prepare, "load_model", lambda model, *a, **kw: llama_loaded)
    monkeypatch.setattr(slmclassify.bench.sweep, "run_sweep", fake_sweep)
    monkeypatch.setattr(slmclassify.bench.sweep, "plot", lambda points, path: None)
    code, _, err = run_main("sweep", "--n", "2", *args)
    assert code == 0, err
    assert seen == {"cap": cap, "calibrate": calibrate}
    assert DEFAULT_MAX_TEXT_TOKENS == 512


def test_sweep_prints_the_table_before_a_missing_matplotlib(run_main, monkeypatch, llama_dir, tmp_path):
    """Regression: sweep plotted before printing, so a missing matplotlib lost the measurements."""
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import matplotlib -> ImportError
    code, out, err = run_main("sweep", "--n", "3", "--budgets", "64", "--row-caps", "2", "--model", llama_dir,
                              "--plot", tmp_path / "s.png")
    lines = out.splitlines()
    assert code == 2
    assert lines[0].split() == ["budget", "rows", "items/s", "padding%", "peak", "RSS", "MB"]
    assert lines[1].split()[:2] == ["64", "2"] and lines[2].startswith("best: --token-budget 64 --max-rows 2 (")
    assert err.splitlines()[-1] == ("slmclassify: error: plot not written: matplotlib is not installed "
                                    "(pip install 'slmclassify[plots]'); the measurements are above")
    assert not (tmp_path / "s.png").exists()


def test_sweep_interleaves_the_settings(llama_loaded, monkeypatch):
    """Every setting runs once per round, the order rotating (timing harness), not one setting after another."""
    from slmclassify import Classifier
    from slmclassify.bench.sweep import run_sweep, run_window_sweep

    seen = []
    score = Classifier.score

    def spy(self, encoded, *args, **kwargs):
        seen.append((self.settings.token_budget, self.settings.max_rows, self.settings.window, len(encoded)))
        return score(self, encoded, *args, **kwargs)

    monkeypatch.setattr(Classifier, "score", spy)
    texts = short_tickets(10)
    points = run_sweep(llama_loaded, ARTICLE_TASK, texts, [64, 256], [4], log=lambda m: None, rounds=2)
    assert [(p.token_budget, p.max_rows) for p in points] == [(64, 4), (256, 4)]
    assert [s[:2] for s in seen if s[3] == 10] == [(64, 4), (256, 4), (256, 4), (64, 4)]
    assert all(p.items_per_s > 0 and p.batches >= 1 and p.peak_rss_mb > 0 for p in points)
    assert points[0].batches > points[1].batches  # the smaller budget makes more batches
    seen.clear()
    windows = run_window_sweep(llama_loaded, ARTICLE_TASK, texts, [4, 16, 4], rounds=2)
    assert [w.window for w in windows] == [4, 16]
    runs = [s[2] for s in seen if s[2] != 1024]  # not calibration and warm-up; windows of 4: 3 calls, of 16: one
    assert runs == [4, 4, 4, 16, 16, 4, 4, 4]


@pytest.mark.parametrize("caps, expected", [({"ATEN_CPU_CAPABILITY": "avx2"}, "AVX2"),
                                            ({"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx512"}, "AVX2"),
                                            ({}, None)])
def test_ctranslate2_is_capped_like_ours(monkeypatch, caps, expected):
    """Under an instruction-set cap the (i) rows run CTranslate2 at the same level as ours
    (CT2_FORCE_CPU_ISA), and a value the user set wins."""
    from slmclassify.bench.ctranslate2 import cap_like_ours

    for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "CT2_FORCE_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in caps.items():
        monkeypatch.setenv(name, value)
    assert cap_like_ours() == expected
    monkeypatch.setenv("CT2_FORCE_CPU_ISA", "GENERIC")
    assert cap_like_ours() == "GENERIC"
