"""The cache is an optimisation, never a requirement (`cache.py`): an entry of another source is a miss,
a cache that cannot be written costs one warning and changes no bit of the output, and nothing
half-written is left. The cases of the hostile sweep of 2026-12-06 (issue "Nothing lost IV")."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import cli_command, cli_env
from slmclassify import Classifier, Task, load_model
from slmclassify import cache
from slmclassify.backends import choice, fp32_kernels, native
from slmclassify.models import loading

TASK = Task(labels=("billing", "technical", "account"), user_template="Ticket: {text}\nTeam:")
TEXTS = ["My card was charged twice.", "The app crashes on start.", "Change my email.", "refund please"]


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    """Each test sees its own warnings and scratch folders (they are once per process otherwise)."""
    monkeypatch.setattr(cache, "_WARNED", set())
    monkeypatch.setattr(cache, "_SCRATCH", {})


@pytest.fixture
def two_ggufs(tmp_path, monkeypatch, llama_dir):
    """Two GGUF files whose de-quantising gives two different tiny Llamas (B's weights scaled), counted."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gguf_writer import write_gguf

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = AutoModelForCausalLM.from_pretrained(llama_dir)
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    a = write_gguf(model, tokenizer, tmp_path / "a.gguf", "llama")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    b = write_gguf(model, tokenizer, tmp_path / "b.gguf", "llama")
    calls = []
    real = loading._dequantise
    monkeypatch.setattr(loading, "_dequantise", lambda path: calls.append(path.name) or real(path))
    return a, b, calls


def _entry_of(gguf: Path) -> Path:
    from slmclassify.io.hashing import file_sha256

    return loading.cache_root() / f"gguf-{file_sha256(gguf)[:20]}-v{loading._CACHE_FORMAT}"


def _embedding(loaded) -> torch.Tensor:
    return loaded.model.get_input_embeddings().weight.detach().clone()


def test_a_conversion_swapped_with_another_models_is_not_used(two_ggufs):
    """Before: A's conversion folder under B's key and back, `--model A.gguf` exited 0 with model B's
    labels: the manifest checked each file against its own SHA-256, not against the GGUF it came from.
    Now the manifest records the source GGUF's SHA-256 (and the version): the swapped entry is moved
    aside with one warning and A converted again."""
    a, b, calls = two_ggufs
    want_a, want_b = _embedding(load_model(str(a))), _embedding(load_model(str(b)))
    assert calls == ["a.gguf", "b.gguf"]
    entry_a, entry_b = _entry_of(a), _entry_of(b)
    entry_a.rename(entry_a.with_name("swap"))
    entry_b.rename(entry_a)
    entry_a.with_name("swap").rename(entry_b)
    with pytest.warns(cache.CacheWarning, match=r"was converted from another file than .*a\.gguf.*moved to"):
        got_a = _embedding(load_model(str(a)))
    assert torch.equal(got_a, want_a) and not torch.equal(got_a, want_b)
    assert calls == ["a.gguf", "b.gguf", "a.gguf"]
    assert len(list((loading.cache_root() / "moved-aside").iterdir())) == 1
    with pytest.warns(cache.CacheWarning, match="was converted from another file"):
        assert torch.equal(_embedding(load_model(str(b))), want_b)
    assert calls == ["a.gguf", "b.gguf", "a.gguf", "b.gguf"]


def test_a_full_disk_during_a_conversion_leaves_nothing_and_the_run_goes_on(two_ggufs, monkeypatch):
    """Before: a full disk during a GGUF conversion was a `SafetensorError` traceback. Now nothing
    half-written stays in the cache, the conversion goes to this process's scratch folder with one
    warning, and a later run (space freed) converts into the cache as usual."""
    from safetensors import SafetensorError

    a, _b, calls = two_ggufs
    real = loading.save_hf_folder

    def full_disk(model, tokenizer, folder):
        if folder.parent == loading.cache_root():
            (folder / "model.safetensors").write_bytes(b"\0" * 1000)  # what got written before the disk filled
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                  "message: \"No space left on device\" })")
        real(model, tokenizer, folder)

    monkeypatch.setattr(loading, "save_hf_folder", full_disk)
    with pytest.warns(cache.CacheWarning, match=r"cannot write the cache .* \(Error while serializing"):
        first = load_model(str(a))
    assert [p.name for p in loading.cache_root().iterdir() if p.is_dir()] == []  # nothing half-written
    monkeypatch.setattr(loading, "save_hf_folder", real)
    monkeypatch.setattr(cache, "_SCRATCH", {})
    again = load_model(str(a))
    assert _entry_of(a).is_dir() and calls == ["a.gguf", "a.gguf"]
    assert torch.equal(_embedding(first), _embedding(again))


def test_the_cache_root_a_regular_file_is_one_warning(two_ggufs, tmp_path):
    """Before: the cache root a regular file was a `FileExistsError` traceback. Now the run goes on
    without the cache, and says so once."""
    a, _b, _calls = two_ggufs
    loading.cache_root().parent.mkdir(parents=True, exist_ok=True)
    loading.cache_root().write_text("not a folder")
    with pytest.warns(cache.CacheWarning, match=r"slmclassify is a file, not a folder\): this run keeps what it "
                                                r"computes in .*, removed when it exits") as caught:
        scores = Classifier(TASK, model=str(a)).classify(TEXTS)
    assert len([w for w in caught if issubclass(w.category, cache.CacheWarning)]) == 1
    assert len(scores) == len(TEXTS)
    assert loading.cache_root().read_text() == "not a folder"


def test_measured_choices_rotated_between_keys_are_measured_again(tmp_path):
    """Before: the measured-choice entries rotated between models' keys were used for the wrong model
    (and a schedule entry under a GEMM key was a `KeyError: 'token_budget'` traceback). Now an entry
    records the key it was measured for and the version: a rotated one is a miss."""
    first, second = {"gemm": "ordered", "rates": {"ordered": 1.0}, "invariant": {}}, \
        {"gemm": "mm", "rates": {"mm": 2.0}, "invariant": {}}
    choice.store_entry(tmp_path, "machine|model-a", first)
    choice.store_entry(tmp_path, "machine|model-b", second)
    assert choice.cached_entry(tmp_path, "machine|model-a", choice.GEMM_FIELDS)["rates"] == {"ordered": 1.0}
    path = tmp_path / choice.CACHE_FILE
    entries = json.loads(path.read_text())
    entries["machine|model-a"], entries["machine|model-b"] = entries["machine|model-b"], entries["machine|model-a"]
    path.write_text(json.dumps(entries))
    assert choice.cached_entry(tmp_path, "machine|model-a", choice.GEMM_FIELDS) is None
    assert choice.cached_entry(tmp_path, "machine|model-b", choice.GEMM_FIELDS) is None


def test_a_kernel_build_copied_under_another_name_is_built_again(tmp_path):
    """A compiled kernel and its record copied under another build's name (a cache shuffled by hand,
    an older build of other sources) is not loaded: its record names the sources and setup it was
    built from, and the name must agree."""
    flags = native.compile_flags()
    lib, why = fp32_kernels.LIBRARY.build(tmp_path, flags)
    assert lib is not None, why
    (built,) = (tmp_path / "kernels").glob("fp32-attention-*.so")
    assert native._intact(built)
    stem, setup, sources = built.name[:-3].rsplit("-", 2)
    other = built.with_name(f"{stem}-{setup}-{'0' * 16}.so")
    shutil.copy(built, other)
    shutil.copy(native._recorded(built), native._recorded(other))
    assert not native._intact(other)


@contextlib.contextmanager
def _read_only(folder: Path):
    """`folder` mounted read-only over itself (a bind mount, as the sweep did), or skip where this
    process cannot mount (not root, no mount namespace); permissions would not stop root."""
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount read-only here: {done.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _classify(tmp_path, env, model: Path, name: str) -> tuple[bytes, str]:
    src, out = tmp_path / "in.csv", tmp_path / f"{name}.csv"
    src.write_text("text\n" + "\n".join(TEXTS) + "\n")
    task = tmp_path / "task.toml"
    task.write_text('labels = ["billing", "technical", "account"]\nuser_template = "Ticket: {text}\\nTeam:"\n')
    done = subprocess.run([*cli_command(), "classify", src, "-o", out, "--task", task, "--model", model, "--quiet"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return out.read_bytes(), done.stderr


@pytest.mark.skipif(os.geteuid() != 0 if hasattr(os, "geteuid") else True, reason="bind mounts need root")
def test_a_read_only_cache_gives_the_warm_runs_bytes(tmp_path, llama_dir):
    """Before: a read-only cache folder (bind mount), holding a complete conversion or not, was an
    `OSError: Read-only file system ... .lock` traceback, and a run that could not compile the C
    attention kernel into its cache computed with torch's attention: other bits than a warm run's.
    Now a complete entry is read, what cannot be written is built in a scratch folder removed at
    exit (one warning line), and the output is the warm run's, byte for byte."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gguf_writer import write_gguf

    gguf = write_gguf(AutoModelForCausalLM.from_pretrained(llama_dir), AutoTokenizer.from_pretrained(llama_dir),
                      tmp_path / "tiny.gguf", "llama")
    env = cli_env(tmp_path)
    shutil.rmtree(Path(env["XDG_CACHE_HOME"]), ignore_errors=True)  # cold: nothing cached, no kernel compiled
    root = Path(env["XDG_CACHE_HOME"]) / "slmclassify"
    root.mkdir(parents=True)
    with _read_only(root):  # empty and read-only
        cold, err = _classify(tmp_path, env, gguf, "cold")
    warned = [line for line in err.splitlines() if line.startswith("slmclassify: warning")]
    assert len(warned) == 1 and "cannot write the cache" in warned[0] and "Read-only file system" in warned[0], err
    assert list(root.iterdir()) == []
    scratch = Path(warned[0].split("keeps what it computes in ")[1].split(",")[0])
    assert not scratch.exists()  # removed at exit
    first, err = _classify(tmp_path, env, gguf, "first")  # writable: converts, compiles and measures
    assert "slmclassify: warning" not in err
    # A measurement taken on a busy machine (CI runs the suite beside it) or in unsteady rounds (the
    # tiny model's probe takes microseconds) is provisional: measured again, and written, at a later
    # quiet start, by design. The warm run must find a complete cache, so its entries are pinned as
    # measured quietly (before: the test failed whenever the first run's measurement was provisional).
    measured = root / "backends.json"
    entries = json.loads(measured.read_text())
    for entry in entries.values():
        entry.pop("provisional", None)
    measured.write_text(json.dumps(entries, indent=1, sort_keys=True))
    with _read_only(root):  # complete and read-only: everything read from it, nothing written
        warm, err = _classify(tmp_path, env, gguf, "warm")
    assert "slmclassify: warning" not in err and "measured now" not in err
    assert cold == first == warm
