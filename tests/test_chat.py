"""Chat prompts: template rendering (as transformers renders it), end-of-turn stop tokens, chat
workloads (.jsonl messages, chat: true, built-in edit/qa), and outputs.jsonl with decoded text."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spdflow.chat import ChatTemplate, PromptRenderer, check_messages
from spdflow.errors import RecipeError, SpdflowError
from spdflow.testing.fixtures import run_in_process, tiny_recipe, write_recipe

#: ChatML as SmolLM2/Qwen write it, with the zoo tokenizer's special tokens: <|pad|> ends a turn.
CHATML = ("{% for message in messages %}{{ '<|endoftext|>' + message['role'] + '\n' + message['content'] + '<|pad|>' + '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|endoftext|>assistant\n' }}{% endif %}")
#: A Llama-3-like template: bos_token variable, a system default, trim_blocks-sensitive layout.
LLAMA3_LIKE = """{{ bos_token }}
{% if messages[0]['role'] != 'system' %}
{{ '[system]\nBe brief.<|pad|>' }}
{% endif %}
{% for message in messages %}
{{ '[' + message['role'] + ']\n' + message['content'] | trim + '<|pad|>' }}
{% endfor %}
{% if add_generation_prompt %}{{ '[assistant]\n' }}{% endif %}"""


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny random Llama whose tokenizer has a chat template (ChatML-like)."""
    from spdflow.testing.models import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("chat") / "model")
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = CHATML
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def _tokenizer(model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.mark.parametrize("template", [CHATML, LLAMA3_LIKE])
def test_render_matches_transformers_apply_chat_template(chat_model, tmp_path, template):
    from transformers import AutoTokenizer

    folder = tmp_path / "tok"
    shutil.copytree(chat_model, folder)
    (folder / "chat_template.jinja").write_text(template)  # the file form wins, as in transformers
    messages = [{"role": "user", "content": "  Rewrite:\n```python\ndef f(x):\n    return x\n```  "},
                {"role": "assistant", "content": "def f(x):\n    return x"},
                {"role": "user", "content": "Again, with hints."}]
    reference = AutoTokenizer.from_pretrained(folder)
    for generation in (True, False):
        want = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        assert ChatTemplate.find(folder).render(messages, generation) == want
    ids = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    renderer = PromptRenderer(_tokenizer(folder), folder, chat=None)
    assert renderer.render(messages).ids == list(ids)


def test_end_of_turn_is_the_special_token_after_a_reply(chat_model):
    template = ChatTemplate.find(chat_model)
    assert template.end_of_turn(_tokenizer(chat_model)) == [0, 1]  # <|pad|> ends a turn; <|endoftext|> is EOS


def test_settings_text_chat_and_refusals(chat_model, tmp_path):
    tokenizer = _tokenizer(chat_model)
    plain = PromptRenderer(tokenizer, chat_model, chat=None)
    assert plain.render("def f(x):").ids == tokenizer.encode("def f(x):").ids and not plain.render("x").chat
    as_chat = PromptRenderer(tokenizer, chat_model, chat=True)
    assert as_chat.render("hi").text == "<|endoftext|>user\nhi<|pad|>\n<|endoftext|>assistant\n"
    with pytest.raises(RecipeError, match="chat is false"):
        PromptRenderer(tokenizer, chat_model, chat=False).check([[{"role": "user", "content": "hi"}]])
    bare = tmp_path / "bare"
    shutil.copytree(chat_model, bare)
    (bare / "tokenizer_config.json").write_text("{}")
    with pytest.raises(SpdflowError, match="has no chat template"):
        PromptRenderer(tokenizer, bare, chat=True, model_name="model 'bare'").check(["hi"])
    PromptRenderer(tokenizer, bare, chat=None).check(["hi"])  # plain text needs no template


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "user"}], [{"role": "robot", "content": "x"}],
                                      [{"role": "user", "content": 3}]])
def test_bad_messages_are_one_sentence(messages):
    with pytest.raises(RecipeError) as info:
        check_messages(messages, "p.jsonl:4")
    assert info.value.message.startswith("p.jsonl:4: ")


def test_chat_run_renders_stops_at_end_of_turn_and_writes_decoded_outputs(chat_model, tmp_path, pm):
    prompts = tmp_path / "r" / "chats.jsonl"
    prompts.parent.mkdir()
    lines = [{"messages": [{"role": "system", "content": "You copy code."},
                           {"role": "user", "content": "def add(a, b):\n    return a + b\n\ndef sub(a, b):"}]},
             {"prompt": "class Stack:\n    def push(self, item):"}]
    prompts.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    recipe = tiny_recipe(chat_model, tmp_path / "out", proposer={"uses": "prompt_lookup"}, k_list=(0, 2, 4),
                         max_new_tokens=24)
    recipe["workload"] = {"file": str(prompts), "max_new_tokens": 24, "chat": True}
    state = run_in_process(pm, write_recipe(tmp_path / "r" / "recipe.yaml", recipe))
    assert state.lossless["identical"]
    tokenizer = _tokenizer(chat_model)
    template = ChatTemplate.find(chat_model)
    first, second = state.outputs
    rendered = template.render(lines[0]["messages"])
    assert first["prompt"] == rendered and first["messages"] == lines[0]["messages"]
    assert first["prompt_tokens"] == tokenizer.encode(rendered, add_special_tokens=False).ids
    assert second["messages"] == [{"role": "user", "content": lines[1]["prompt"]}]
    for output in (first, second):
        assert output["output"] == tokenizer.decode(output["tokens"])
        stops = [i for i, t in enumerate(output["tokens"]) if t in (0, 1)]
        # the end-of-turn id (1) stops generation like EOS: only ever the last token
        assert stops in ([], [len(output["tokens"]) - 1])
        if stops:
            assert output["stop_reason"] == "eos"
    written = [json.loads(line) for line in (tmp_path / "out" / "outputs.jsonl").read_text().splitlines()]
    assert [w["output"] for w in written] == [first["output"], second["output"]]


def test_builtin_edit_and_qa_are_deterministic_chats(pm):
    for name in ("edit", "qa"):
        factory = pm.lookup("workload", name).factory
        assert getattr(factory, "chat", False) is True
        first, again, other = factory(6, 0), factory(6, 0), factory(6, 1)
        assert first == again and first != other and len(first) == 6
        for chat in first:
            assert check_messages(chat, name) == chat and chat[-1]["role"] == "user"
    edit = pm.lookup("workload", "edit").factory(3, 0)
    assert all("```python\ndef " in chat[0]["content"] or "```python\nasync def " in chat[0]["content"] for chat in edit)
    assert all(chat[0]["content"].startswith("Read this passage.") for chat in pm.lookup("workload", "qa").factory(3, 0))


def test_builtin_chat_sets_on_a_model_without_a_template_say_so(tmp_path, pm):
    from spdflow.testing.models import make_tiny_model

    model = make_tiny_model(tmp_path / "m")
    recipe = tiny_recipe(model, tmp_path / "out", k_list=(0,))
    recipe["workload"] = {"builtin": "qa", "count": 1, "max_new_tokens": 4}
    from click.testing import CliRunner

    from spdflow.cli import cli

    path = write_recipe(tmp_path / "recipe.yaml", recipe)
    result = CliRunner().invoke(cli, ["run", str(path), "--allow-outside-paths"])
    assert result.exit_code == 1 and "has no chat template" in result.stderr and "Traceback" not in result.output
    recipe["workload"]["chat"] = False  # the same set as plain text: no template needed
    result = CliRunner().invoke(cli, ["lint", str(write_recipe(tmp_path / "recipe.yaml", recipe))])
    assert "chat template" not in result.output
