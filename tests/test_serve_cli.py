"""`slmclassify serve` / `loadtest` from the command line: graceful drain on SIGTERM (a real
subprocess on an ephemeral loopback port) and the option errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from click.testing import CliRunner  # noqa: E402

from slmclassify.cli import cli  # noqa: E402
from slmclassify.cli.main import main  # noqa: E402

WAIT = 60
TASK_TOML = 'labels = ["billing", "technical", "account"]\nuser_template = "Ticket: {text}"\n'


def test_sigterm_drains_accepted_requests_then_exits(tmp_path, llama_dir):
    """Requests queued when SIGTERM arrives are all answered; new connections are refused; exit 0."""
    task = tmp_path / "support.toml"
    task.write_text(TASK_TOML)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from slmclassify.cli.main import main; main()", "serve", "--task", f"support={task}",
         "--model", str(llama_dir), "--port", "0", "--max-wait-ms", "12000"],
        stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    listening = threading.Event()

    def read_log():
        for line in proc.stderr:
            lines.append(line)
            if '"event": "listening"' in line:
                listening.set()

    threading.Thread(target=read_log, daemon=True).start()
    try:
        assert listening.wait(WAIT), "".join(lines)
        url = json.loads(next(line for line in lines if "listening" in line))["url"]
        texts = [["refund"], ["login error crash", "parcel"], ["invoice"], ["crash", "password", "delivery"]]
        with ThreadPoolExecutor(len(texts)) as pool:
            pending = [pool.submit(httpx.post, f"{url}/v1/classify", json={"task": "support", "texts": t},
                                   timeout=WAIT) for t in texts]
            deadline = time.monotonic() + WAIT
            while _queued(url) < 7:  # all accepted and waiting for their batch (gap 3 s)
                assert time.monotonic() < deadline
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            with pytest.raises(httpx.ConnectError):  # no longer accepting
                httpx.get(f"{url}/healthz", timeout=5)
            answers = [p.result(WAIT) for p in pending]
        assert [a.status_code for a in answers] == [200] * len(texts)
        assert [len(a.json()["results"]) for a in answers] == [len(t) for t in texts]
        assert proc.wait(WAIT) == 0
        assert '"event": "stopped"' in lines[-1]
        access = [json.loads(line) for line in lines if '"path": "/v1/classify"' in line]
        assert sorted(a["texts"] for a in access) == [1, 1, 2, 3] and {a["status"] for a in access} == {200}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _queued(url: str) -> float:
    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith("slmclassify_queue_items "))


@pytest.mark.parametrize("args, message", [
    (["serve", "--task", "support"], "--task must be NAME=FILE.toml, got 'support'"),
    (["serve", "--task", "a=missing.toml"], "task file not found: missing.toml"),
    (["serve", "--task", "a=t.toml", "--task", "a=t.toml"], "task name 'a' is given twice"),
    (["serve", "--task", "a=t.toml", "--max-wait-ms", "-1"], "--max-wait-ms must be >= 0, got -1.0"),
    (["serve", "--task", "a=t.toml", "--max-queue", "0"], "--max-queue must be positive, got 0"),
    (["loadtest", "http://example.com:8080"], "loadtest only targets http://127.0.0.1 (loopback)"),
])
def test_option_errors(tmp_path, monkeypatch, capsys, args, message):
    """One line `slmclassify: error: ...` and exit 2, before any model loads."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text(TASK_TOML)
    monkeypatch.setattr(sys, "argv", ["slmclassify", *args])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith(f"slmclassify: error: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize("args, expected", [
    ([], ("auto", "auto", 512)),  # auto: the schedule measured where the service runs
    (["--token-budget", "64", "--max-rows", "4", "--max-tokens", "100"], (64, 4, 100)),
    (["--max-batch-rows", "4", "--max-text-tokens", "100"], ("auto", 4, 100)),  # the old names still work
    (["--max-tokens", "none"], ("auto", "auto", None)),
])
def test_serve_names_engine_settings_as_classify_does(tmp_path, monkeypatch, args, expected):
    """`serve` takes the batch shape under classify's names (--max-rows, --max-tokens); the old
    --max-batch-rows/--max-text-tokens stay as hidden aliases so scripts keep working."""
    import slmclassify.serve.server as server

    seen = {}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no saved defaults
    (tmp_path / "t.toml").write_text(TASK_TOML)
    monkeypatch.setattr(sys.modules["slmclassify.cli.startup"], "need_serve_extra", lambda: None)
    monkeypatch.setattr(server, "bind", lambda host, port: type("S", (), {"close": lambda self: None})())
    monkeypatch.setattr(server, "build_service", lambda tasks, model, engine, settings: seen.setdefault("e", engine))
    monkeypatch.setattr(server, "serve", lambda *a: None)
    result = CliRunner().invoke(cli, ["serve", "--task", "a=t.toml", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    engine = seen["e"]
    assert (engine.token_budget, engine.max_rows, engine.max_text_tokens) == expected
    assert "--max-batch-rows" not in CliRunner().invoke(cli, ["serve", "--help"]).output


def test_serve_refuses_a_setting_under_both_names(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text(TASK_TOML)
    monkeypatch.setattr(sys, "argv", ["slmclassify", "serve", "--task", "a=t.toml", "--max-rows", "4",
                                      "--max-batch-rows", "8"])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2
    assert capsys.readouterr().err == ("slmclassify: error: --max-batch-rows is the old name of --max-rows; "
                                       "give one of them\n")
