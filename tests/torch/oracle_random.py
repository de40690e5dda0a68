"""PyTorch's generator as the oracle for attn's Generator (tests/torch/test_random_torch.cpp).

Writes random.json: a list of cases. A case seeds the generator with
torch.manual_seed(seed) and runs a sequence of operations on it; each
operation's output (float32 or float64 values, row-major) is stored exactly
(JSON floats round-trip float32 and float64). The C++ test replays the same
operations on attn::Generator and compares the bits.

Operations: rand, randn (shape); uniform (n, from, to); normal (n, mean, std);
rand64 (n); uniform64 (n, from, to); linear (in, out, bias) -> weight then
bias; embedding (num, dim); dropout (n, p) -> F.dropout(ones(n), p) (the noise);
manual_seed (seed) mid-sequence, no output. A randn op may carry "keep", a
list of [start, end) ranges: only those values of its flat output are stored.

The vectorised normal of torch 1.13 (numel >= 16) depends on the CPU kernel
torch dispatches to; attn follows the AVX2 kernel. If torch picked another,
this script reruns itself with ATEN_CPU_CAPABILITY=avx2, and records the
capability it ended up with.
"""
import pathlib
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from oracle_util import cpu_capability, run_under_avx2, write_json

U64 = (1 << 64) - 1


def f32(x: float) -> float:
    """The float32 nearest x, as a Python float (so C++'s float gets it exactly)."""
    return float(np.float32(x))


def run_op(op: dict):
    kind = op["op"]
    if kind == "manual_seed":
        torch.manual_seed(op["seed"])
        return None
    if kind == "rand":
        return torch.rand(op["shape"])
    if kind == "randn":
        out = torch.randn(op["shape"])
        if "keep" in op:  # only these [start, end) ranges of the flat output
            flat = out.reshape(-1)
            out = torch.cat([flat[a:b] for a, b in op["keep"]])
        return out
    if kind == "uniform":
        return torch.empty(op["n"]).uniform_(op["from"], op["to"])
    if kind == "normal":
        return torch.empty(op["n"]).normal_(op["mean"], op["std"])
    if kind == "rand64":
        return torch.rand(op["n"], dtype=torch.float64)
    if kind == "uniform64":
        return torch.empty(op["n"], dtype=torch.float64).uniform_(op["from"], op["to"])
    if kind == "linear":
        with warnings.catch_warnings():  # "Initializing zero-element tensors is a no-op"
            warnings.simplefilter("ignore", UserWarning)
            layer = torch.nn.Linear(op["in"], op["out"], bias=op["bias"])
        parts = [layer.weight.detach().reshape(-1)]
        if op["bias"]:
            parts.append(layer.bias.detach())
        return torch.cat(parts)
    if kind == "embedding":
        return torch.nn.Embedding(op["num"], op["dim"]).weight.detach()
    if kind == "dropout":
        return F.dropout(torch.ones(op["n"]), op["p"], training=True)
    raise ValueError(f"unknown op {kind}")


def run_case(name: str, seed: int, ops: list) -> dict:
    torch.manual_seed(seed)
    outputs = []
    for op in ops:
        out = run_op(op)
        if out is not None:
            dtype = "float64" if out.dtype == torch.float64 else "float32"
            outputs.append({"dtype": dtype, "values": out.detach().reshape(-1).tolist()})
        else:
            outputs.append(None)
    return {"name": name, "seed": seed & U64, "ops": ops, "outputs": outputs}


def cases() -> list:
    out = []
    seeds = [0, 1, 42, 123, 789, 1337, 2**31 - 1, 2**32 - 1, 2**32, 2**32 + 123, 2**63 + 5, U64,
             -1, -123, -(2**40) - 7, 67280421310721]

    # rand: many shapes and seeds (negative seeds wrap to uint64; only the low
    # 32 bits reach MT19937).
    shapes = [[], [0], [1], [2], [3, 2], [2, 3, 4], [1, 17], [15], [16], [33], [7, 9, 11], [1000]]
    for i, seed in enumerate(seeds):
        shape = shapes[i % len(shapes)]
        out.append(run_case(f"rand{shape} seed {seed}", seed, [{"op": "rand", "shape": shape}]))
    out.append(run_case("rand beyond one MT state (624 draws)", 5,
                        [{"op": "rand", "shape": [700]}, {"op": "rand", "shape": [1300]}]))

    # randn for every numel 1..70 and some large ones: the scalar path (< 16),
    # the vectorised path, and the redrawn tail block.
    for n in list(range(1, 71)) + [255, 256, 1000, 4099]:
        seed = [123, 7, 2024, -3][n % 4]
        out.append(run_case(f"randn({n}) seed {seed}", seed, [{"op": "randn", "shape": [n]}]))
    # A long randn, stored only at blocks where a multiply-add of the Cephes
    # log or sincos that PyTorch's build fuses rounds differently unfused
    # (found by unfusing each one in turn against torch.randn(4_000_000)).
    blocks = [19794, 26341, 36821, 40493, 43174, 57521, 90246, 5550, 75080, 215907, 285087, 3418853]
    keep = [[0, 1024]] + [[i // 16 * 16, i // 16 * 16 + 16] for i in sorted(blocks)]
    out.append(run_case("randn(3420000), FMA-sensitive blocks", 555,
                        [{"op": "randn", "shape": [3420000], "keep": keep}]))
    out.append(run_case("randn shapes", 11, [{"op": "randn", "shape": [3, 5]}, {"op": "randn", "shape": [2, 8]},
                                             {"op": "randn", "shape": [4, 4, 3]}, {"op": "randn", "shape": [0]}]))

    # The scalar path's cached second value, kept across calls (and across
    # vectorised calls, which neither read nor write it) until a reseed.
    cache_ops = [{"op": "randn", "shape": [3]}, {"op": "randn", "shape": [5]}, {"op": "randn", "shape": [20]},
                 {"op": "randn", "shape": [1]}, {"op": "randn", "shape": [1]}, {"op": "randn", "shape": [2]},
                 {"op": "randn", "shape": [15]}, {"op": "randn", "shape": [16]}, {"op": "randn", "shape": [1]},
                 {"op": "rand", "shape": [3]}, {"op": "randn", "shape": [1]}, {"op": "manual_seed", "seed": 99},
                 {"op": "randn", "shape": [1]}, {"op": "manual_seed", "seed": 99}, {"op": "randn", "shape": [2]}]
    for seed in [123, 789, 1337]:
        out.append(run_case(f"randn cache sequence seed {seed}", seed, cache_ops))
    out.append(run_case("scalar normal_ uses the cache with its own mean/std", 31,
                        [{"op": "normal", "n": 3, "mean": f32(0.3), "std": f32(2.7)},
                         {"op": "normal", "n": 5, "mean": f32(-1.25), "std": f32(0.01)},
                         {"op": "dropout", "n": 4, "p": 0.5},
                         {"op": "normal", "n": 1, "mean": f32(10.0), "std": f32(3.3)}]))

    # uniform_ with odd bounds: one fmaf per value.
    bounds = [(-1.7, 3.3), (0.1, 0.2), (-1e-3, 1e-3), (-100.0, -99.5), (2.0, 2.0), (-0.57735026, 0.57735026),
              (1e6, 1e6 + 3.0), (-3.0e4, 7.0)]
    for i, (a, b) in enumerate(bounds):
        out.append(run_case(f"uniform_({a}, {b})", 100 + i,
                            [{"op": "uniform", "n": 257, "from": f32(a), "to": f32(b)}]))

    # normal_(mean, std) on both paths.
    params = [(0.0, 1.0), (f32(0.3), f32(2.7)), (-5.0, f32(0.02)), (f32(1e3), f32(1e-3)), (f32(-0.7), 0.0)]
    for i, (mean, std) in enumerate(params):
        for n in [7, 16, 33, 200]:
            out.append(run_case(f"normal_({mean}, {std}) n={n}", 200 + i,
                                [{"op": "normal", "n": n, "mean": mean, "std": std}]))

    # float64 uniforms: two draws each, 53 bits.
    out.append(run_case("rand float64", 77, [{"op": "rand64", "n": 300}]))
    out.append(run_case("uniform_ float64", 78, [{"op": "uniform64", "n": 300, "from": -1.7, "to": 3.3},
                                                 {"op": "uniform64", "n": 50, "from": 1e-3, "to": 2.5e-3}]))

    # nn.Linear's default init, with and without bias, and fan_in beyond the
    # range where the bound is exactly (float)(1/sqrt(fan_in)).
    for fan_in in [1, 3, 7, 16, 64, 768]:
        for bias in [True, False]:
            fan_out = 4 if fan_in == 768 else 5
            out.append(run_case(f"Linear({fan_in}, {fan_out}, bias={bias})", 300 + fan_in,
                                [{"op": "linear", "in": fan_in, "out": fan_out, "bias": bias}]))
    for fan_in in [4999, 5000, 12345]:
        out.append(run_case(f"Linear({fan_in}, 1)", 400, [{"op": "linear", "in": fan_in, "out": 1, "bias": True}]))

    # Zero-size layers: the empty weight draws nothing, a bias with fan_in 0
    # is drawn from U(-0, 0).
    for fan_in, fan_out in [(0, 3), (3, 0)]:
        out.append(run_case(f"Linear({fan_in}, {fan_out})", 401,
                            [{"op": "linear", "in": fan_in, "out": fan_out, "bias": True},
                             {"op": "rand", "shape": [4]}]))

    # nn.Embedding: normal_(0, 1), so randn(num * dim) with either algorithm.
    for num, dim in [(6, 16), (50, 7), (3, 5)]:
        out.append(run_case(f"Embedding({num}, {dim})", 123, [{"op": "embedding", "num": num, "dim": dim}]))

    # Dropout masks (noise = output on ones). p == 0 and p == 1 draw nothing,
    # which the trailing rand checks.
    for p in [0.1, 0.5, 0.9, 0.0, 1.0, 0.25, 0.3]:
        for seed in [123, 5]:
            out.append(run_case(f"dropout p={p} seed {seed}", seed,
                                [{"op": "dropout", "n": 500, "p": p}, {"op": "rand", "shape": [4]}]))

    # Mixed sequences as a model's construction and forward would draw them.
    out.append(run_case("Linear, randn, dropout", 123,
                        [{"op": "linear", "in": 3, "out": 2, "bias": True},
                         {"op": "randn", "shape": [2, 6, 3]},
                         {"op": "dropout", "n": 36, "p": 0.5},
                         {"op": "linear", "in": 768, "out": 3, "bias": False},
                         {"op": "randn", "shape": [5]},
                         {"op": "embedding", "num": 50, "dim": 7},
                         {"op": "randn", "shape": [3]},
                         {"op": "dropout", "n": 17, "p": 0.1},
                         {"op": "rand", "shape": [6, 3]}]))
    out.append(run_case("MHA-like construction", 789,
                        [{"op": "linear", "in": 16, "out": 16, "bias": False},
                         {"op": "linear", "in": 16, "out": 16, "bias": False},
                         {"op": "linear", "in": 16, "out": 16, "bias": False},
                         {"op": "linear", "in": 16, "out": 16, "bias": True},
                         {"op": "rand", "shape": [2, 4, 16]},
                         {"op": "dropout", "n": 2 * 2 * 4 * 4, "p": 0.1}]))
    return out


def compute(path: pathlib.Path) -> None:
    fresh = torch.Generator()  # never seeded: PyTorch's default seed
    default = {"initial_seed": fresh.initial_seed(), "rand": torch.rand(20, generator=fresh).tolist()}
    write_json(path, {"torch": torch.__version__, "cpu_capability": cpu_capability(),
                      "unseeded_generator": default, "cases": cases()})


def generate(out_dir) -> None:
    run_under_avx2(__file__, pathlib.Path(out_dir) / "random.json", compute)


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    compute(pathlib.Path(sys.argv[1]))
