"""Chat prompts: render messages with the model's own chat template, and find its end-of-turn tokens.

A workload's prompt is either plain text or a chat (a list of ``{"role", "content"}`` messages).
A chat is rendered with the tokenizer's chat template (``chat_template.jinja`` or the
``chat_template`` of ``tokenizer_config.json``), the generation prompt added, exactly as
transformers' ``apply_chat_template(..., tokenize=False, add_generation_prompt=True)`` renders it
(same sandboxed jinja2 environment and variables), then tokenized without adding special tokens
(the template writes them). The template's end-of-turn token (``<|im_end|>``, ``<|eot_id|>`` …)
becomes a stop token besides the model's EOS ids.

Only jinja2 and tokenizers are needed (no transformers), so preflight can measure rendered
prompt lengths exactly as the run will.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Union

from spdflow.errors import RecipeError, StageError

#: A prompt: plain text, or chat messages.
Prompt = Union[str, list]
ROLES = ("system", "user", "assistant", "tool")
TEMPLATE_FILE = "chat_template.jinja"


def is_chat(prompt: Prompt) -> bool:
    return isinstance(prompt, list)


def check_messages(messages: Any, where: str) -> list[dict[str, str]]:
    """``messages`` as a list of {"role", "content"} dicts; a RecipeError naming ``where`` if not."""
    if not isinstance(messages, list) or not messages:
        raise RecipeError(f"{where}: 'messages' must be a non-empty list of {{\"role\": ..., \"content\": ...}} objects")
    checked = []
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise RecipeError(f"{where}: message {number} must be an object with string 'role' and 'content'")
        if message["role"] not in ROLES:
            raise RecipeError(f"{where}: message {number} has role '{message['role']}'; use one of {', '.join(ROLES)}")
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


def as_messages(prompt: Prompt) -> list[dict[str, str]]:
    """A chat's messages; plain text becomes one user message."""
    return prompt if is_chat(prompt) else [{"role": "user", "content": prompt}]


def preview(prompt: Prompt) -> str:
    """The text of a prompt for reports and lint (a chat's last user message)."""
    if not is_chat(prompt):
        return prompt
    users = [m["content"] for m in prompt if m["role"] == "user"]
    return users[-1] if users else prompt[-1]["content"]


# ------------------------------------------------------------------------------- the template


def _special_token(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", ...} in older tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass
class ChatTemplate:
    """A model's chat template and the special-token strings it may refer to."""

    source: str
    where: str
    special_tokens: dict[str, str | None]

    @classmethod
    def find(cls, model_dir: Path) -> "ChatTemplate | None":
        """The template of the tokenizer in ``model_dir``, or None when it has none."""
        model_dir = Path(model_dir)
        config: dict = {}
        config_file = model_dir / "tokenizer_config.json"
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                config = {}
        specials = {name: _special_token(config.get(name)) for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
        template_file = model_dir / TEMPLATE_FILE
        if template_file.is_file():
            return cls(template_file.read_text(encoding="utf-8"), str(template_file), specials)
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if isinstance(template, str) and template.strip():
            return cls(template, str(config_file), specials)
        return None

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat as text, the way transformers' apply_chat_template renders it."""
        import jinja2

        try:
            compiled = _environment().from_string(self.source)
            return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, tools=None,
                                   documents=None, **self.special_tokens)
        except jinja2.TemplateError as exc:
            raise StageError(f"the chat template in '{self.where}' failed to render: {exc}",
                             hint="fix the template, or set workload.chat: false to send plain text") from None

    def end_of_turn(self, tokenizer) -> list[int]:
        """The special tokens that end an assistant turn in this template (``<|im_end|>`` …):
        the special tokens the template writes right after an assistant message's content."""
        marker = "\x00spdflow-reply\x00"
        full = self.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}],
                           add_generation_prompt=False)
        if marker not in full:
            return []
        after = full.split(marker, 1)[1]
        specials = {t.content for t in _added_tokens(tokenizer) if t.special}
        ids = []
        for piece in sorted(specials, key=len, reverse=True):
            at = after.find(piece)
            if at != -1 and not after[:at].strip():  # written right after the content
                token = tokenizer.token_to_id(piece)
                if token is not None:
                    ids.append(int(token))
                break
        eos = self.special_tokens.get("eos_token")
        if eos and tokenizer.token_to_id(eos) is not None:
            ids.append(int(tokenizer.token_to_id(eos)))
        return sorted(set(ids))


def _added_tokens(tokenizer):
    decoder = tokenizer.get_added_tokens_decoder()
    return list(decoder.values())


def _environment():
    """transformers' chat-template environment: sandboxed, trim/lstrip blocks, loop controls."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ------------------------------------------------------------------------------- prompts to ids


@dataclass
class Rendered:
    """A prompt as the model sees it."""

    text: str
    ids: list[int]
    chat: bool


class PromptRenderer:
    """Turns workload prompts into token ids: plain text as it is, chats through the template.

    ``chat`` True renders every prompt as a chat (plain text becomes one user message); False
    sends text as it is (a chat prompt is then an error); None renders chats and leaves text."""

    def __init__(self, tokenizer, model_dir: Path | None, chat: bool | None, model_name: str = "the model"):
        self.tokenizer = tokenizer
        self.chat = chat
        self.template = ChatTemplate.find(model_dir) if model_dir is not None else None
        self.model_name = model_name

    def needs_template(self, prompts: list[Prompt]) -> bool:
        return self.chat is True or (self.chat is None and any(is_chat(p) for p in prompts))

    def check(self, prompts: list[Prompt]) -> None:
        if self.chat is False and any(is_chat(p) for p in prompts):
            raise RecipeError("the workload gives chat messages but workload.chat is false",
                              hint="remove workload.chat (chats are rendered with the model's template) or give plain prompts")
        if self.needs_template(prompts) and self.template is None:
            raise StageError(f"{self.model_name} has no chat template (no {TEMPLATE_FILE}, no chat_template in "
                             "tokenizer_config.json), so chat prompts cannot be rendered",
                             hint="set workload.chat: false and give plain-text prompts, or use an instruct model")

    def render(self, prompt: Prompt) -> Rendered:
        if self.chat is True or is_chat(prompt):
            text = self.template.render(as_messages(prompt))
            return Rendered(text, self.tokenizer.encode(text, add_special_tokens=False).ids, True)
        return Rendered(prompt, self.tokenizer.encode(prompt).ids, False)

    def stop_ids(self, prompts: list[Prompt]) -> list[int]:
        """End-of-turn ids of the template, when any prompt is rendered as a chat."""
        if not self.needs_template(prompts) or self.template is None:
            return []
        return self.template.end_of_turn(self.tokenizer)


# ------------------------------------------------------------------------------- a workload's requests


def chat_setting(workload, pm) -> bool | None:
    """``workload.chat`` as written; unset, True for a built-in set made for instruct models."""
    if workload.chat is not None:
        return workload.chat
    if workload.builtin is not None:
        registration = pm.registry()["workload"].get(workload.builtin)
        if registration is not None and getattr(registration.factory, "chat", False):
            return True
    return None


def workload_requests(workload, prompts: list[Prompt], tokenizer, info, pm):
    """(requests, model info with the template's end-of-turn ids among its EOS ids, per request
    whether it was rendered as a chat) for the workload's prompts."""
    import dataclasses

    import numpy as np

    from spdflow.api import Request

    renderer = PromptRenderer(tokenizer, info.source_dir, chat_setting(workload, pm), f"model '{info.name}'")
    renderer.check(prompts)
    rendered = [renderer.render(p) for p in prompts]
    requests = [Request(i, r.text, np.asarray(r.ids, dtype=np.int64), workload.max_new_tokens, workload.seed)
                for i, r in enumerate(rendered)]
    stops = renderer.stop_ids(prompts)
    if stops:
        eos = tuple(dict.fromkeys([*info.eos_token_ids, *stops]))
        info = dataclasses.replace(info, eos_token_ids=eos)
    return requests, info, [r.chat for r in rendered]
