"""import attn in a Python that cannot import PyTorch (this interpreter run
with -S: no site directories, so neither Debian's dist-packages, where its
torch lives, nor a user's site-packages are on the path; PYTHONPATH still
finds the built package): the tokenizers work, torch is never imported, and
every entry point that needs it raises ImportError saying so."""

import os
import subprocess
import sys
import textwrap

import pytest

import attn

CODE = textwrap.dedent('''
    import sys
    try:
        import torch  # noqa: F401
        print("torch importable"); sys.exit(3)
    except ImportError:
        pass
    import attn
    assert "torch" not in sys.modules
    tok = attn.Tokenizer()
    assert tok.encode("Hello, I am") == [15496, 11, 314, 716], tok.encode("Hello, I am")
    assert tok.encode_batch(["Hello, I am", "a"], num_threads=2) == [[15496, 11, 314, 716], [64]]
    assert tok.decode([15496, 11, 314, 716]) == "Hello, I am"
    assert attn.get_num_threads() >= 1
    attn.set_num_threads(2)
    assert attn.get_num_threads() == 2
    for name in ("scaled_dot_product_attention", "sdpa_varlen", "patch_sdpa", "nn"):
        try:
            getattr(attn, name)
        except ImportError as e:
            assert f"attn.{name} needs PyTorch" in str(e), str(e)
        else:
            raise AssertionError(name + " without torch")
    try:
        import attn.nn  # noqa: F401
    except ImportError as e:
        assert "attn.nn needs PyTorch" in str(e), str(e)
    else:
        raise AssertionError("import attn.nn without torch")
    assert "torch" not in sys.modules
    print("ok")
''')


def test_import_attn_without_torch():
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(attn.__file__)))
    env = dict(os.environ, PYTHONPATH=package_dir)
    r = subprocess.run([sys.executable, "-S", "-c", CODE], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr)


TEXTS = ["Hello, I am", "", "x" * 3000, "Ünïcödé 漢字 🙂", "a<|endoftext|>b", " the quick brown fox"] * 7


@pytest.mark.parametrize("threads", [1, 2, 3, 8, 64])
def test_encode_batch_on_threads_equals_one_by_one(threads):
    tok = attn.Tokenizer()
    serial = [tok.encode(t, allowed_special="all") for t in TEXTS]
    assert tok.encode_batch(TEXTS, num_threads=threads, allowed_special="all") == serial
    assert tok.encode_ordinary_batch(TEXTS, num_threads=threads) == [tok.encode_ordinary(t) for t in TEXTS]
    assert tok.encode_batch([], num_threads=threads) == []


def test_encode_batch_rules_and_errors():
    tok = attn.Tokenizer()
    with pytest.raises(ValueError, match="disallowed special token"):
        tok.encode_batch(["fine", "a<|endoftext|>"], num_threads=2)
    assert tok.encode_batch(["a<|endoftext|>"], disallowed_special=()) == [tok.encode_ordinary("a<|endoftext|>")]
    with pytest.raises(ValueError, match="num_threads must be an int >= 1, got 0"):
        tok.encode_batch(["a"], num_threads=0)
    with pytest.raises(TypeError, match="sequence of str"):
        tok.encode_batch("abc")
