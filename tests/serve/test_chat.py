"""/v1/chat/completions on the Qwen3 fixture with its directory's chat
template (Qwen3-0.6B's, in tokenizer_config.json) and with one given by
--chat-template, through the openai package and plain HTTP."""
import os

import openai
import pytest

from conftest import FIXTURES, QWEN3, Server
from conftest import request as http

QWEN25 = os.path.join(FIXTURES, "chat_templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
# What the template renders for MESSAGES with add_generation_prompt=True.
RENDERED = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def chat_server():
    s = Server(QWEN3, "--model-name", "qwen3-chat")
    yield s
    assert s.stop() == 0, "\n".join(s.log[-20:])


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)


def prompt_tokens(server, text):
    return http(server.url, "/tokenize", {"prompt": text, "add_special_tokens": False})[2]["count"]


def test_chat_renders_the_template_and_answers(chat_server):
    r = client(chat_server).chat.completions.create(model="qwen3-chat", messages=MESSAGES,
                                                    max_tokens=8, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == prompt_tokens(chat_server, RENDERED)
    # The same seed through /v1/completions with the rendered text: the same reply.
    for seed in (3, 4):
        chat = client(chat_server).chat.completions.create(
            model="qwen3-chat", messages=MESSAGES, max_completion_tokens=12, temperature=0.9,
            seed=seed)
        done = client(chat_server).completions.create(model="qwen3-chat", prompt=RENDERED,
                                                      max_tokens=12, temperature=0.9, seed=seed)
        assert chat.choices[0].message.content == done.choices[0].text


def test_chat_template_kwargs_reach_the_template(chat_server):
    r = client(chat_server).chat.completions.create(
        model="qwen3-chat", messages=MESSAGES, max_tokens=2, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.usage.prompt_tokens == prompt_tokens(chat_server, RENDERED + "<think>\n\n</think>\n\n")


def test_chat_continues_a_final_assistant_message(chat_server):
    # vLLM's fields: the reply goes on from the prefilled text, no end of turn
    # after it (Qwen3's template: an empty think block before the last reply).
    prefilled = MESSAGES + [{"role": "assistant", "content": "Hello, I am"}]
    rendered = RENDERED + "<think>\n\n</think>\n\nHello, I am"
    r = client(chat_server).chat.completions.create(
        model="qwen3-chat", messages=prefilled, max_tokens=6, temperature=0.8, seed=5,
        extra_body={"add_generation_prompt": False, "continue_final_message": True})
    assert r.usage.prompt_tokens == prompt_tokens(chat_server, rendered)
    done = client(chat_server).completions.create(model="qwen3-chat", prompt=rendered,
                                                  max_tokens=6, temperature=0.8, seed=5)
    assert r.choices[0].message.content == done.choices[0].text
    with pytest.raises(openai.BadRequestError) as e:  # both at once: refused, as vLLM does
        client(chat_server).chat.completions.create(
            model="qwen3-chat", messages=prefilled, max_tokens=2,
            extra_body={"continue_final_message": True})
    assert "add_generation_prompt" in str(e.value)


def test_chat_streams_a_role_then_deltas_then_usage(chat_server):
    c = client(chat_server)
    whole = c.chat.completions.create(model="qwen3-chat", messages=MESSAGES, max_tokens=10,
                                      temperature=0.7, seed=9)
    chunks = list(c.chat.completions.create(model="qwen3-chat", messages=MESSAGES, max_tokens=10,
                                            temperature=0.7, seed=9, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_logprobs(chat_server):
    r = client(chat_server).chat.completions.create(model="qwen3-chat", messages=MESSAGES,
                                                    max_tokens=4, temperature=0, logprobs=True,
                                                    top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_chat_errors(chat_server):
    c = client(chat_server)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="qwen3-chat", messages=[])
    assert e.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="qwen3-chat",
                                  messages=[{"role": "user", "content": "word " * 200}])
    assert e.value.code == "context_length_exceeded"


def test_a_chat_template_file_replaces_the_directorys():
    s = Server(QWEN3, "--chat-template", QWEN25)
    try:
        r = client(s).chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=2, temperature=0)
        # Qwen2.5's template adds its default system message.
        rendered = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                    "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        assert r.usage.prompt_tokens == prompt_tokens(s, rendered)
    finally:
        assert s.stop() == 0
