"""attn serve through the official openai package (pinned 3.57.0): what a
user of the client sees, errors as the package's own exception classes."""
import subprocess

import openai
import pytest

from conftest import GPT2, QWEN3, Server, attn_cli
from conftest import request as http


def client(server, key="none"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_models_lists_the_served_model(qwen):
    models = client(qwen).models.list()
    assert [m.id for m in models.data] == ["qwen3-tiny"]
    assert models.data[0].owned_by == "attn"
    assert client(qwen).models.retrieve("qwen3-tiny").id == "qwen3-tiny"
    with pytest.raises(openai.NotFoundError):
        client(qwen).models.retrieve("gpt-4")


def test_completion_has_text_finish_reason_and_usage(qwen):
    c = client(qwen).completions.create(model="qwen3-tiny", prompt="Hello there", max_tokens=6,
                                        temperature=0)
    assert c.id.startswith("cmpl-") and c.object == "text_completion" and c.created > 0
    choice = c.choices[0]
    assert isinstance(choice.text, str)
    assert choice.finish_reason in ("stop", "length")
    _, _, tok = http(qwen.url, "/tokenize", {"prompt": "Hello there"})
    assert c.usage.prompt_tokens == tok["count"]
    assert 1 <= c.usage.completion_tokens <= 6
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    if choice.finish_reason == "length":
        assert c.usage.completion_tokens == 6


def generate_ids(model, ids, n, *extra):
    """`attn generate --prompt-ids ... --print-ids`: the new ids it prints."""
    out = subprocess.run([attn_cli(), "generate", "--model", model, "--prompt-ids",
                          ",".join(map(str, ids)), "--max-new-tokens", str(n), "--print-ids",
                          *extra], capture_output=True, text=True, timeout=60, check=True)
    return [int(x) for x in out.stdout.split()][len(ids):]


@pytest.mark.parametrize("which,model", [("qwen", QWEN3), ("gpt2", GPT2)])
def test_completions_are_what_attn_generate_gives(which, model, request):
    server = request.getfixturevalue(which)
    prompt = [5, 17, 30, 2, 9]
    c = client(server)
    for extra, body in [(("--greedy",), {"temperature": 0}),
                        (("--temperature", "0.9", "--top-k", "20", "--seed", "7"),
                         {"temperature": 0.9, "top_k": 20, "seed": 7}),
                        (("--temperature", "1.0", "--top-p", "0.8", "--seed", "11"),
                         {"temperature": 1.0, "top_p": 0.8, "seed": 11})]:
        ids = generate_ids(model, prompt, 10, *extra)
        top_k = body.pop("top_k", None)
        r = c.completions.create(model=c.models.list().data[0].id, prompt=prompt, max_tokens=10,
                                 extra_body={"top_k": top_k} if top_k else None, **body)
        _, _, text = http(server.url, "/detokenize", {"tokens": ids})
        assert r.choices[0].text == text["prompt"], (extra, ids)
        assert r.usage.completion_tokens == len(ids)


def test_same_seed_same_text_other_seed_other_text(qwen):
    c = client(qwen)
    texts = {}
    for seed in (1, 2, 3, 1):
        r = c.completions.create(model="qwen3-tiny", prompt="Once upon", max_tokens=12,
                                 temperature=1.0, seed=seed)
        texts.setdefault(seed, []).append(r.choices[0].text)
    assert texts[1][0] == texts[1][1]
    assert len({texts[1][0], texts[2][0], texts[3][0]}) > 1


def test_streaming_gives_the_same_text_and_the_usage(qwen):
    c = client(qwen)
    whole = c.completions.create(model="qwen3-tiny", prompt="Stream me", max_tokens=15,
                                 temperature=0.8, seed=5)
    chunks = list(c.completions.create(model="qwen3-tiny", prompt="Stream me", max_tokens=15,
                                       temperature=0.8, seed=5, stream=True,
                                       stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) <= {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_strings_end_the_text_before_them(qwen):
    c = client(qwen)
    full = c.completions.create(model="qwen3-tiny", prompt="The stop test", max_tokens=20,
                                temperature=0).choices[0].text
    assert len(full) >= 6, full
    stop = full[3:6]
    cut = full.index(stop)
    for stream in (False, True):
        if stream:
            chunks = list(c.completions.create(model="qwen3-tiny", prompt="The stop test",
                                               max_tokens=20, temperature=0, stop=[stop, "\x00zz"],
                                               stream=True))
            text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
            reason = chunks[-1].choices[0].finish_reason
        else:
            r = c.completions.create(model="qwen3-tiny", prompt="The stop test", max_tokens=20,
                                     temperature=0, stop=[stop, "\x00zz"])
            text, reason = r.choices[0].text, r.choices[0].finish_reason
        assert text == full[:cut], (stream, stop, full)
        assert reason == "stop"


def test_logprobs_are_the_distribution_of_the_chosen_tokens(qwen):
    r = client(qwen).completions.create(model="qwen3-tiny", prompt="Log probs", max_tokens=5,
                                        temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0
        assert len(top) <= 3
        assert max(top.values()) == pytest.approx(value, abs=1e-6)  # greedy: the argmax
    assert "".join(lp.tokens) == r.choices[0].text or r.choices[0].finish_reason == "stop"


def test_errors_are_the_packages_exceptions(qwen, gpt2):
    c = client(qwen)
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="qwen3-tiny", prompt="x", max_tokens=100000)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="qwen3-tiny", prompt="x", max_tokens=2, temperature=7)
    assert e.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="qwen3-tiny", prompt="x", stop=["a", "b", "c", "d", "e"])
    assert e.value.param == "stop"
    with pytest.raises(openai.BadRequestError) as e:  # GPT-2 has no chat template
        client(gpt2).chat.completions.create(model="fp32", messages=[{"role": "user", "content": "hi"}])
    assert "no chat template" in e.value.message


def test_an_api_key_is_required_when_set():
    s = Server(QWEN3, "--api-key", "sesame")
    try:
        with pytest.raises(openai.AuthenticationError):
            client(s, "wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            client(s, "sesame-and-more").completions.create(model="qwen3", prompt="x", max_tokens=1)
        assert client(s, "sesame").models.list().data[0].id == "qwen3"
        assert http(s.url, "/health")[0] == 200  # exempt
        assert http(s.url, "/metrics")[0] == 401
    finally:
        assert s.stop() == 0
    s = Server(QWEN3, env={"ATTN_API_KEY": "from-env"})
    try:
        with pytest.raises(openai.AuthenticationError):
            client(s).models.list()
        assert client(s, "from-env").models.list().data[0].id == "qwen3"
    finally:
        assert s.stop() == 0
