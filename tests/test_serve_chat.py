"""OpenAI chat completions with choices, through the official `openai` client against a running
`serve` over a tiny random Llama: each whole choice's log-probability equals the Hugging Face
forward's on the same rendered tokens, and requests with one system turn share one cached prefix."""

from __future__ import annotations

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from slmclassify.models.loading import model_id  # noqa: E402
from slmclassify.core.config_check import context_limit  # noqa: E402
from slmclassify.core.conversation import choice_prompt  # noqa: E402
from slmclassify.core.reference import reference_scores  # noqa: E402
from slmclassify.errors import InputError  # noqa: E402
from slmclassify.core.prefix_caches import PrefixCaches  # noqa: E402

SYSTEM = "Route the support ticket to a team. Answer with the team's name only."
CHOICES = ["billing", "technical support", "account"]
TICKETS = ["My card was charged twice for the same invoice.", "The app crashes when I open settings.",
           "Please change the email on my profile.", "refund", "login error crash after the update today"]


def chat(ticket: str, system: str = SYSTEM) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": ticket}]


def reference(loaded, messages, choices) -> np.ndarray:
    """Each whole choice's log-probability after the rendered conversation, by the unmodified forward."""
    prompt = choice_prompt(loaded.tokenizer, messages, tuple(choices), context_limit(loaded.model.config))
    rendered = loaded.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert list(prompt.prompt_ids) == loaded.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return reference_scores(loaded.model, list(prompt.prompt_ids), prompt.trie).double().numpy()


def metric(url, name, **labels) -> float:
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_choices_in_every_spelling_equal_the_reference_and_share_one_prefix(llama_loaded):
    from test_serve import running

    with running(llama_loaded) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for ticket in TICKETS:
            want = reference(llama_loaded, chat(ticket), CHOICES)
            for extra in ({"structured_outputs": {"choice": CHOICES}}, {"guided_choice": CHOICES}):
                answer = client.chat.completions.create(model="support", messages=chat(ticket), logprobs=True,
                                                        top_logprobs=3, temperature=0, max_tokens=5,
                                                        extra_body=extra)
                top = {e.token: e.logprob for e in answer.choices[0].logprobs.content[0].top_logprobs}
                assert np.allclose([top[c] for c in CHOICES], want, atol=1e-4), (top, want)
                assert answer.choices[0].message.content == CHOICES[int(np.argmax(want))]
                assert answer.choices[0].finish_reason == "stop"
                assert answer.usage.prompt_tokens == len(choice_prompt(
                    llama_loaded.tokenizer, chat(ticket), tuple(CHOICES), 10**6).prompt_ids)
        # one system turn: its prefix computed once, every later batch finds it
        assert metric(url, "slmclassify_prefix_cache_lookups_total", result="miss") == 1
        assert metric(url, "slmclassify_prefix_cache_lookups_total", result="hit") >= 1
        assert metric(url, "slmclassify_prefix_tokens_total", how="reused") > 0

        # response_format with a string enum: the answer is JSON, the enum's strings scored as the choices are
        schema = {"type": "json_schema", "json_schema": {"name": "team", "schema": {"type": "string",
                                                                                     "enum": CHOICES}}}
        answer = client.chat.completions.create(model=model_id(llama_loaded.name), messages=chat(TICKETS[0]),
                                                response_format=schema, logprobs=True, top_logprobs=3)
        want = reference(llama_loaded, chat(TICKETS[0]), CHOICES)
        assert answer.choices[0].message.content == f'"{CHOICES[int(np.argmax(want))]}"'
        top = {e.token: e.logprob for e in answer.choices[0].logprobs.content[0].top_logprobs}
        assert np.allclose([top[c] for c in CHOICES], want, atol=1e-4)
        # no logprobs asked: none given
        assert client.chat.completions.create(model="support", messages=chat(TICKETS[1]),
                                              extra_body={"guided_choice": CHOICES}).choices[0].logprobs is None


def test_what_cannot_be_answered_is_refused_in_openai_shape(llama_loaded):
    from test_serve import running

    with running(llama_loaded, api_key="sesame") as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sesame", max_retries=0)
        refused = [
            (openai.BadRequestError, {}, "free-text generation is not supported"),
            (openai.BadRequestError, {"extra_body": {"guided_choice": CHOICES}, "n": 2}, "n=2"),
            (openai.BadRequestError, {"extra_body": {"guided_choice": ["a", "a"]}}, "given twice"),
            (openai.BadRequestError, {"extra_body": {"guided_choice": CHOICES,
                                                    "structured_outputs": {"choice": CHOICES}}}, "constrained twice"),
            (openai.BadRequestError, {"response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object"}}}}, "must be an object schema"),
            (openai.NotFoundError, {"model": "gpt-4o", "extra_body": {"guided_choice": CHOICES}}, "does not exist"),
        ]
        for error, kw, words in refused:
            with pytest.raises(error) as caught:
                client.chat.completions.create(**{"model": "support", "messages": chat("hi"), **kw})
            assert words in caught.value.body["message"], caught.value.body
        with pytest.raises(openai.BadRequestError, match="the last message must be the user's"):
            client.chat.completions.create(model="support", messages=[*chat("hi"), {"role": "assistant",
                                                                                   "content": "billing"}],
                                           extra_body={"guided_choice": CHOICES})
        with pytest.raises(openai.BadRequestError, match="messages"):  # malformed: 400 in OpenAI's shape too
            client.chat.completions.create(model="support", messages=[], extra_body={"guided_choice": CHOICES})
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).chat.completions.create(
                model="support", messages=chat("hi"), extra_body={"guided_choice": CHOICES})


def test_a_choice_that_begins_another_is_scored_with_the_end_of_turn(llama_loaded):
    prompt = choice_prompt(llama_loaded.tokenizer, chat("refund please"), ("yes", "yes please"), 10**6)
    assert prompt.trie.mode == "full"
    assert len({seq[-1] for seq in prompt.trie.sequences}) == 1  # both end with the end of turn
    with pytest.raises(InputError, match="the last message must be the user's"):
        choice_prompt(llama_loaded.tokenizer, [{"role": "system", "content": "x"}], ("a", "b"), 10**6)
    with pytest.raises(InputError, match="over the model's 8"):
        choice_prompt(llama_loaded.tokenizer, chat("refund please"), ("a", "b"), 8)


def test_prefix_caches_keep_the_most_recent_within_their_bytes(llama_loaded):
    engine, heard = llama_loaded.engine, []
    heads = [tuple(range(5, 5 + n)) for n in (6, 7, 8)]
    one = sum(t.numel() * t.element_size() for c in [engine.prefill(list(heads[2]))] for t in (*c.keys, *c.values))
    caches = PrefixCaches(engine, max_bytes=one, observe=lambda event, tokens: heard.append((event, tokens)))
    for head in heads:  # room for the longest head alone
        caches.get(head)
    assert caches.heads == [heads[2]] and caches.bytes <= one
    caches.get(heads[2])
    caches.get(heads[0])
    assert caches.heads == [heads[0]]
    assert heard == [("miss", 6), ("miss", 7), ("miss", 8), ("hit", 8), ("miss", 6)]
    assert PrefixCaches(engine, max_bytes=0).get(heads[0]).tokens == len(heads[0])


def test_a_service_without_tasks_answers_chat_and_lists_the_model(llama_loaded):
    from fastapi.testclient import TestClient

    from slmclassify import EngineSettings
    from slmclassify.serve import ServeSettings
    from slmclassify.serve.app import create_app
    from slmclassify.serve.server import build_service

    service = build_service({}, llama_loaded, EngineSettings(), ServeSettings(prefix_cache_mb=0))
    with TestClient(create_app(service)) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [model_id(llama_loaded.name)]
        body = {"model": model_id(llama_loaded.name), "messages": chat(TICKETS[0]), "guided_choice": CHOICES, "logprobs": True,
                "top_logprobs": 3}
        answer = client.post("/v1/chat/completions", json=body).json()
        want = reference(llama_loaded, chat(TICKETS[0]), CHOICES)
        top = {e["token"]: e["logprob"] for e in answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}
        assert np.allclose([top[c] for c in CHOICES], want, atol=1e-4)  # no prefix kept: the head computed again
        assert client.post("/v1/classify", json={"task": "support", "text": "hi"}).status_code == 404


def test_a_lone_surrogate_anywhere_in_an_openai_body_is_a_400_naming_the_field(llama_loaded):
    """Before: a lone surrogate (valid JSON, "\\ud800") in a chat message's content or a completions prompt
    reached the tokenizer and the service answered 500. Now one check of every string of the body
    (`core.encode.invalid_text_at`) answers 400 in OpenAI's shape, naming the field; the next request
    is answered as usual."""
    import json

    from test_serve import running

    bad = [("/v1/chat/completions", {"model": "support", "messages": chat("hi \ud800"), "guided_choice": CHOICES},
            "messages[1].content"),
           ("/v1/chat/completions", {"model": "support", "messages": chat("hi"), "guided_choice": ["billing", "\udc00x"]},
            "guided_choice[1]"),
           ("/v1/completions", {"model": "support", "prompt": "a \ud800 b", "echo": True, "max_tokens": 0}, "prompt"),
           ("/v1/completions", {"model": "support", "prompt": ["fine", "\ud800"], "echo": True, "max_tokens": 0},
            "prompt[1]")]
    with running(llama_loaded) as (url, _app):
        for path, body, field in bad:
            answer = httpx.post(f"{url}{path}", content=json.dumps(body), timeout=30,
                                headers={"Content-Type": "application/json"})
            assert answer.status_code == 400, (path, answer.text)
            error = answer.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert f"{field} is not valid Unicode (it holds a lone surrogate)" in error["message"], error
        good = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                          json={"model": "support", "messages": chat("refund"), "guided_choice": CHOICES})
        assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] in CHOICES


@pytest.mark.parametrize("name, want", [
    ("SmolLM2-135M-Instruct (embedded GGUF)", "smollm2-135m-instruct"),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),  # a hub id as given
    ("/data/My Models/tiny llama", "tiny-llama"),  # a folder's own name, one word
    ("/data/models/smollm2-135m-instruct-q8_0.gguf", "smollm2-135m-instruct-q8_0"),
])
def test_a_model_id_is_one_word(name, want):
    """Before: GET /v1/models listed "SmolLM2-135M-Instruct (embedded GGUF)", whose spaces broke shell
    loops, litellm ids and lm-eval's output folders."""
    assert model_id(name) == want


def test_served_model_names_are_the_ids_every_route_takes(llama_loaded):
    """`--served-model-name` (repeatable): GET /v1/models lists them, chat, completions and vLLM's
    classify take each, answers name the one asked; another id is a 404 listing them; a name with a
    space or given twice is refused where the settings are made."""
    from fastapi.testclient import TestClient

    from slmclassify import EngineSettings
    from slmclassify.errors import FieldError
    from slmclassify.serve import ServeSettings
    from slmclassify.serve.app import create_app
    from slmclassify.serve.server import build_service

    service = build_service({}, llama_loaded, EngineSettings(), ServeSettings(served_model_names=("tiny", "alias")))
    with TestClient(create_app(service)) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny", "alias"]
        body = {"messages": chat(TICKETS[0]), "guided_choice": CHOICES, "logprobs": True}
        answers = [client.post("/v1/chat/completions", json={"model": name, **body}).json() for name in ("tiny", "alias")]
        assert [a["model"] for a in answers] == ["tiny", "alias"]
        assert answers[0]["choices"] == answers[1]["choices"]
        done = client.post("/v1/completions", json={"model": "alias", "prompt": "hi", "max_tokens": 1})
        assert done.status_code == 200, done.text
        unknown = client.post("/v1/chat/completions", json={"model": model_id(llama_loaded.name), **body})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["message"].endswith("GET /v1/models lists 'tiny', 'alias'")
    for names, words in [(("a b",), "served_model_name must be a non-empty id without spaces, got 'a b'"),
                         (("x", "x"), "served_model_name is given twice with the same id: x")]:
        with pytest.raises(FieldError, match=words):
            ServeSettings(served_model_names=names)


def test_every_error_on_the_openai_routes_is_in_openais_shape(llama_loaded):
    """Before: the 401 (and the 413) came as {"error": "..."} where the 400s and 404s were OpenAI's
    {"error": {"message", "type", "param", "code"}}, which the SDK reads into its exception. Ours
    (/v1/classify, /v1/tasks) keep their own shape."""
    from test_serve import running

    with running(llama_loaded, api_key="s3cret", max_body_bytes=4000) as (url, _app):
        wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cres", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.models.list()
        assert refused.value.body == {"message": "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                      "type": "authentication_error", "param": None, "code": 401}
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="support", messages=chat("x" * 5000),
                                           extra_body={"guided_choice": CHOICES})
        assert refused.value.status_code == 413 and refused.value.type == "invalid_request_error"
        assert "over the limit of 4000 bytes" in refused.value.body["message"]
        key = {"authorization": "Bearer s3cret"}
        for path in ("/tokenize", "/v1/tokenize"):
            assert httpx.post(f"{url}{path}", json={"prompt": "hi"}, timeout=30).json()["error"]["code"] == 401
        not_json = httpx.post(f"{url}/v1/chat/completions", content=b'{"model": "\xff"}', timeout=30,
                              headers={**key, "content-type": "application/json"})
        assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "invalid_request_error"
        ours = httpx.post(f"{url}/v1/classify", json={"task": "support", "text": "hi"}, timeout=30)
        assert ours.status_code == 401 and isinstance(ours.json()["error"], str)


def test_tokenizer_endpoints_as_vllm_has_them(llama_loaded):
    """POST /tokenize, /detokenize and GET /tokenizer_info (each also under /v1/), with the bodies
    lm-eval 0.4.13's RemoteTokenizer sends (`lm_eval/utils.py`: {"prompt", "add_special_tokens":
    false}, {"tokens"}, and the info's eos/bos/pad tokens and chat template): a conversation's
    tokens are those a chat completion of it is scored after."""
    from fastapi.testclient import TestClient

    from slmclassify import EngineSettings
    from slmclassify.serve import ServeSettings
    from slmclassify.serve.app import create_app
    from slmclassify.serve.server import build_service

    tokenizer = llama_loaded.tokenizer
    context = context_limit(llama_loaded.model.config)
    service = build_service({}, llama_loaded, EngineSettings(), ServeSettings(served_model_names=("tiny",)))
    with TestClient(create_app(service)) as client:
        for root in ("", "/v1"):
            info = client.get(f"{root}/tokenizer_info").json()
            assert info["eos_token"] == tokenizer.eos_token and info["pad_token"] == tokenizer.pad_token
            assert info["chat_template"] == tokenizer.chat_template and info["model_max_length"] == context
            plain = client.post(f"{root}/tokenize", json={"prompt": TICKETS[0], "add_special_tokens": False}).json()
            want = tokenizer(TICKETS[0], add_special_tokens=False)["input_ids"]
            assert plain == {"count": len(want), "max_model_len": context, "tokens": want, "token_strs": None}
            back = client.post(f"{root}/detokenize", json={"tokens": want}).json()
            assert back == {"prompt": TICKETS[0]}
        named = client.post("/tokenize", json={"model": "tiny", "prompt": "hi", "return_token_strs": True}).json()
        assert named["token_strs"] == tokenizer.convert_ids_to_tokens(named["tokens"])
        conversation = client.post("/tokenize", json={"messages": chat(TICKETS[1])}).json()
        prompt = choice_prompt(tokenizer, chat(TICKETS[1]), tuple(CHOICES), context)
        assert conversation["tokens"] == list(prompt.prompt_ids)
        for path, body, words in [("/tokenize", {"prompt": "a", "messages": chat("b")}, "exactly one of prompt"),
                                  ("/detokenize", {"tokens": [10**9]}, "outside the vocabulary"),
                                  ("/tokenize", {"model": "gpt-4o", "prompt": "a"}, "does not exist")]:
            refused = client.post(path, json=body)
            assert refused.status_code in (400, 404) and words in refused.json()["error"]["message"], refused.text


def test_the_tokenizer_command_writes_a_folder_clients_load(tmp_path, llama_dir, llama_loaded):
    """`slmclassify tokenizer -o FOLDER`: the tokenizer the service uses, as files transformers (and
    lm-eval's tokenizer=FOLDER) load; before, the only copy was the GGUF conversion's hashed cache folder."""
    from transformers import AutoTokenizer

    from helpers import invoke

    result = invoke("tokenizer", "--model", llama_dir, "-o", tmp_path / "tok")
    assert result.stdout.strip() == str(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert loaded(TICKETS[0])["input_ids"] == llama_loaded.tokenizer(TICKETS[0])["input_ids"]
    assert loaded.chat_template == llama_loaded.tokenizer.chat_template
