"""The FastAPI application: /v1/classify (ours, and vLLM's pooling shape, also at /classify),
/v1/chat/completions (OpenAI's, with choices: `chat.py`), /v1/completions, /v1/models, vLLM's
/tokenize, /detokenize and /tokenizer_info (also under /v1/), /v1/tasks, /healthz, /readyz,
/metrics, /docs.

Handlers run on the event loop and never touch the model: they validate, tokenize (the
tokenizer is used from this one thread only), queue a ticket and await it, while watching for
the client's disconnect and the request timeout. Errors are JSON: {"error": "what is wrong"}, or
OpenAI's {"error": {"message", "type", ...}} on the OpenAI endpoints, whose clients read that.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Literal

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator
from starlette.exceptions import HTTPException

from ..classifier import EngineSettings, item_text
from ..core.config_check import context_limit
from ..core.encode import valid_unicode
from ..errors import InputError
from ..models.loading import LoadedModel
from ..wire.chat_request import chat_chunks, chat_completion, chat_prompt, unknown_model
from ..wire.completions import completion_ask, completion_choice, completion_response
from ..wire.tokenize_request import detokenize_answer, tokenize_answer, tokenizer_info
from ..wire.pooling import UnknownModel, pooling_response, pooling_task
from .adapter import TaskRunner, result_json
from .chat import (ChatRequest, ChoiceRunners, CompletionRequest, CompletionRunner, DetokenizeRequest, TokenizeRequest,
                   prefix_caches)
from .guard import OPENAI_PATHS, Guard, openai_error
from .metrics import Metrics
from .scheduler import QueueFull, Scheduler, Ticket
from .settings import ServeSettings


@dataclass
class Service:
    """Everything the app serves: the tasks (sharing one loaded model) and the scheduler's settings."""

    runners: dict[str, TaskRunner]
    """Task name → its classifier, built at start-up (prefix cache and calibration done)."""
    settings: ServeSettings
    model_names: tuple[str, ...]
    """The ids requests name the model by (`--served-model-name`, or the model's own id)."""
    loaded: LoadedModel
    """The model every task shares; chat requests run on it too."""
    chat_settings: EngineSettings
    """How chat requests are batched: as the first task, or by this machine's measured schedule without one."""
    metrics: Metrics = field(default_factory=Metrics)

    @property
    def model_name(self) -> str:
        """The model's first id: the one answers and listings give."""
        return self.model_names[0]


class ClassifyRequest(BaseModel):
    """Texts to classify with one task: `text` for one, `texts` for several (not both)."""

    model_config = ConfigDict(extra="forbid")
    task: str = Field(description="A task name from GET /v1/tasks.")
    text: str | None = Field(default=None, description="One text.")
    texts: list[str] | None = Field(default=None, min_length=1, description="Several texts, answered in order.")
    items: list[dict[str, str | None]] | None = Field(
        default=None, min_length=1, description="Items of several fields, e.g. {\"subject\": ..., \"body\": ...}, "
                                                "for a task whose user template names them; answered in order.")

    @field_validator("text", "texts", "items")
    @classmethod
    def _unicode(cls, value, info):
        """JSON may spell a lone surrogate (\\ud800), which no tokenizer takes (the Python API refuses it too)."""
        one = info.field_name == "text"
        for index, text in enumerate([value] if one else value or ()):
            fields = text.items() if isinstance(text, dict) else [(None, text)]
            for name, part in fields:
                if part is not None and not valid_unicode(part):
                    where = "text" if one else f"{info.field_name}[{index}]" + (f".{name}" if name else "")
                    raise ValueError(f"{where} is not valid Unicode (it holds a lone surrogate)")
        return value

    @model_validator(mode="after")
    def _one_of(self):
        if sum(x is not None for x in (self.text, self.texts, self.items)) != 1:
            raise ValueError("give exactly one of 'text' (a string), 'texts' (a list of strings) or 'items' (a list "
                             "of objects of fields)")
        return self


class PoolingClassifyRequest(BaseModel):
    """vLLM's pooling API shape (also SGLang's and NVIDIA Dynamo's): `model` names a task (or, with one
    task, the loaded model), `input` is one text or several."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="A task name from GET /v1/models, or the model's name when one task is served.")
    input: str | list[str] = Field(description="One text or several (at least one), answered in order.")
    user: str | None = Field(default=None, description="Accepted and ignored, as by vLLM.")
    priority: int | None = Field(default=None, description="Accepted and ignored: requests are batched by length.")

    @field_validator("input", mode="before")
    @classmethod
    def _texts(cls, value):
        if not (isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ValueError("input must be a string or a list of strings (token ids are not taken: send texts)")
        if not value and isinstance(value, list):
            raise ValueError("input is an empty list: send one text or several")
        for index, text in enumerate([value] if isinstance(value, str) else value):
            if not valid_unicode(text):
                raise ValueError(f"input{'' if isinstance(value, str) else f'[{index}]'} is not valid Unicode "
                                 "(it holds a lone surrogate)")
        return value


def _shape(body) -> str:
    """Which request shape a /v1/classify body is: vLLM's names `input`, ours `task`."""
    return "pooling" if isinstance(body, dict) and "input" in body else "ours"


AnyClassifyRequest = Annotated[Annotated[ClassifyRequest, Tag("ours")] | Annotated[PoolingClassifyRequest,
                                                                                  Tag("pooling")],
                               Discriminator(_shape)]


class ClassifyAnswer(BaseModel):
    label: str | None = Field(description="Predicted label (null for an empty text); a multi-label task's chosen "
                                          "labels joined by its separator.")
    labels: list[str] = Field(default_factory=list, description="The predicted labels: [label], or a multi-label "
                                                                "task's labels at or above their thresholds.")
    confidence: float | None = Field(description="Probability of the predicted label.")
    needs_review: bool = Field(description="Confidence below the task's min_confidence, or no label.")
    probabilities: dict[str, float] = Field(description="Calibrated probability per label, summing to 1 (a "
                                                        "multi-label task's P(yes) of each).")


class ClassifyResult(ClassifyAnswer):
    status: str = Field(description="ok, empty or truncated (text cut to the per-text token cap).")


class QuestionsResult(BaseModel):
    answers: dict[str, ClassifyAnswer] = Field(description="A task of several questions: each question's answer by "
                                                           "its name, in the task's order (GET /v1/tasks).")
    needs_review: bool = Field(description="Any answer needs review.")
    status: str = Field(description="ok, empty or truncated (text cut to the per-text token cap).")


class ClassifyResponse(BaseModel):
    results: list[ClassifyResult | QuestionsResult]


class PoolingClassifyData(BaseModel):
    index: int
    label: str | None = Field(description="The predicted label (null for an empty text).")
    probs: list[float] = Field(description="The calibrated probability of each label, in the task's label order "
                                           "(GET /v1/tasks); a multi-label task's P(yes) of each label.")
    num_classes: int


class PoolingUsage(BaseModel):
    prompt_tokens: int = Field(description="Tokens of the texts' full prompts, the cached prefix included.")
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None


class PoolingClassifyResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[PoolingClassifyData]
    usage: PoolingUsage


class ApiError(HTTPException):
    """An error answered as {"error": message} with the given status and headers."""


class OpenAIError(HTTPException):
    """An error answered in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, which its
    clients read (the OpenAI SDK raises its own exception class per status)."""


def openai_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": openai_error(status, message)}, status_code=status, headers=headers)


def create_app(service: Service):
    """The ASGI app (FastAPI wrapped in the Guard middleware) for a built service."""
    settings = service.settings
    calls = _Calls(service, Scheduler(settings.max_wait_ms, settings.max_queue_items, service.metrics))

    @asynccontextmanager
    async def lifespan(_app):
        calls.scheduler.start()
        yield
        # uvicorn has stopped accepting and waited for in-flight requests; finish what is queued
        await asyncio.to_thread(calls.scheduler.stop, settings.request_timeout_s)

    app = FastAPI(title="slmclassify", version="1", lifespan=lifespan,
                  description="Classify short texts with a small local language model; concurrent "
                              "requests are batched together by length.")
    app.state.scheduler = calls.scheduler
    _error_handlers(app)
    _status_routes(app, service, calls)
    _classify_routes(app, service, calls)
    _completion_routes(app, service, calls)
    _tokenizer_routes(app, service, calls)
    return Guard(app, api_key=settings.api_key, max_body_bytes=settings.max_body_bytes, metrics=service.metrics)


def _error_handlers(app: FastAPI) -> None:
    """Errors as JSON: {"error": ...}, or OpenAI's shape on the OpenAI endpoints."""

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            # FastAPI's words for a body that is not JSON text (an invalid UTF-8 byte): an invalid body
            message = ("invalid request body: it is not JSON text in UTF-8; send the body as UTF-8 JSON with "
                       "'Content-Type: application/json'")
            if request.url.path in OPENAI_PATHS:  # OpenAI answers a malformed request 400, in its shape
                return openai_response(400, message)
            return JSONResponse({"error": message}, status_code=422)
        if isinstance(exc, OpenAIError) or request.url.path in OPENAI_PATHS:
            return openai_response(exc.status_code, exc.detail, exc.headers)
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        hidden = ("body", "ours", "pooling")  # FastAPI's and the request shapes' tags: not the client's field names
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p not in hidden) or 'body'}: {e['msg']}"
                             for e in exc.errors())
        if "json" not in request.headers.get("content-type", ""):
            problems += "; send the body as JSON with 'Content-Type: application/json'"
        if request.url.path in OPENAI_PATHS:  # OpenAI answers a malformed request 400, in its shape
            return openai_response(400, f"invalid request body: {problems}")
        # the offending input is echoed back: a lone surrogate in it could not be encoded as UTF-8
        detail = jsonable_encoder(exc.errors(), custom_encoder={str: _printable})
        return JSONResponse({"error": f"invalid request body: {problems}", "detail": detail}, status_code=422)


class _Calls:
    """What every handler does around its own work: the limits, the readiness and model checks,
    queueing a ticket and waiting for it (or the client's disconnect, or the timeout)."""

    def __init__(self, service: Service, scheduler: Scheduler):
        self.service, self.scheduler = service, scheduler
        self.settings, self.metrics = service.settings, service.metrics

    def check_count(self, n: int) -> None:
        if n > self.settings.max_texts:
            raise ApiError(413, f"{n} texts in one request, over the limit of {self.settings.max_texts} "
                                "(--max-texts); split the request")

    def check_ready(self) -> None:
        if not self.scheduler.alive:
            raise ApiError(503, "the service is not ready or is shutting down", {"Retry-After": "1"})

    def check_model(self, name: str) -> None:
        if (unknown := unknown_model(name, self.service.model_names, self.service.runners)) is not None:
            raise OpenAIError(404, unknown)

    async def run(self, runner, texts: list[str], request: Request):
        """(one Result per text in order, the request's encoding): limits, queue, wait."""
        self.check_count(len(texts))
        request.state.task, request.state.texts = runner.name, len(texts)
        self.check_ready()
        ticket = Ticket(runner, runner.encode(texts))
        if ticket.size:
            results = await self.wait(ticket, request)
        else:  # only empty texts: nothing to run
            results = runner.results(ticket.scores, ticket.encoded.status)
        for r in results:
            self.metrics.items.labels(runner.name, r.status).inc()
        return results, ticket.encoded

    async def wait(self, ticket: Ticket, request: Request):
        """Queue the ticket and wait for its results, the client's disconnect or the timeout."""
        timeout = self.settings.request_timeout_s
        try:
            self.scheduler.submit(ticket)
        except QueueFull as full:
            raise ApiError(503, f"{full}; the service is overloaded",
                           {"Retry-After": str(full.retry_after)}) from None
        started = asyncio.get_running_loop().time()
        answer = asyncio.wrap_future(ticket.future)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({answer, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if answer not in done:
            self.scheduler.cancel(ticket)
            answer.cancel()
            if gone in done:  # nobody will read this; the access log shows the status
                raise ApiError(499, "the client closed the request")
            raise ApiError(504, f"not answered within {timeout:g} s (--request-timeout); "
                                "the service is overloaded, retry later")
        self.metrics.latency.observe(asyncio.get_running_loop().time() - started)
        return answer.result()


def _status_routes(app: FastAPI, service: Service, calls: _Calls) -> None:
    """/healthz, /readyz, /metrics, /v1/tasks and /v1/models."""
    settings = service.settings

    @app.get("/healthz", summary="The process is alive")
    async def healthz():
        return {"status": "alive"}

    @app.get("/readyz", summary="Model loaded, tasks calibrated, worker running")
    async def readyz():
        if not calls.scheduler.alive:
            return JSONResponse({"status": "not ready", "error": "the engine worker is not running"}, 503)
        return {"status": "ready", "model": service.model_name, "tasks": sorted(service.runners)}

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus():
        body, content_type = service.metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/v1/tasks", summary="Tasks, their labels and the service's limits")
    async def tasks():
        return {"model": service.model_name, "model_source": service.loaded.name,
                "tasks": [runner.describe() for runner in service.runners.values()],
                "limits": {"max_texts": settings.max_texts, "max_body_bytes": settings.max_body_bytes,
                           "max_text_tokens": _max_text_tokens(service),
                           "max_queue_items": settings.max_queue_items,
                           "request_timeout_s": settings.request_timeout_s}}

    @app.get("/v1/models", summary="The tasks as OpenAI-style models, then the loaded model")
    async def models():
        names = [*service.runners, *service.model_names]
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "slmclassify"}
                                           for name in names]}


_CLASSIFY_DOC = dict(summary="Classify one text or several: ours ({task, text|texts|items}) or vLLM's pooling "
                             "shape ({model, input})",
                     responses={200: {"model": ClassifyResponse | PoolingClassifyResponse},
                                404: {"description": "Unknown task"},
                                413: {"description": "Too many texts or bytes"},
                                503: {"description": "Queue full or not ready (see Retry-After)"},
                                504: {"description": "Not answered within the request timeout"}})


def _classify_routes(app: FastAPI, service: Service, calls: _Calls) -> None:
    """/v1/classify (and /classify): ours, and vLLM's pooling shape."""

    @app.post("/v1/classify", **_CLASSIFY_DOC)
    @app.post("/classify", include_in_schema=False)
    async def classify(body: AnyClassifyRequest, request: Request):
        if isinstance(body, PoolingClassifyRequest):
            return await _pooling(body, request)
        runner = service.runners.get(body.task)
        if runner is None:
            raise ApiError(404, f"unknown task {body.task!r}; tasks are: {', '.join(sorted(service.runners))}")
        texts = [body.text] if body.text is not None else body.texts if body.texts is not None else body.items
        task = runner.classifier.task
        if (body.items is not None) != task.multi_field:
            raise ApiError(422, f"task {runner.name!r} takes " + (
                f"'items' with the fields {', '.join(task.fields)}" if task.multi_field else "'text' or 'texts'"))
        if body.items is not None:
            calls.check_count(len(texts))
            try:
                texts = [item_text(item, k, task, where="items") for k, item in enumerate(texts)]
            except InputError as exc:
                raise ApiError(422, str(exc)) from None
        results, _encoded = await calls.run(runner, texts, request)
        return {"results": [result_json(r) for r in results]}

    async def _pooling(body: PoolingClassifyRequest, request: Request):
        """vLLM's /v1/classify: `data[i].probs` in the task's label order, `usage` in real prompt tokens."""
        try:
            runner = service.runners[pooling_task(body.model, service.runners, service.model_names)]
        except UnknownModel as exc:
            raise ApiError(404, str(exc)) from None
        except InputError as exc:
            raise ApiError(422, str(exc)) from None
        texts = [body.input] if isinstance(body.input, str) else body.input
        results, encoded = await calls.run(runner, texts, request)
        tokens = sum(encoded.items.prompt_length(i) for i in range(len(texts)))
        return pooling_response(body.model, runner.labels, results, tokens, f"classify-{uuid.uuid4().hex}",
                                int(time.time()))


def _completion_routes(app: FastAPI, service: Service, calls: _Calls) -> None:
    """/v1/chat/completions (answers among choices) and /v1/completions (the prompt's log-probabilities)."""
    settings, metrics = service.settings, service.metrics
    chat_runners = ChoiceRunners(service.loaded, service.chat_settings,
                                 prefix_caches(service.loaded.engine, settings.prefix_cache_mb, metrics), metrics)
    context = context_limit(service.loaded.model.config)

    @app.post("/v1/chat/completions", summary="OpenAI chat completion whose answer is one of given strings "
                                              "(structured_outputs.choice, guided_choice, a response_format enum) or "
                                              "an object of such choices (a response_format object schema, a tool "
                                              "call), each scored whole")
    async def chat_completions(body: ChatRequest, request: Request):
        calls.check_model(body.model)
        asked = body.model_dump()
        try:
            ask, prompt = chat_prompt(asked, service.loaded.tokenizer, context)
        except InputError as exc:
            raise OpenAIError(400, str(exc)) from None
        request.state.task, request.state.texts = "chat", 1
        calls.check_ready()
        runner = chat_runners.runner(prompt)
        scores = await calls.wait(Ticket(runner, runner.encode(prompt)), request)
        metrics.items.labels(runner.name, "ok").inc()
        completion = chat_completion(asked, prompt, scores[0], ask)
        if not body.stream:
            return completion
        # streaming clients (LangChain and others stream by default): the whole answer in one chunk
        events = "".join(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n" for chunk in chat_chunks(completion))
        return Response(events + "data: [DONE]\n\n", media_type="text/event-stream")

    @app.post("/v1/completions", summary="OpenAI completion with the prompt's log-probabilities (echo, logprobs, "
                                         "max_tokens 0 or 1): prompts that share a context computed once")
    async def completions(body: CompletionRequest, request: Request):
        calls.check_model(body.model)
        asked = body.model_dump()
        tokenizer = service.loaded.tokenizer
        try:
            ask = completion_ask(asked, tokenizer, context)
        except InputError as exc:
            raise OpenAIError(400, str(exc)) from None
        request.state.task, request.state.texts = "completions", len(ask.prompts)
        calls.check_count(len(ask.prompts))
        calls.check_ready()
        runner = CompletionRunner(service.loaded.engine, tokenizer.pad_token_id, ask)
        answers = await calls.wait(Ticket(runner, runner.encode()), request)
        metrics.items.labels(runner.name, "ok").inc(len(ask.prompts))
        return completion_response(asked, ask, [completion_choice(k, ask, ids, *answers[k], tokenizer)
                                                for k, ids in enumerate(ask.prompts)])


_TOKENIZER_DOC = "vLLM's tokenizer endpoints (lm-eval's tokenizer_backend=remote), also under /v1/"


def _tokenizer_routes(app: FastAPI, service: Service, calls: _Calls) -> None:
    """vLLM's /tokenize, /detokenize and /tokenizer_info (also under /v1/)."""
    tokenizer, context = service.loaded.tokenizer, context_limit(service.loaded.model.config)

    @app.post("/tokenize", summary="Tokens of a prompt, or of messages as a chat completion renders them; "
                                   + _TOKENIZER_DOC)
    @app.post("/v1/tokenize", include_in_schema=False)
    async def tokenize(body: TokenizeRequest):
        if body.model is not None:
            calls.check_model(body.model)
        try:
            return tokenize_answer(body.model_dump(), tokenizer, context)
        except InputError as exc:
            raise OpenAIError(400, str(exc)) from None

    @app.post("/detokenize", summary="The text of token ids; " + _TOKENIZER_DOC)
    @app.post("/v1/detokenize", include_in_schema=False)
    async def detokenize(body: DetokenizeRequest):
        if body.model is not None:
            calls.check_model(body.model)
        try:
            return detokenize_answer(body.model_dump(), tokenizer)
        except InputError as exc:
            raise OpenAIError(400, str(exc)) from None

    @app.get("/tokenizer_info", summary="Special tokens, chat template and context length; " + _TOKENIZER_DOC)
    @app.get("/v1/tokenizer_info", include_in_schema=False)
    async def tokenizer_information():
        return tokenizer_info(tokenizer, context)


async def _disconnected(request: Request) -> None:
    """Return once the client has gone away (the body was read already, so only
    http.disconnect can arrive)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _max_text_tokens(service: Service) -> int | None:
    caps = {r.max_text_tokens for r in service.runners.values()}
    return caps.pop() if len(caps) == 1 else None
