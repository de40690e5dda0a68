"""The variables that force a path (docs/gemm.md, "Forcing a path on any CPU")
act in Python as in the attn CLI: read when attn is imported, an unknown name
an error at import naming the valid ones. Each case runs in a fresh
interpreter, since the variables are read once per process."""

import os
import subprocess
import sys

PATH_OF_A_BF16_CALL = (
    "import attn, torch\n"
    "q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)\n"
    "print(attn._path(q, q, q, is_causal=True))\n"
)


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)


def test_the_forced_bf16_path_is_the_one_taken():
    # "widened to fp32" runs on every CPU; the call is the core's problem, so
    # its path is the core's: the widened tiles, whatever the CPU would choose.
    r = run_python(PATH_OF_A_BF16_CALL, ATTN_BF16_PATH="widened to fp32")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "bf16 tiles widened to fp32"


def test_an_unknown_forced_path_fails_the_import_naming_the_valid_ones():
    for variable, value in (("ATTN_SIMD_TARGET", "AVX9"), ("ATTN_BF16_PATH", "fp8"),
                            ("ATTN_GEMV_BF16_PATH", "fp8")):
        r = run_python("import attn", **{variable: value})
        assert r.returncode != 0, variable
        assert "ImportError" in r.stderr, r.stderr
        assert f"{variable}='{value}' is not a path this CPU can run; valid: " in r.stderr
