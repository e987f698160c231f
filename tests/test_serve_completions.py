"""OpenAI completions with the prompt's log-probabilities (echo, logprobs, max_tokens 0 or 1), through
the official `openai` client against a running `serve` over a tiny random Llama: every token's
log-probability and the likeliest tokens equal the Hugging Face forward's, and a multiple-choice
question's context is run once for all its continuations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

CONTEXT = "Question: which team handles a double charge on my card?\nAnswer:"
CONTINUATIONS = [" billing", " technical support", " the account team", " billing and refunds"]


def hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] log-softmax after each prefix of `ids`, by the unmodified forward."""
    with torch.inference_mode():
        return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)


def metric(url, name, **labels) -> float:
    want = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_echoed_prompt_logprobs_equal_the_reference_with_the_context_run_once(llama_loaded):
    from test_serve import running

    tokenizer, model = llama_loaded.tokenizer, llama_loaded.model
    prompts = [tokenizer(CONTEXT + c)["input_ids"] for c in CONTINUATIONS]
    with running(llama_loaded) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for max_tokens in (0, 1):
            answer = client.completions.create(model="support", prompt=prompts, echo=True, logprobs=5,
                                               max_tokens=max_tokens, temperature=0)
            assert [c.index for c in answer.choices] == list(range(len(prompts)))
            for ids, choice in zip(prompts, answer.choices):
                want = hf_logprobs(model, ids)  # [n, V]
                lp = choice.logprobs
                assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
                got = np.array(lp.token_logprobs[1: len(ids)], dtype=float)
                assert np.allclose(got, want[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy(), atol=1e-4)
                for p in range(1, len(ids) + max_tokens):
                    best = want[p - 1].topk(5)
                    expected: dict[str, float] = {}
                    for t, v in zip(best.indices.tolist(), best.values.tolist()):  # ids of one text: the likelier
                        expected.setdefault(tokenizer.decode([t]), v)
                    assert lp.top_logprobs[p].keys() == expected.keys()
                    assert np.allclose([lp.top_logprobs[p][k] for k in expected], list(expected.values()), atol=1e-4)
                assert lp.tokens[: len(ids)] == [tokenizer.decode([t]) for t in ids]
                assert lp.text_offset[1] == len(lp.tokens[0])
                if max_tokens:  # the likeliest next token after the whole prompt
                    best = int(want[-1].argmax())
                    assert choice.text == "".join(lp.tokens) and lp.tokens[-1] == tokenizer.decode([best])
                    assert abs(lp.token_logprobs[-1] - float(want[-1, best])) < 1e-4
            assert answer.usage.prompt_tokens == sum(len(p) for p in prompts)
        # the context's tokens ran once for the four continuations, not four times (two requests)
        ran = metric(url, "slmclassify_real_tokens_total", task="completions")
        shared = next(k for k in range(min(map(len, prompts)) + 1)
                      if k == min(map(len, prompts)) or len({p[k] for p in prompts}) > 1)  # tokens all share
        assert shared > 10 and ran <= 2 * (sum(len(p) for p in prompts) - 3 * shared + len(prompts))

        # a string prompt, and only the next token without echo
        answer = client.completions.create(model="support", prompt=CONTEXT, max_tokens=1, logprobs=2)
        ids = tokenizer(CONTEXT)["input_ids"]
        want = hf_logprobs(model, ids)[-1]
        assert answer.choices[0].text == tokenizer.decode([int(want.argmax())])
        assert answer.choices[0].logprobs.token_logprobs == pytest.approx([float(want.max())], abs=1e-4)


def test_what_completions_cannot_answer_is_refused(llama_loaded):
    from test_serve import running

    with running(llama_loaded) as (url, _app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for kw, words in [({"max_tokens": 5}, "free-text generation is not"), ({"max_tokens": 0}, "asks for nothing"),
                          ({"echo": True}, "max_tokens is not given, and the API's default (up to 16 generated "
                                           "tokens) is free text"),
                          ({"max_tokens": 0, "echo": True, "n": 2}, "n and best_of must be 1"),
                          ({"max_tokens": 0, "echo": True, "prompt": [10**9]}, "outside the vocabulary"),
                          ({"max_tokens": 0, "echo": True, "prompt": ""}, "prompt[0] is empty")]:
            with pytest.raises(openai.BadRequestError) as caught:
                client.completions.create(**{"model": "support", "prompt": "hi", **kw})
            assert words in caught.value.body["message"], caught.value.body
