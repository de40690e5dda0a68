"""attn.ChatTemplate and HfTokenizer.apply_chat_template against transformers
5.24 (tests/fixtures/make_chat_template_fixtures.py): the published templates
over a table of conversations, byte for byte, and the prompt ids of the Qwen3
and Llama 3 fixture directories."""

import json
import os

import pytest

import attn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TEMPLATES = os.path.join(FIXTURES, "chat_templates")
EXPECTED = json.load(open(os.path.join(TEMPLATES, "expected.json"), encoding="utf-8"))


def source(name):
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
        return f.read()


def test_published_templates_match_transformers():
    rendered = errors = 0
    for case in EXPECTED["cases"]:
        chat = attn.ChatTemplate(source(case["template"]), case["special_tokens"])
        kwargs = dict(case["kwargs"])
        cont = case.get("continue_final_message", False)  # True or a field's name, as transformers
        if "expected" in case:
            text = chat.render(case["messages"], add_generation_prompt=case["add_generation_prompt"],
                               continue_final_message=cont, **kwargs)
            assert text == case["expected"], case["name"]
            rendered += 1
        else:
            # transformers' own ValueErrors as ValueError, word for word; the template's as RuntimeError
            raises = ValueError if case["error_type"] == "ValueError" and cont else RuntimeError
            with pytest.raises(raises) as e:
                chat.render(case["messages"], add_generation_prompt=case["add_generation_prompt"],
                            continue_final_message=cont, **kwargs)
            if case["error_type"] == "TemplateError" or raises is ValueError:
                assert case["error"] in str(e.value), case["name"]
            errors += 1
    assert rendered >= 170 and errors >= 10


@pytest.mark.parametrize("index", range(len(EXPECTED["model_dirs"])))
def test_apply_chat_template_ids(index):
    m = EXPECTED["model_dirs"][index]
    tok = attn.Tokenizer.from_file(os.path.join(FIXTURES, m["dir"]))
    assert tok.chat_template is not None
    messages = ([{"role": "system", "content": m["system"]}] if m["system"] else []) + [
        {"role": "user", "content": m["prompt"]}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                   **m["kwargs"]) == m["text"]
    assert tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False,
                                   **m["kwargs"]) == m["ids"]
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, **m["kwargs"])
    assert enc["input_ids"] == m["ids"] and enc["attention_mask"] == [1] * len(m["ids"])


def test_chat_template_sources_and_errors(tmp_path):
    qwen = os.path.join(FIXTURES, "open_models", "qwen3")
    chat = attn.ChatTemplate.from_model_dir(qwen)
    assert chat.source == source("Qwen-Qwen3-0.6B.jinja")
    assert chat.special_tokens["eos_token"] == "<|im_end|>"
    assert attn.ChatTemplate.from_model_dir(os.path.join(FIXTURES, "open_models", "gemma3")) is None
    tok = attn.Tokenizer.from_file(os.path.join(FIXTURES, "hf_tokenizers", "qwen"))
    assert tok.chat_template is None
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   chat_template="[{{ messages[0].content }}]") == "[hi]"
    with pytest.raises(ValueError, match="line 1"):
        attn.ChatTemplate("{% if %}")
    with pytest.raises(RuntimeError, match="Conversation roles must alternate"):
        attn.ChatTemplate(source("google-gemma-3-it.jinja")).render(
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    f = tmp_path / "t.jinja"
    f.write_text("{{ eos_token }}{{ messages|length }}")
    assert attn.ChatTemplate.from_file(str(f), qwen).render([{"role": "user", "content": "x"}]) == \
        "<|im_end|>1"
