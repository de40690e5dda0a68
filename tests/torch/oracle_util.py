"""Helpers shared by the oracle scripts: exact float serialisation, atomic
writes, and running under ATen's AVX2 kernels."""
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import torch


def tensor_json(t: torch.Tensor) -> dict:
    """A tensor as {"shape": [...], "values": [...]} with float32 values exactly
    representable (Python floats hold every float32 exactly)."""
    t = t.detach().to(torch.float32).contiguous()
    return {"shape": list(t.shape), "values": [float(x) for x in t.reshape(-1).tolist()]}


def write_json(path: pathlib.Path, payload) -> None:
    """Writes JSON atomically: a temporary file in the same folder, then rename."""
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def tensor_bits_json(t: torch.Tensor) -> dict:
    """A float32 tensor as {"shape": [...], "bits": [...]}: each value's IEEE-754
    bit pattern as an unsigned integer, so that inf, NaN and -0.0 survive JSON
    (read in C++ with attn::test::tensor_from_bits_json)."""
    t = t.detach().to(torch.float32).contiguous()
    bits = t.reshape(-1).view(torch.int32).tolist()
    return {"shape": list(t.shape), "bits": [b & 0xFFFFFFFF for b in bits]}


def cpu_capability() -> str:
    """The SIMD level ATen's CPU kernels run at ("AVX2", "AVX512", ...)."""
    m = re.search(r"CPU capability usage: (\w+)", torch.__config__.show())
    return m.group(1) if m else "unknown"


def run_under_avx2(script: str, arg, compute) -> None:
    """compute(arg) in this process when ATen already runs its AVX2 kernels (or
    the caller chose ATEN_CPU_CAPABILITY); otherwise `script` is run again with
    ATEN_CPU_CAPABILITY=avx2 and `arg` as its argument, so the numbers are those
    of the kernels the C++ tests were written against."""
    if cpu_capability() == "AVX2" or os.environ.get("ATEN_CPU_CAPABILITY"):
        compute(arg)
        return
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2")
    subprocess.run([sys.executable, script, str(arg)], env=env, check=True)
