"""The service's targets, measured side by side in one run (issue 11):

  offline   Classifier.classify on the tickets, in this process
  batched   `slmclassify serve` with micro-batching (default --max-wait-ms, printed)
  off       the same server with micro-batching off (--max-wait-ms 0 --max-rows 1)
  wait N    (with --max-wait-sweep) the server at other --max-wait-ms values
  overload  a server with a small queue (--max-queue 16) under 4x the clients: 200s and 503s only

Every server is a subprocess on an ephemeral 127.0.0.1 port with the embedded model and the
article's task; every round runs offline and each server, one after another (the order rotates every round), on
the same tickets (each sent once, by --concurrency clients), so the machine's drift hits every
side alike. Every response is checked against offline results (|Δ probability| ≤ 1e-4, same label).
The 1-minute load average is printed next to every figure (the machine may be shared). Prints a
table and one JSON line last.

    .venv/bin/python examples/serve_compare.py --n 32 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from slmclassify.bench.service_load import LoadReport, report_lines, run_load
from slmclassify.serve.settings import DEFAULT_MAX_WAIT_MS
from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets

TASK_FILE = Path(__file__).with_name("article.toml")
MAX_TEXT_TOKENS = 512  # the server's default per-text cap


class Server:
    """`slmclassify serve` in a subprocess; the URL comes from its `listening` log line."""

    def __init__(self, name: str, *args: str):
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from slmclassify.cli.main import main; main()", "serve",
             "--task", f"article={TASK_FILE}", "--port", "0", "--request-timeout", "600", *args],
            stderr=subprocess.PIPE, text=True)
        self.url = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            if '"event": "listening"' in line:
                self.url = json.loads(line)["url"]
                self._ready.set()
            elif '"path"' not in line:
                print(f"[{self.name}] {line.rstrip()}", file=sys.stderr)

    def wait(self, timeout=600):
        if not self._ready.wait(timeout):
            raise RuntimeError(f"server {self.name} did not start")
        return self.url

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32, help="article tickets per round (sent at once by 32 clients)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-wait-sweep", default="", help="also serve with these --max-wait-ms, e.g. 0,20")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()

    from slmclassify import Classifier, EngineSettings, load_model
    from slmclassify.core.results import RunStats
    from slmclassify.serve.adapter import result_json

    texts = article_tickets(args.n)
    servers = [Server("batched"), Server("off", "--max-wait-ms", "0", "--max-rows", "1")]
    servers += [Server(f"wait {w} ms", "--max-wait-ms", w) for w in args.max_wait_sweep.split(",") if w]
    clf = Classifier(ARTICLE_TASK, model=load_model(), settings=EngineSettings(max_text_tokens=MAX_TEXT_TOKENS))
    for server in servers:
        server.wait()
    runs: dict[str, list[LoadReport]] = {s.name: [] for s in servers}
    offline_rates, loads = [], []
    try:
        expected = [result_json(x) for x in clf.classify(texts)]
        for r in range(args.rounds):
            # the order of the sides rotates every round, so a periodic load elsewhere hits each alike
            sides = [None, *servers]
            for server in sides[r % len(sides):] + sides[: r % len(sides)]:
                load = os.getloadavg()[0]  # other processes on the machine, next to every figure
                loads.append(load)
                if server is None:
                    stats = RunStats()
                    for window in clf.classify_windows(texts):
                        stats.add(window.stats)
                    offline_rates.append(stats.items_per_s)
                    print(f"round {r + 1}: offline {offline_rates[-1]:.2f} items/s (load average {load:.1f})",
                          file=sys.stderr)
                    continue
                report = run_load(server.url, "article", texts, concurrency=args.concurrency, duration=600,
                                  max_requests=len(texts), expected=expected, tolerance=1e-4,
                                  label=f"{server.name} r{r + 1}", timeout=660)
                runs[server.name].append(report)
                print(f"{report.row()}  load average {load:.1f}", file=sys.stderr)
        for server in servers:
            server.stop()
        overload = Server("overload", "--max-queue", "16", "--request-timeout", "60")
        overload.wait()
        burst = run_load(overload.url, "article", texts, concurrency=4 * args.concurrency, duration=20,
                         label="overload (queue 16)")
        overload.stop()
    finally:
        for server in servers:
            if server.proc.poll() is None:
                server.proc.kill()

    offline = sum(offline_rates) / len(offline_rates)
    rate = {name: sum(x.items_per_s for x in reports) / len(reports) for name, reports in runs.items()}
    every = [x for reports in runs.values() for x in reports] + [burst]
    print("\n".join(report_lines(every)[:-1]))
    print(f"default --max-wait-ms {DEFAULT_MAX_WAIT_MS:g}; {os.cpu_count()} CPUs; 1-min load average "
          f"{min(loads):.1f}-{max(loads):.1f} during the rounds")
    print(f"offline classify: {offline:.2f} items/s (mean of {len(offline_rates)} rounds)")
    for name in runs:
        print(f"{name}: {rate[name]:.2f} items/s = {rate[name] / offline:.2f}x offline, "
              f"{rate[name] / rate['off']:.2f}x batching off")
    lost = sum(x.statuses.get("lost", 0) for x in every)
    bad = sum(x.mismatched for x in every)
    unexpected = {k: v for k, v in burst.statuses.items() if k not in ("200", "503")}
    print(f"lost {lost}, mismatched {bad}, overload statuses {burst.statuses} (unexpected: {unexpected or 'none'})")
    summary = {"offline_items_per_s": offline, "items_per_s": rate,
               "batched_vs_off": rate["batched"] / rate["off"], "batched_vs_offline": rate["batched"] / offline,
               "lost": lost, "mismatched": bad, "overload_statuses": burst.statuses,
               "max_wait_ms": DEFAULT_MAX_WAIT_MS, "load_average": [min(loads), max(loads)],
               "runs": [x.to_json() for x in every]}
    line = json.dumps(summary)
    if args.json_path:
        Path(args.json_path).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
