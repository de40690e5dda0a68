"""attn.nn against the book's own KV-cache modules and GPT models (ch04/04_gqa,
05_mla, 06_swa: gpt_with_kv_*.py), recorded once from the book's scripts by
tests/fixtures/make_book_kv_fixtures.py (tests/fixtures/book_kv/book_kv.json).

For each module (GroupedQueryAttention, MultiHeadLatentAttention,
MultiHeadAttentionWithSWA with windows 1, 3 and none): the book's state_dict
loads strictly, and ours has the book's keys in its order with the book's
shapes (so it loads into the book's class strictly); the output, the input's
gradient and every weight's gradient of sum(y * dy); then the cached run,
chunk by chunk: each chunk's output, the cache buffers (contents and shapes,
the SWA trimming included) and ptr_current_pos after it, a call without the
cache and a cached call after it, each as the book leaves them. For each
script's GPTModel: the state_dict both ways, logits and every weight's
gradient, and the cached generation (a prefill, then a token at a time) with
current_pos. Tolerance: |attn − book| <= 2e-5 · max(1, max |book|) per tensor
(float32 sums in a different order).
"""

import base64
import os

import pytest
import torch

import attn.nn as ann

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "book_kv", "book_kv.json")
CLASSES = {"gqa": ann.GroupedQueryAttention, "mla": ann.MultiHeadLatentAttention,
           "swa": ann.MultiHeadAttentionWithSWA}
TOL = 2e-5


def load():
    import json
    with open(FIXTURE) as f:
        return json.load(f)


DATA = load()


def tensor(j):
    dtype = torch.int64 if j["dtype"] == "int64" else torch.float32
    raw = bytearray(base64.b64decode(j["b64"]))
    return torch.frombuffer(raw, dtype=dtype).reshape(j["shape"]).clone()


def close(got, want_json, what):
    want = tensor(want_json)
    assert got.shape == want.shape, what
    err = (got.detach() - want).abs().max().item() if want.numel() else 0.0
    assert err <= TOL * max(1.0, want.abs().max().item() if want.numel() else 0.0), (what, err)


def load_book_state(m, case):
    state = {n: tensor(t) for n, t in case["state_dict"].items()}
    m.load_state_dict(state, strict=True)
    ours = m.state_dict()
    assert list(ours) == list(state)  # the book's keys, in its order: loads into the book's class
    for n in state:
        assert ours[n].shape == state[n].shape and ours[n].dtype == state[n].dtype, n


def check_caches(m, want, what):
    for name, t in want.items():
        got = getattr(m, name)
        if t is None:
            assert got is None, (what, name)
        else:
            close(got, t, f"{what} {name}")


MODULES = DATA["modules"]


@pytest.mark.parametrize("case", MODULES, ids=[f"{c['kind']}-{n}" for n, c in enumerate(MODULES)])
def test_module_equals_the_books(case):
    m = CLASSES[case["kind"]](**case["kwargs"]).eval()
    load_book_state(m, case)
    full = case["full"]
    x = tensor(full["x"]).requires_grad_()
    y = m(x)
    close(y, full["y"], "y")
    (y * tensor(full["dy"])).sum().backward()
    close(x.grad, full["dx"], "dx")
    assert [n for n, _ in m.named_parameters()] == list(full["grads"])
    for n, p in m.named_parameters():
        close(p.grad, full["grads"][n], "grad " + n)
    x = x.detach()
    with torch.no_grad():
        m.reset_cache()
        for step in case["cached"]:
            t0, t1 = step["tokens"]
            close(m(x[:, t0:t1], use_cache=True), step["y"], f"cached y {t0}:{t1}")
            check_caches(m, step["caches"], f"after {t0}:{t1}")
            assert m.ptr_current_pos == step["ptr_current_pos"]
        for key, call in (("uncached", lambda: m(x[:, :4])),
                          ("resumed", lambda: m(x[:, 4:6], use_cache=True))):
            close(call(), case[key]["y"], key)
            check_caches(m, case[key]["caches"], key)
            assert m.ptr_current_pos == case[key]["ptr_current_pos"], key


def test_cached_tokens_equal_the_whole_sequence():
    # Behaviour, beside the book's numbers: decoding token by token with the
    # cache gives the rows of the uncached forward, every module.
    torch.manual_seed(3)
    x = torch.randn(2, 11, 12)
    for m in (ann.GroupedQueryAttention(12, 16, 0.0, 4, 2), ann.MultiHeadLatentAttention(12, 16, 0.0, 4),
              ann.MultiHeadAttentionWithSWA(12, 16, 0.0, 4, sliding_window_size=4),
              ann.MultiHeadAttention(12, 16, 11, 0.0, 4)):
        m.eval()
        with torch.no_grad():
            whole = m(x)
            m.reset_cache()
            steps = [m(x[:, :5], use_cache=True)] + [m(x[:, t:t + 1], use_cache=True)
                                                      for t in range(5, 11)]
        assert (torch.cat(steps, 1) - whole).abs().max().item() <= 2e-5 * max(1.0, whole.abs().max().item())


MODELS = DATA["models"]


@pytest.mark.parametrize("case", MODELS, ids=[c["kind"] for c in MODELS])
def test_gpt_model_equals_the_books(case):
    model = ann.GPTModel(case["cfg"]).eval()
    load_book_state(model, case)
    ids = tensor(case["ids"])
    logits = model(ids)
    close(logits, case["logits"], "logits")
    (logits * tensor(case["dy"])).sum().backward()
    assert [n for n, _ in model.named_parameters()] == list(case["grads"])
    for n, p in model.named_parameters():
        close(p.grad, case["grads"][n], "grad " + n)
    with torch.no_grad():
        model.reset_kv_cache()
        for step in case["cached"]:
            t0, t1 = step["tokens"]
            close(model(ids[:, t0:t1], use_cache=True), step["logits"], f"cached logits {t0}:{t1}")
            assert model.current_pos == step["current_pos"]


def test_swa_schedule_and_window_errors():
    cfg = {"vocab_size": 10, "context_length": 8, "emb_dim": 8, "n_heads": 2, "n_layers": 5,
           "drop_rate": 0.0, "qkv_bias": False, "sliding_window_size": 3}
    windows = lambda c: [b.att.sliding_window_size for b in ann.GPTModel(c).trf_blocks]
    assert windows(dict(cfg, sliding_window_stride=2)) == [3, 3, None, 3, 3]
    assert windows(dict(cfg, sliding_window_stride=0)) == [None] * 5
    assert windows(dict(cfg, sliding_window_stride=-1)) == [3] * 5
    m = ann.MultiHeadAttentionWithSWA(8, 8, 0.0, 2, sliding_window_size=0)
    with pytest.raises(ValueError, match=r"sliding_window_size \(0\)"):
        m(torch.randn(1, 3, 8))
