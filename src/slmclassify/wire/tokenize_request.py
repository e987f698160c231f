"""vLLM's tokenizer endpoints, which clients that count or build tokens themselves call (lm-eval's
`tokenizer_backend=remote`): POST /tokenize, POST /detokenize, GET /tokenizer_info. Plain dicts in
and out, as `wire/chat_request.py`'s.

A conversation is rendered exactly as a chat completion renders it (`chat_request.chat_messages`,
`prompts.render_chat`), so the tokens /tokenize gives for `messages` are those the model reads for
a request of those messages (with the system turn they carry).
"""

from __future__ import annotations

from ..core.prompts import chat_template, render_chat
from ..errors import InputError
from .chat_request import StringsAsk, chat_messages


def tokenize_answer(body: dict, tokenizer, context: int) -> dict:
    """{"count", "max_model_len", "tokens", "token_strs"} of a `prompt` (special tokens added unless
    `add_special_tokens` is false) or of `messages` (rendered with the generation prompt unless
    `add_generation_prompt` is false; special tokens not added again unless asked)."""
    if (body.get("prompt") is None) == (body.get("messages") is None):
        raise InputError("give exactly one of prompt (a string) or messages (a list of {\"role\", \"content\"})")
    if body.get("messages") is not None:
        messages = chat_messages(body, StringsAsk(()))  # no answer asked: the conversation as sent
        continue_final = bool(body.get("continue_final_message"))
        generation = body.get("add_generation_prompt", True) and not continue_final
        text = render_chat(tokenizer, messages, generation_prompt=generation, continue_final=continue_final)
        special = bool(body.get("add_special_tokens", False))
    else:
        text = body["prompt"]
        special = body.get("add_special_tokens", True) is not False
    ids = tokenizer(text, add_special_tokens=special)["input_ids"]
    return {"count": len(ids), "max_model_len": context, "tokens": ids,
            "token_strs": tokenizer.convert_ids_to_tokens(ids) if body.get("return_token_strs") else None}


def detokenize_answer(body: dict, tokenizer) -> dict:
    """{"prompt"}: the text of `tokens` (special tokens kept, as vLLM gives them)."""
    tokens = body.get("tokens")
    vocab = len(tokenizer)
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise InputError("tokens must be a list of token ids (integers)")
    outside = [t for t in tokens if not 0 <= t < vocab]
    if outside:
        raise InputError(f"tokens holds {outside[0]}, outside the vocabulary (0 to {vocab - 1})")
    return {"prompt": tokenizer.decode(tokens)}


def tokenizer_info(tokenizer, context: int) -> dict:
    """What vLLM's GET /tokenizer_info gives and lm-eval reads: the special tokens, the chat template
    conversations are rendered with (its own, or the plain one for a tokenizer without one), the
    context length."""
    return {"tokenizer_class": type(tokenizer).__name__, "bos_token": tokenizer.bos_token,
            "eos_token": tokenizer.eos_token, "pad_token": tokenizer.pad_token, "unk_token": tokenizer.unk_token,
            "chat_template": chat_template(tokenizer), "model_max_length": context, "vocab_size": len(tokenizer),
            "add_bos_token": bool(getattr(tokenizer, "add_bos_token", False))}
