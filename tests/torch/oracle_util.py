"""Helpers shared by the oracle scripts: exact float serialisation and atomic writes."""
import json
import os
import pathlib
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
