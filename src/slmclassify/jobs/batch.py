"""The `batch` job: an OpenAI Batch API file of requests → one answer line per request line, in
order, resumably.

    check output → lock OUTPUT → [partial run? check it, resume or refuse] → load model
    → for each window of lines: parse each line (a bad one gets its `error`, never the whole file)
      → chat lines grouped by prefix and choices, each group scored in one pass continuing its
        cached prefix (found by itself: `core/conversation.py`) → append the window's answers to
        OUTPUT.partial → fsync → progress record → … → rename to OUTPUT

A request line is `{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}`,
the body a chat completion with choices (`wire/chat_request.py`), or `"url": "/v1/completions"` with
a completion asking for the prompt's log-probabilities (`wire/completions.py`), or
`"url": "/v1/classify"` in vLLM's pooling shape for a task given to the job, answered as the service
answers them (a task's lines of a window are scored together). An answer line is the Batch API's
`{"id", "custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}`, or for
a line that cannot be answered `{"id", "custom_id", "response": null, "error": {"code", "message"}}`.
Windows are fixed by line number, and the ids and `created` times are derived from the line and
the run's start, so a resumed run writes the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time

import numpy as np
import pandas as pd

from ..classifier import Classifier, EngineSettings, item_text
from ..core.config_check import context_limit
from ..core.conversation import ChoicePrompt, ChoiceScorer
from ..core.encode import invalid_text_at
from ..core.prefix_caches import PrefixCaches, check_prefix_cache_mb
from ..core.settings import check_served_names
from ..core.task import Task
from ..errors import InputError
from ..io.checkpoint import Checkpoint, digest, input_fingerprint
from ..io.formats import check_not_input
from ..io.lock import OutputLock
from ..io.sink import open_sink
from ..models.loading import model_id
from ..models.prepare import load_model
from ..models.schedule import scheduled
from ..serve.adapter import TaskRunner
from ..wire.chat_request import ChatAsk, chat_completion, chat_prompt, unknown_model
from ..wire.completions import completion_ask, completion_choice, completion_response, completion_rows, row_logprobs
from ..wire.pooling import pooling_response, pooling_task
from .resume import same_kernels, same_model, saved_run, writing
from .table_request import check_resume
from .meter import MeterFactory, no_meter

URLS = ("/v1/chat/completions", "/v1/completions", "/v1/classify")
COLUMNS = ["id", "custom_id", "response", "error"]


@dataclasses.dataclass(frozen=True)
class BatchRequest:
    """Which request file to answer into which output, and how."""

    input_path: str
    """An OpenAI Batch API input file: JSON Lines of requests."""
    output_path: str
    """The answers, JSON Lines, one per request line in order."""
    prefix_cache_mb: float = 256.0
    """Memory for the cached heads of the conversations (least recently used dropped beyond it)."""
    resume: bool = False
    restart: bool = False
    served_model_names: tuple[str, ...] = ()
    """The ids request lines name the model by (none: the model's own id, `models.loading.model_id`),
    as `serve --served-model-name` takes them."""

    def __post_init__(self) -> None:
        check_resume(self.resume, self.restart)
        check_prefix_cache_mb(self.prefix_cache_mb)
        check_served_names(self.served_model_names)
        if self.input_path == "-" or self.output_path == "-":
            raise InputError("batch reads a file and writes a file (not - for stdin or stdout): it is resumable")


@dataclasses.dataclass(frozen=True)
class BatchSummary:
    """What a finished batch run did."""

    model: str
    model_ids: tuple[str, ...]
    """The ids its request lines could name it by."""
    lines: int
    answered: int
    """Lines answered with status 200."""
    refused: dict[str, int]
    """Lines answered with an error, by error code."""
    items_per_s: float
    """Answered lines per second of scoring (parsing, tokenizing and the engine; not the load)."""
    head_tokens: dict[str, int]
    """The conversations' prefix tokens (`head_tokens`, as the progress record has kept them): "computed" (a cache miss) and "reused" (read from the cache)."""
    resumed_at: int
    output: str


@dataclasses.dataclass
class _RunState:
    """The figures kept across windows (saved in the progress record)."""

    rows: int = 0
    resumed_at: int = 0
    answered: int = 0
    refused: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    head_tokens: dict = dataclasses.field(default_factory=lambda: {"computed": 0, "reused": 0})

    def to_json(self) -> dict:
        return {"answered": self.answered, "refused": self.refused, "seconds": self.seconds,
                "head_tokens": self.head_tokens}


def run_batch(request: BatchRequest, settings: EngineSettings, tasks: dict[str, Task] | None = None, *, model=None,
              meter: MeterFactory = no_meter) -> BatchSummary:
    """Answer every request line of `request.input_path` into `request.output_path`; `tasks` (name →
    Task) answer `/v1/classify` lines whose `model` names them."""
    check_not_input(request.input_path, request.output_path)
    with OutputLock(request.output_path):
        return _run_batch(request, settings, tasks or {}, model, meter)


def _run_batch(request: BatchRequest, settings: EngineSettings, tasks: dict[str, Task], model,
               meter: MeterFactory) -> BatchSummary:
    checkpoint = Checkpoint(request.output_path)
    try:
        fingerprint = input_fingerprint(request.input_path)
    except OSError as exc:
        raise InputError(f"cannot read {request.input_path}: {exc.strerror}") from None
    shown = {"window": settings.window, "token_budget": settings.token_budget, "max_rows": settings.max_rows}
    shown["served_model_names"] = list(request.served_model_names)  # which lines' model is known
    identity = {"input": fingerprint, "settings": digest([repr(settings), shown]), "settings_shown": shown,
                "task": digest(repr(sorted(tasks.items()))), "task_shown": {"tasks": sorted(tasks)},
                "created": _now()}
    saved = saved_run(checkpoint, identity, request.resume, request.restart, request.input_path, "jsonl")
    loaded = load_model(model, settings.device, settings.precision, task=next(iter(tasks.values()), None),
                        settings=settings)
    same_model(saved, identity, loaded, checkpoint)
    same_kernels(saved, identity, loaded, checkpoint)
    created = saved["created"] if saved is not None else identity["created"]
    state = _RunState()
    if saved is not None:
        state = _RunState(rows=saved["rows_done"], resumed_at=saved["rows_done"], **saved["state"])
    settings, _schedule = scheduled(settings, loaded)  # batched as offline classify is, on this machine
    if saved is not None and "schedule" in saved:  # the batches the first run made, should the measurement move
        settings = dataclasses.replace(settings, **saved["schedule"])
    identity["schedule"] = {"token_budget": settings.token_budget, "max_rows": settings.max_rows}
    runners = {name: TaskRunner(name, Classifier(task, model=loaded, settings=settings)) for name, task in tasks.items()}
    names = request.served_model_names or (model_id(loaded.name),)
    answer = _Answerer(loaded, names, settings, request.prefix_cache_mb, state, created, runners)
    lines = _Lines(request.input_path, skip=state.rows)
    sink = open_sink(request.output_path, checkpoint, "jsonl", COLUMNS, saved, True, identity, "strict")
    bar = meter(None, lines.size, state.rows)
    with writing(sink, state, bar, lines.close):
        for start, window in lines.windows(settings.window):
            began = time.perf_counter()
            frame = pd.DataFrame(answer.window(start, window), columns=COLUMNS)
            state.seconds += time.perf_counter() - began
            state.rows += len(window)
            sink.write(frame, state, lines.read_digest())
            bar.update(len(window), lines.bytes_read)
    return BatchSummary(model=loaded.name, model_ids=names, lines=state.rows, answered=state.answered, refused=dict(state.refused),
                        items_per_s=state.answered / state.seconds if state.seconds else 0.0,
                        head_tokens=dict(state.head_tokens), resumed_at=state.resumed_at,
                        output=request.output_path)


class _Answerer:
    """Answers one window of request lines: parse, group the chat lines by key, score each group."""

    def __init__(self, loaded, names: tuple[str, ...], settings: EngineSettings, prefix_cache_mb: float,
                 state: _RunState, created: int, runners: dict[str, TaskRunner]):
        self.loaded, self.names, self.settings, self.state, self.created = loaded, names, settings, state, created
        self.runners = runners
        self.context = context_limit(loaded.model.config)
        self.caches = PrefixCaches(loaded.engine, int(prefix_cache_mb * 2**20), self._observe)
        self.scorers: dict[tuple, ChoiceScorer] = {}

    def _observe(self, event: str, tokens: int) -> None:
        if event == "miss":
            self.state.head_tokens["computed"] += tokens

    def window(self, start: int, lines: list[bytes]) -> list[dict]:
        """One answer per line, in order."""
        answers: list[dict | None] = [None] * len(lines)
        asked: dict[int, tuple[str, dict, ChoicePrompt, ChatAsk]] = {}
        classify: dict[str, list[tuple[int, str, dict, list[str]]]] = {}  # task → its lines of this window
        for k, raw in enumerate(lines):
            custom_id = None
            try:
                custom_id, url, body = _request(raw, start + k)
                if (where := invalid_text_at(body)) is not None:  # the service's 400 (`serve/chat.py`)
                    raise InputError(f"body.{where} is not valid Unicode (it holds a lone surrogate); send UTF-8 text")
                if url != "/v1/classify" and (unknown := unknown_model(body.get("model"), self.names,
                                                                       self.runners)) is not None:
                    raise InputError(unknown)  # the service's 404
                if url == "/v1/completions":  # its own engine rows: its trie is its own
                    answers[k] = self._completed(start + k, custom_id, body)
                    continue
                if url == "/v1/classify":
                    name, texts = self._pooling(body)
                    classify.setdefault(name, []).append((k, custom_id, body, texts))
                    continue
                if body.get("stream"):
                    raise InputError("stream is not supported in a batch file: each line's answer is written whole; "
                                     "send stream: false")
                ask, prompt = chat_prompt(body, self.loaded.tokenizer, self.context)
                asked[k] = custom_id, body, prompt, ask
            except InputError as exc:
                answers[k] = self._refused(start + k, custom_id, str(exc))
            except Exception as exc:  # noqa: BLE001 - a line the checks missed fails alone, never the file
                answers[k] = self._refused(start + k, custom_id, f"cannot be answered ({type(exc).__name__}: {exc}): "
                                           "a bug in slmclassify, please report it with this line", "server_error")
        groups: dict[tuple, list[int]] = {}
        for k, (_id, _body, prompt, _ask) in asked.items():
            groups.setdefault(prompt.key, []).append(k)
        for key, members in groups.items():
            scorer = self.scorers.get(key)
            if scorer is None:
                scorer = self.scorers[key] = ChoiceScorer(self.loaded.tokenizer, self.loaded.model.config,
                                                          self.settings, asked[members[0]][2])
            items = scorer.encode([asked[k][2] for k in members])
            scores = scorer.score(items, self.loaded.engine, self.caches).scores
            self.state.head_tokens["reused"] += len(scorer.prefix_ids) * int(items.cached.sum())
            for k, row in zip(members, scores):
                answers[k] = self._answered(start + k, *asked[k], row)
        for name, asking in classify.items():
            self._classified(start, self.runners[name], asking, answers)
        if len(self.scorers) > 256:  # keys of earlier windows; their prefixes stay in the LRU
            self.scorers.clear()
        return answers

    def _answered(self, line: int, custom_id, body: dict, prompt: ChoicePrompt, ask: ChatAsk,
                  scores: np.ndarray) -> dict:
        return self._ok(line, custom_id, chat_completion(body, prompt, scores, ask), "chatcmpl")

    def _pooling(self, body: dict) -> tuple[str, list[str]]:
        """(the task, the texts) of a `/v1/classify` line in vLLM's pooling shape."""
        name, texts = pooling_task(body.get("model"), self.runners, self.names), body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise InputError("input must be a string or a non-empty list of strings")
        for index, text in enumerate(texts):
            item_text(text, index, where="input")  # a lone surrogate is refused, naming it
        return name, texts

    def _classified(self, start: int, runner: TaskRunner, asking: list, answers: list) -> None:
        """Every text of a task's lines in one encoding and one scoring pass; each line's results."""
        texts = [t for *_, line_texts in asking for t in line_texts]
        encoded = runner.encode(texts)
        scores = runner.empty_scores(len(texts))
        if encoded.scored:
            got, _work = runner.score([(encoded, i) for i in encoded.scored])
            scores[list(encoded.scored)] = got
        results = runner.results(scores, encoded.status)
        offset = 0
        for k, custom_id, body, line_texts in asking:
            n = len(line_texts)
            tokens = sum(encoded.items.prompt_length(i) for i in range(offset, offset + n))
            response = pooling_response(body["model"], runner.labels, results[offset: offset + n], tokens, "", 0)
            answers[k] = self._ok(start + k, custom_id, response, "classify")
            offset += n

    def _completed(self, line: int, custom_id, body: dict) -> dict:
        tokenizer = self.loaded.tokenizer
        ask = completion_ask(body, tokenizer, self.context)
        answer = {}
        for row in completion_rows(ask):
            answer.update(row_logprobs(self.loaded.engine, tokenizer.pad_token_id, row, ask))
        choices = [completion_choice(k, ask, ids, *answer[k], tokenizer) for k, ids in enumerate(ask.prompts)]
        return self._ok(line, custom_id, completion_response(body, ask, choices), "cmpl")

    def _ok(self, line: int, custom_id, body: dict, kind: str) -> dict:
        self.state.answered += 1
        body["id"] = f"{kind}-{_derived(self.created, line)}"
        body["created"] = self.created
        return {"id": f"batch_req_{_derived(self.created, line)}", "custom_id": custom_id,
                "response": {"status_code": 200, "request_id": _derived(self.created, line), "body": body},
                "error": None}

    def _refused(self, line: int, custom_id, message: str, code: str = "invalid_request_error") -> dict:
        self.state.refused[code] = self.state.refused.get(code, 0) + 1
        return {"id": f"batch_req_{_derived(self.created, line)}", "custom_id": custom_id, "response": None,
                "error": {"code": code, "message": f"line {line + 1}: {message}"}}


def _request(raw: bytes, index: int) -> tuple[str, str, dict]:
    """(custom_id, url, body) of one request line; InputError says what is wrong with it."""
    try:
        line = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"not a JSON object ({exc})") from None
    if not isinstance(line, dict):
        raise InputError("not a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str):
        raise InputError("custom_id must be a string")
    if line.get("method", "POST") != "POST":
        raise InputError(f"method {line.get('method')!r}: only POST is supported")
    if line.get("url") not in URLS:
        raise InputError(f"url {line.get('url')!r}: supported are {', '.join(URLS)} (chat completions with choices, "
                         "completions with the prompt's log-probabilities)")
    if not isinstance(line.get("body"), dict):
        raise InputError("body must be a JSON object: the request")
    return custom_id, line["url"], line["body"]


def _now() -> int:
    """The run's start, in the answers' `created` (a resumed run keeps its first run's)."""
    return int(time.time())


def _derived(created: int, line: int) -> str:
    return hashlib.sha256(f"{created}:{line}".encode()).hexdigest()[:24]


class _Lines:
    """The input's lines, a window at a time, and the digest of the bytes read (for --resume)."""

    def __init__(self, path: str, skip: int):
        self.fh = open(path, "rb")  # noqa: SIM115 - closed by close()
        self.size = self.fh.seek(0, 2)
        self.fh.seek(0)
        self.digest, self.bytes_read, self.index = hashlib.sha256(), 0, 0
        for _ in range(skip):
            if not self._next():
                raise InputError(f"{path} has fewer lines than the {skip} already answered")

    def _next(self) -> bytes | None:
        raw = self.fh.readline()
        if not raw:
            return None
        self.digest.update(raw)
        self.bytes_read += len(raw)
        self.index += 1
        return raw

    def windows(self, size: int):
        """(index of the first line, [raw lines without their newline]) per window of `size` lines."""
        while True:
            start, window = self.index, []
            while len(window) < size and (raw := self._next()) is not None:
                window.append(raw.rstrip(b"\r\n"))
            if window:
                yield start, window
            if len(window) < size:
                return

    def read_digest(self) -> dict:
        return {"bytes": self.bytes_read, "sha256": self.digest.hexdigest()}

    def close(self) -> None:
        self.fh.close()
