"""Chat completions with choices from concurrent `openai` clients against offline `classify`, side
by side in one run (issue 55):

  offline   Classifier.score on the tickets in this process: the article's task, each label scored
            whole (`mode = "full"`, as chat scores choices), uncalibrated
  chat      `slmclassify serve` (a subprocess, embedded model) answering the same tickets sent as chat
            completions with `structured_outputs.choice` = the labels, by --concurrency clients of
            the official `openai` package; the messages are the ones the task renders, so every
            answer must be offline's best label (checked)
  batch     the same requests as an OpenAI Batch API file answered by `slmclassify batch`'s job
            in this process (the model loaded once, as offline's)

The rounds rotate the sides. Prints each round, the throughput ratio, the share of the
conversations' head tokens read from the prefix cache (the server's /metrics), the machine's load
average, and one JSON line last.

    .venv/bin/python scripts/chat_compare.py --n 1000 --rounds 2 --concurrency 16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai

sys.path.insert(0, str(Path(__file__).parent))
from serve_compare import Server  # noqa: E402

from slmclassify.core.article_tickets import ARTICLE_TASK, article_tickets  # noqa: E402


def send(url: str, chats: list[list[dict]], labels: list[str], concurrency: int) -> tuple[list[str], float]:
    """Every chat sent once by `concurrency` clients: (the answers in order, seconds)."""
    todo: queue.Queue = queue.Queue()
    for k in range(len(chats)):
        todo.put(k)
    answers: list[str | None] = [None] * len(chats)
    failures: list[str] = []

    def client():
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        while True:
            try:
                k = todo.get_nowait()
            except queue.Empty:
                return
            try:
                reply = sdk.chat.completions.create(model="article", messages=chats[k],
                                                    extra_body={"structured_outputs": {"choice": labels}})
                answers[k] = reply.choices[0].message.content
            except openai.OpenAIError as exc:
                failures.append(f"ticket {k}: {exc}")

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed, first: {failures[0]}")
    return answers, seconds


def prefix_tokens(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line.startswith("slmclassify_prefix_tokens_total{"):
            out[line.split('how="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="article tickets per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--workdir", default=".", help="where the batch file and its answers are written")
    args = parser.parse_args()

    from slmclassify import Classifier, EngineSettings, load_model
    from slmclassify.jobs.batch import BatchRequest, run_batch

    texts = article_tickets(args.n)
    task = dataclasses.replace(ARTICLE_TASK, mode="full", calibrate=False)
    labels = list(task.labels)
    server = Server("chat")
    clf = Classifier(task, model=load_model(), settings=EngineSettings(max_text_tokens=None))  # chat cuts nothing
    chats = [clf.renderer.messages(text) for text in texts]
    url = server.wait()
    offline_rates, chat_rates, batch_rates, loads = [], [], [], []
    requests = Path(args.workdir) / "chat_requests.jsonl"
    requests.write_text("".join(json.dumps({"custom_id": f"t-{k}", "method": "POST", "url": "/v1/chat/completions",
                                            "body": {"model": "article", "messages": m,
                                                     "structured_outputs": {"choice": labels}}}) + "\n"
                                for k, m in enumerate(chats)))
    try:
        send(url, chats[:32], labels, args.concurrency)  # warm-up: the server's first batches
        sides = ["offline", "chat", "batch"]
        for r in range(args.rounds):
            for side in sides[r % 3:] + sides[: r % 3]:
                loads.append(os.getloadavg()[0])
                if side == "batch":
                    answers_file = Path(args.workdir) / f"chat_answers_{r}.jsonl"
                    started = time.perf_counter()
                    run_batch(BatchRequest(str(requests), str(answers_file)), EngineSettings(), model=clf.loaded)
                    batch_rates.append(len(texts) / (time.perf_counter() - started))
                    batch_answers = [json.loads(x)["response"]["body"]["choices"][0]["message"]["content"]
                                     for x in answers_file.read_text().splitlines()]
                    answers_file.unlink()
                    print(f"round {r + 1}: batch {batch_rates[-1]:.2f} items/s (load {loads[-1]:.1f})", file=sys.stderr)
                elif side == "offline":
                    started = time.perf_counter()
                    scores = clf.score(clf.encode(texts)).scores
                    offline_rates.append(len(texts) / (time.perf_counter() - started))
                    want = [labels[k] for k in np.argmax(scores, axis=1)]
                    print(f"round {r + 1}: offline {offline_rates[-1]:.2f} items/s (load {loads[-1]:.1f})",
                          file=sys.stderr)
                else:
                    answers, seconds = send(url, chats, labels, args.concurrency)
                    chat_rates.append(len(texts) / seconds)
                    print(f"round {r + 1}: chat {chat_rates[-1]:.2f} items/s (load {loads[-1]:.1f})", file=sys.stderr)
        tokens = prefix_tokens(url)
    finally:
        server.stop()
    mismatched = sum(a != w for a, w in zip(answers, want)) + sum(a != w for a, w in zip(batch_answers, want))
    offline, chat, batch = float(np.mean(offline_rates)), float(np.mean(chat_rates)), float(np.mean(batch_rates))
    reused, computed = tokens.get("reused", 0.0), tokens.get("computed", 0.0)
    share = reused / (reused + computed) if reused + computed else 0.0
    print(f"offline classify: {offline:.2f} items/s; chat with choices ({args.concurrency} openai clients): "
          f"{chat:.2f} items/s = {chat / offline:.2f}x offline; batch file: {batch:.2f} items/s = "
          f"{batch / offline:.2f}x offline (mean of {args.rounds} rounds; offline: encode and score, batch: the whole "
          "job, chat: the clients' wall clock)")
    print(f"head tokens read from the prefix cache: {share:.4f} ({reused:.0f} reused, {computed:.0f} computed)")
    print(f"answers differing from offline's best label: {mismatched} of {2 * len(texts)}; {os.cpu_count()} CPUs; "
          f"1-min load average {min(loads):.1f}-{max(loads):.1f}")
    line = json.dumps({"offline_items_per_s": offline, "chat_items_per_s": chat, "ratio": chat / offline,
                       "batch_items_per_s": batch, "batch_ratio": batch / offline,
                       "prefix_share": share, "mismatched": mismatched, "n": len(texts),
                       "concurrency": args.concurrency, "rounds": {"offline": offline_rates, "chat": chat_rates, "batch": batch_rates},
                       "load_average": [min(loads), max(loads)]})
    if args.json_path:
        Path(args.json_path).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
