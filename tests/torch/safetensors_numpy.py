#!/usr/bin/env python3
"""safetensors with json + numpy only: an independent reader and writer of the
format (no `safetensors` package), the other side of attn's io::read_safetensors
and io::write_safetensors in the differential tests.

    8 bytes   N, the header length, uint64 little-endian
    N bytes   a JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]},
              "__metadata__": {str: str}} (optional)
    the rest  the data section; offsets are relative to its start

As a script (run with /usr/bin/python3 by tests/torch/test_safetensors_torch.cpp):

    safetensors_numpy.py dump FILE
        reads FILE strictly and prints JSON: {"metadata", "header_bytes", "order",
        "tensors": {name: {"dtype", "shape", "bits"}}} with every element's bit
        pattern as an unsigned integer (int64 as signed), and the writer checks
        attn promises (header padded to a multiple of 8, tensors ordered by
        element size then name) under "writer_checks".
    safetensors_numpy.py mha FILE INPUT_FILE
        checks every tensor of FILE bit for bit against the state_dict of the
        book's MultiHeadAttention(8, 12, 10, 0.0, 3, qkv_bias=True) built with
        torch.manual_seed(123), loads FILE into another such module
        (load_state_dict, not strict), runs it in eval mode on the tensor "x"
        of INPUT_FILE and prints JSON {"equal_to_seed_123": bool, "mismatches":
        [...], "missing_keys": [...], "unexpected_keys": [...], "y": {"shape", "bits"}}.
"""
import json
import struct
import sys

import numpy as np

# The dtypes this reader knows: safetensors name -> little-endian numpy dtype.
# BF16 has no numpy dtype; its raw 16-bit patterns are read as uint16.
NUMPY_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "BF16": np.dtype("<u2"), "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("u1"),
}
BITS_DTYPES = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
MAX_HEADER = 100_000_000


class FormatError(Exception):
    pass


def torch_to_numpy(t):
    """(safetensors dtype, numpy array of the raw values) of a torch tensor."""
    import torch
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.float32:
        return "F32", t.numpy().astype("<f4")
    if t.dtype == torch.bfloat16:
        return "BF16", t.view(torch.int16).numpy().view("<u2")
    if t.dtype == torch.int64:
        return "I64", t.numpy().astype("<i8")
    raise ValueError(f"no safetensors dtype for {t.dtype}")


def write(path, named, metadata=None, indent=None):
    """Writes [(name, (dtype, ndarray))] in the given order (not sorted: the
    reader must not depend on order) with json.dumps's default separators."""
    header = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    chunks, offset = [], 0
    for name, (dtype, array) in named:
        data = np.ascontiguousarray(array).astype(NUMPY_DTYPES[dtype], copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, indent=indent).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise FormatError(f"duplicate keys in {keys}")
    return dict(pairs)


def read(path):
    """Reads and checks a file: returns (tensors {name: (dtype, ndarray of raw
    values in shape)}, metadata, header_bytes, names in data order, raw header text)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError(f"{len(blob)} bytes, fewer than 8")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER or n > len(blob) - 8:
        raise FormatError(f"header length {n} for a file of {len(blob)} bytes")
    text = blob[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        raise FormatError("the header does not start with '{'")
    header = json.loads(text, object_pairs_hook=_no_duplicates)
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise FormatError("metadata must map strings to strings")
    data = blob[8 + n:]
    entries = sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    tensors, order, expected = {}, [], 0
    for name, info in entries:
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"{name}: keys {sorted(info)}")
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        np_dtype = NUMPY_DTYPES[dtype]
        if any(not isinstance(s, int) or s < 0 for s in shape):
            raise FormatError(f"{name}: shape {shape}")
        if begin != expected or end < begin:
            raise FormatError(f"{name}: data_offsets [{begin}, {end}] after {expected}")
        if int(np.prod(shape, dtype=object)) * np_dtype.itemsize != end - begin:
            raise FormatError(f"{name}: shape {shape} of {dtype} and data_offsets [{begin}, {end}] disagree")
        tensors[name] = (dtype, np.frombuffer(data[begin:end], dtype=np_dtype).reshape(shape))
        order.append(name)
        expected = end
    if expected != len(data):
        raise FormatError(f"the tensors end at {expected} but the data section has {len(data)} bytes")
    return tensors, metadata, n, order, text


def bits_of(array):
    """Every element's bit pattern as a Python int (int64 stays signed)."""
    if array.dtype == np.dtype("<i8"):
        return [int(v) for v in array.reshape(-1)]
    return [int(v) for v in array.reshape(-1).view(BITS_DTYPES[array.dtype.itemsize])]


def dump(path):
    tensors, metadata, n, order, text = read(path)
    sizes = {name: NUMPY_DTYPES[dtype].itemsize for name, (dtype, _) in tensors.items()}
    expected_order = sorted(order, key=lambda name: (-sizes[name], name))
    return {
        "metadata": metadata,
        "header_bytes": n,
        "order": order,
        "writer_checks": {
            "header_padded_to_8": n % 8 == 0 and text.rstrip(" ").endswith("}") and len(text) - len(text.rstrip(" ")) < 8,
            "ordered_by_size_then_name": order == expected_order,
            "metadata_first": text.startswith('{"__metadata__"') if metadata else True,
        },
        "tensors": {name: {"dtype": dtype, "shape": list(a.shape), "bits": bits_of(a)}
                    for name, (dtype, a) in tensors.items()},
    }


def f32_state_dict(path):
    """The tensors of a safetensors file as a torch state_dict; every one must be F32."""
    import torch
    tensors, _, _, _, _ = read(path)
    state = {}
    for name, (dtype, array) in tensors.items():
        if dtype != "F32":
            raise FormatError(f"{name}: dtype {dtype}, expected F32")
        state[name] = torch.from_numpy(array.astype(np.float32))
    return state


def mha(path, input_path):
    import torch
    import book_modules as bm
    torch.manual_seed(123)
    reference = bm.MultiHeadAttention(8, 12, 10, 0.0, 3, qkv_bias=True)
    state = f32_state_dict(path)
    reference_state = reference.state_dict()
    mismatches = [name for name, t in state.items()
                  if name not in reference_state
                  or not np.array_equal(reference_state[name].numpy().view(np.uint32), t.numpy().view(np.uint32))]
    torch.manual_seed(999)
    model = bm.MultiHeadAttention(8, 12, 10, 0.0, 3, qkv_bias=True)
    # Not strict: a file without the mask buffer keeps the module's own
    # (the same triu); the missing keys are reported for the caller to judge.
    keys = model.load_state_dict(state, strict=False)
    model.eval()
    inputs, _, _, _, _ = read(input_path)
    x = torch.from_numpy(inputs["x"][1].astype(np.float32))
    with torch.no_grad():
        y = model(x)
    return {"equal_to_seed_123": not mismatches,
            "mismatches": mismatches,
            "missing_keys": sorted(keys.missing_keys),
            "unexpected_keys": sorted(keys.unexpected_keys),
            "y": {"shape": list(y.shape), "bits": bits_of(y.numpy().astype("<f4"))}}


# The small GPT of the weight-exchange test (test_safetensors_torch.cpp):
# the book's config names.
GPT_CONFIG = {"vocab_size": 37, "context_length": 12, "emb_dim": 16, "n_heads": 4,
              "n_layers": 2, "drop_rate": 0.0, "qkv_bias": True}


def gpt(path, ids_path):
    """Loads a GPTModel state_dict written by attn into the book's GPTModel
    (strictly: every key, the mask buffers included) and returns its logits
    for the int64 ids in ids_path, in eval mode."""
    import torch
    import book_gpt
    state = f32_state_dict(path)
    torch.manual_seed(0)
    model = book_gpt.GPTModel(GPT_CONFIG)
    model.load_state_dict(state, strict=True)
    model.eval()
    inputs, _, _, _, _ = read(ids_path)
    ids = torch.from_numpy(inputs["ids"][1].astype(np.int64))
    with torch.no_grad():
        logits = model(ids)
    return {"logits": {"shape": list(logits.shape), "bits": bits_of(logits.numpy().astype("<f4"))}}


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "dump":
            result = dump(argv[2])
        elif len(argv) == 4 and argv[1] == "mha":
            result = mha(argv[2], argv[3])
        elif len(argv) == 4 and argv[1] == "gpt":
            result = gpt(argv[2], argv[3])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (FormatError, KeyError, ValueError, UnicodeDecodeError) as e:
        print(f"safetensors_numpy: {argv[2]}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
