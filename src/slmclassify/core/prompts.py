"""Render prompts with the model's chat template, and split off the prefix every prompt shares.

Layout of one prompt (chat template of the model):

    [system turn: instruction + labels][examples as earlier turns][user turn start | ITEM | user turn end][generation prompt]
    \\__________________________ before (same for every item) ______________________/        \\____ after (same) ____/

Families differ only in what their templates render: Gemma's has no system role (the system text
joins the first user turn), Qwen3's and SmolLM3's add an empty think block before the answer
(`enable_thinking=False`); the before / item / after split below holds for each. A tokenizer without a
chat template (a base model) gets `PLAIN_TEMPLATE`: the instruction and labels, the examples as
`Input:` / `Label:` pairs, then the item and the answer cue `Label: ` (docs/models.md).

`PromptRenderer.render(text)` is `before + user_template(text) + after` when the template is *linear*
(renders the item verbatim), which is checked once with probe texts; otherwise each item is
rendered through the template. The token prefix reused through the KV cache is taken from the
text before the item; `encode.py` checks per item that the full prompt really starts with those tokens.
"""

from __future__ import annotations

from ..errors import TaskError
from .task import Task

ITEM_MARK = "\u2063SLMCLASSIFY-ITEM\u2063"  # invisible separator: never in templates
_PROBES = ("plain text", "  leading and trailing  ", "line one\nline two\n")

# Used only for tokenizers that have no chat template (base models): a plain transcript.
PLAIN_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}Input: {{ m['content'] }}\n"
    "{% else %}Label: {{ m['content'] }}\n\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}Label: {% endif %}"
)


class PromptRenderer:
    """Turns item texts into full prompt strings for one task and tokenizer."""

    def __init__(self, tokenizer, task: Task):
        self.tokenizer = tokenizer
        self.task = task
        marked = self._render_messages(ITEM_MARK)
        count = marked.count(ITEM_MARK)
        if count != 1:
            raise TaskError(
                f"the model's chat template {'drops' if count == 0 else f'repeats ({count} times)'} the item text "
                "of the last user turn, so items cannot be scored with it; use a model whose chat template "
                "renders each user message once")
        self.before, self.after = marked.split(ITEM_MARK)
        self.linear = all(self._render_messages(p) == self.before + p + self.after for p in _PROBES)

    def messages(self, text: str) -> list[dict[str, str]]:
        """The chat for one item: system turn, examples as earlier turns, the item last."""
        msgs = [{"role": "system", "content": self.task.system_turn()}]
        for ex in self.task.examples:
            msgs.append({"role": "user", "content": self.task.user_turn(ex.text)})
            msgs.append({"role": "assistant", "content": ex.label})
        msgs.append({"role": "user", "content": self.task.user_turn(text)})
        return msgs

    def render(self, text: str) -> str:
        """The full prompt for one item, ending with the generation prompt."""
        if self.linear:
            return self.before + text + self.after
        return self._render_messages(text)

    def _render_messages(self, item: str) -> str:
        # The mark stands for the *text*; user_template wraps it like a real item.
        return render_chat(self.tokenizer, self.messages(item))


def render_chat(tokenizer, messages: list[dict], *, generation_prompt: bool = True,
                continue_final: bool = False) -> str:
    """The prompt the model's chat template renders for `messages`, ending with the generation prompt
    (`PLAIN_TEMPLATE` for a tokenizer without one); `generation_prompt` False or `continue_final`
    (the last message left open) as vLLM's /tokenize takes them.

    enable_thinking=False: templates with a thinking mode (Qwen3, SmolLM3) render the answer right
    after an empty think block, and answers are scored after exactly that text; templates without
    one ignore the variable."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                         continue_final_message=continue_final,
                                         chat_template=None if getattr(tokenizer, "chat_template", None)
                                         else PLAIN_TEMPLATE, enable_thinking=False)


def chat_template(tokenizer) -> str:
    """The template conversations are rendered with: the tokenizer's own, or `PLAIN_TEMPLATE` where
    it has none (also for clients that render conversations themselves: GET /tokenizer_info)."""
    return getattr(tokenizer, "chat_template", None) or PLAIN_TEMPLATE
