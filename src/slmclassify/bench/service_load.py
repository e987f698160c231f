"""The load generator behind `slmclassify loadtest`: N concurrent clients send single texts to
/v1/classify over loopback for a bounded time (and at most a bounded number of requests), then
report throughput, latency percentiles and errors, and, when given the offline results,
check every response against them.

Each client is one HTTP/1.1 keep-alive connection on plain asyncio streams (`_Connection`): the
load generator shares the CPU with the server it measures, and httpx spent ~4-5 ms of CPU per
request here, more than the server's own handling; this client spends ~0.6 ms.

Each request carries its own X-Request-ID and text; a response counts as mismatched when its
id, its number of results or its label/probabilities differ from what offline `classify` gives
for that text. Requests without a response are counted as lost.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

import numpy as np

from ..errors import TaskError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_DURATION_S = 600
MAX_CONCURRENCY = 1024


@dataclass
class LoadReport:
    """What one load run measured."""

    label: str
    concurrency: int
    seconds: float
    requests: int
    """Requests sent."""
    ok: int
    """Answered 200 with one result."""
    statuses: dict[str, int]
    """Count per HTTP status ('lost' for no response)."""
    items_per_s: float
    """Texts answered 200 per second of the run."""
    p50_ms: float
    p95_ms: float
    p99_ms: float
    checked: int = 0
    """Responses compared with offline results."""
    mismatched: int = 0
    """Responses whose id, result count, label or probabilities differ from offline results."""
    max_prob_diff: float = 0.0
    """Largest |Δ probability| against offline results."""
    examples: list[str] = field(default_factory=list)
    """Up to 3 mismatch descriptions."""

    @property
    def errors(self) -> int:
        return self.requests - self.ok

    HEADER = (f"{'run':<22} {'clients':>7} {'s':>6} {'requests':>8} {'ok':>6} {'errors':>6} {'items/s':>8} "
              f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'mismatch':>8}")

    def row(self) -> str:
        mismatch = f"{self.mismatched}/{self.checked}" if self.checked else "-"
        return (f"{self.label:<22} {self.concurrency:>7} {self.seconds:>6.1f} {self.requests:>8} {self.ok:>6} "
                f"{self.errors:>6} {self.items_per_s:>8.2f} {self.p50_ms:>8.1f} {self.p95_ms:>8.1f} "
                f"{self.p99_ms:>8.1f} {mismatch:>8}")

    def to_json(self) -> dict:
        return {**asdict(self), "errors": self.errors}


def check_loopback(url: str) -> str:
    """The URL without a trailing slash; refuses anything but http on a loopback address."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK:
        raise TaskError(f"loadtest only targets http://127.0.0.1 (loopback), got {url!r}")
    return url.rstrip("/")


def server_info(url: str, api_key: str | None = None, timeout: float = 10.0) -> dict:
    """GET /v1/tasks: tasks, labels and limits."""
    import httpx

    try:
        response = httpx.get(f"{check_loopback(url)}/v1/tasks", headers=_auth(api_key), timeout=timeout)
    except httpx.HTTPError as exc:
        raise TaskError(f"cannot reach {url}: {exc}; is `slmclassify serve` running?") from None
    if response.status_code != 200:
        raise TaskError(f"{url}/v1/tasks answered {response.status_code}: {response.text[:200]}")
    return response.json()


def run_load(url: str, task: str, texts: list[str], *, concurrency: int = 32, duration: float = 30.0,
             max_requests: int | None = None, api_key: str | None = None, expected: list[dict] | None = None,
             tolerance: float = 1e-3, label: str = "serve", timeout: float = 60.0) -> LoadReport:
    """Run the load and return its report (see the module docstring)."""
    url = check_loopback(url)
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise TaskError(f"--concurrency must be in 1..{MAX_CONCURRENCY}, got {concurrency}")
    if not 0 < duration <= MAX_DURATION_S:
        raise TaskError(f"--duration must be in (0, {MAX_DURATION_S}] seconds, got {duration}")
    if not texts:
        raise TaskError("no texts to send")
    return asyncio.run(_load(url, task, texts, concurrency, duration, max_requests, api_key, expected,
                             tolerance, label, timeout))


async def _load(url, task, texts, concurrency, duration, max_requests, api_key, expected, tolerance, label,
                timeout) -> LoadReport:
    records: list[tuple[int, str, float]] = []  # (text index, status, seconds)
    check = _Checker(expected, tolerance)
    counter = iter(range(max_requests if max_requests is not None else 1 << 62))
    parts = urlsplit(url)
    address = (parts.hostname, parts.port or 80)
    started = time.perf_counter()
    end = started + duration

    async def one_client():
        connection = _Connection(*address, _auth(api_key))
        try:
            while time.perf_counter() < end:
                n = next(counter, None)
                if n is None:
                    return
                i = n % len(texts)
                request_id = uuid.uuid4().hex
                sent = time.perf_counter()
                body = json.dumps({"task": task, "text": texts[i]}).encode()
                try:
                    response = await asyncio.wait_for(
                        connection.post(f"{parts.path}/v1/classify", body, request_id), timeout)
                except (OSError, EOFError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                    connection.close()
                    records.append((i, "lost", time.perf_counter() - sent))
                    continue
                records.append((i, str(response.status_code), time.perf_counter() - sent))
                if response.status_code == 200:
                    check(i, request_id, response)
        finally:
            connection.close()

    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    seconds = time.perf_counter() - started
    statuses: dict[str, int] = {}
    for _, status, _ in records:
        statuses[status] = statuses.get(status, 0) + 1
    ok_latency = np.array([s for _, status, s in records if status == "200"]) * 1000
    pct = (lambda q: float(np.percentile(ok_latency, q))) if len(ok_latency) else (lambda q: float("nan"))
    ok = statuses.get("200", 0) - check.malformed
    return LoadReport(label=label, concurrency=concurrency, seconds=seconds, requests=len(records), ok=ok,
                      statuses=statuses, items_per_s=ok / seconds, p50_ms=pct(50), p95_ms=pct(95), p99_ms=pct(99),
                      checked=check.checked, mismatched=check.mismatched, max_prob_diff=check.max_diff,
                      examples=check.examples)


@dataclass
class _Response:
    status_code: int
    headers: dict[str, str]
    """Lower-cased names."""
    body: bytes

    def json(self):
        return json.loads(self.body)


class _Connection:
    """One client's HTTP/1.1 keep-alive connection, on plain asyncio streams.

    The load generator shares the CPU with the server it measures (loopback), so its own cost
    per request counts: this is a fraction of a general-purpose client's (httpx's per-request CPU
    was larger than the server's own handling of the request). It speaks just what
    /v1/classify needs: POST with a JSON body; responses with Content-Length or chunked.
    """

    def __init__(self, host: str, port: int, headers: dict[str, str]):
        self.host, self.port = host, port
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.reader = self.writer = None

    async def post(self, path: str, body: bytes, request_id: str) -> _Response:
        head = (f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nx-request-id: {request_id}\r\n{self.extra}\r\n").encode()
        reused = self.writer is not None
        if not reused:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line and reused:  # the server had closed the idle connection: it never saw the request
            self.close()
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.writer.write(head + body)
            status_line = await self.reader.readline()
        if not status_line:
            raise EOFError("the server closed the connection")
        status = int(status_line.split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            data = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                data += await self.reader.readexactly(size)
                await self.reader.readline()
            await self.reader.readline()
        else:
            data = await self.reader.read()
            self.close()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return _Response(status, headers, data)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class _Checker:
    """Compares each 200 response with the offline result of its text."""

    def __init__(self, expected: list[dict] | None, tolerance: float):
        self.expected, self.tolerance = expected, tolerance
        self.checked = self.mismatched = self.malformed = 0
        self.max_diff = 0.0
        self.examples: list[str] = []

    def __call__(self, i: int, request_id: str, response) -> None:
        try:
            results = response.json()["results"]
        except (ValueError, KeyError):
            results = None
        problem = None
        if response.headers.get("x-request-id") != request_id:
            problem = "response carries another request's id"
        elif not isinstance(results, list) or len(results) != 1:
            problem = f"expected 1 result, got {results!r:.80}"
            self.malformed += 1
        elif self.expected is not None:
            want, got = self.expected[i], results[0]
            pairs = [(w, _answers(got).get(name, {})) for name, w in _answers(want).items()]
            diff = max((abs(g.get("probabilities", {}).get(k, np.inf) - v) for w, g in pairs
                        for k, v in w["probabilities"].items()), default=0.0)
            self.max_diff = max(self.max_diff, diff)
            labels = [(g.get("label"), w["label"]) for w, g in pairs]
            if any(a != b for a, b in labels) or got["status"] != want["status"] or diff > self.tolerance:
                problem = (f"text {i}: got {'/'.join(map(str, (a for a, _ in labels)))} ({got['status']}), offline "
                           f"{'/'.join(map(str, (b for _, b in labels)))} ({want['status']}), max |Δp| {diff:.2e}")
        if self.expected is not None or problem:
            self.checked += 1
        if problem:
            self.mismatched += 1
            if len(self.examples) < 3:
                self.examples.append(problem)


def _answers(result: dict) -> dict[str | None, dict]:
    """The parts of an API result that hold a label and probabilities: each question's answer by its
    name (a task of questions), or the result itself."""
    return result["answers"] if "answers" in result else {None: result}


def offline_expected(texts: list[str], task, model=None, max_text_tokens: int | None = None) -> tuple[list[dict], float]:
    """Offline `classify` results of the distinct texts (as API dicts), and its items/s."""
    from ..classifier import Classifier, EngineSettings
    from ..serve.adapter import result_json

    from ..core.results import RunStats

    clf = Classifier(task, model=model, settings=EngineSettings(max_text_tokens=max_text_tokens))
    results, parts = [], []
    for window in clf.classify_windows(texts):
        results += window.results
        parts.append(window.stats)
    stats = RunStats.total(parts)
    return [result_json(r) for r in results], stats.items_per_s


def _auth(api_key: str | None) -> dict:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def report_lines(reports: list[LoadReport]) -> list[str]:
    """The human table, then one JSON line."""
    lines = [LoadReport.HEADER, "-" * len(LoadReport.HEADER)]
    lines += [r.row() for r in reports]
    for r in reports:
        lines += [f"  {r.label}: {e}" for e in r.examples]
    lines.append(json.dumps({"runs": [r.to_json() for r in reports]}))
    return lines
