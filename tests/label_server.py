"""The `slmclassify label` process for the tests that talk to a real server (the browser test, the
several-clients test): started as a subprocess, with the URL it printed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

WAIT = 120  # the first slice of the tiny model is scored on a busy machine


class Page:
    """The `slmclassify label` process (a subprocess) and the URL it printed; a team's page prints one
    `name (role): URL` line per member (`people` of them): `urls` {name: URL}."""

    def __init__(self, args: list[str], cwd: str | None = None, people: int = 0):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from slmclassify.cli.main import main; main()", "label", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.errors: list[str] = []
        threading.Thread(target=lambda: self.errors.extend(self.proc.stderr), daemon=True).start()
        if not people:
            self.url = self._printed_url()
            return
        self.urls = {}
        for _ in range(people):
            name, _, url = self._printed_url(team=True).partition(": ")
            self.urls[name.split(" (")[0]] = url

    def _printed_url(self, team: bool = False) -> str:
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(WAIT)
        line = found[0].strip() if found else ""
        url = line.partition(": ")[2] if team else line
        assert url.startswith("http://127.0.0.1:") and "/?token=" in url, (line, "".join(self.errors))
        return line

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT)
