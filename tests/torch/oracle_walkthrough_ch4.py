"""Chapter 4's notebook (`attn walkthrough --chapter 4`) as PyTorch 1.13 runs it.

The book's chapter-4 notebook prints, in order: the tokenized batch, the
DummyGPTModel's logits, the layer-normalization example, the feed-forward and
transformer-block shapes, the GPTModel's logits and parameter counts, and
greedy generation from "Hello, I am". This script runs the same maths in the book's
classes (book_gpt.py, book_generate.py) and records what each print() writes,
character for character (captured from stdout), under the section and name
tests/torch/test_walkthrough_ch4_torch.cpp expects of attn.

Every tensor is printed detached (no grad_fn), as the chapter-3 walkthrough
does. Debian has no tiktoken, so the GPT-2 ids of the prompts are constants
(the book's own output) and decoding reads the repository's GPT-2 vocabulary,
data/gpt2/encoder.json, with GPT-2's byte-to-unicode table.

Seeds as in the notebook: torch.manual_seed(123) before DummyGPTModel, the
layer-norm example, the transformer block and GPTModel (the FeedForward cell
draws on from the layer-norm cell's state). The notebook's
torch.set_printoptions(sci_mode=False) holds from the layer-norm cells on,
here too (reset at the end: other oracle scripts share the process). Both forward passes run in training mode (the notebook never
calls model.eval() before them), so their dropout draws from the same MT19937
stream attn's reference path follows; generation runs after model.eval().

Writes walkthrough_ch4.json: {"printed": [{"section", "name", "text", "value"}]},
value being a tensor's {"shape", "values"}, a list, a number or a string.
As oracle_gpt.py, reruns itself under ATEN_CPU_CAPABILITY=avx2 (torch's randn
depends on the kernel).
"""
import contextlib
import io
import json
import pathlib
import sys

import torch
import torch.nn as nn

import book_gpt as bg
from book_generate import generate_text_simple
from oracle_util import run_under_avx2, tensor_json, write_json

REPO = pathlib.Path(__file__).resolve().parents[2]

BATCH_IDS = [[6109, 3626, 6100, 345],   # "Every effort moves you"
             [6109, 1110, 6622, 257]]   # "Every day holds a"
HELLO_IDS = [15496, 11, 314, 716]       # "Hello, I am"


class DummyGPTModel(nn.Module):
    """The chapter's first sketch: embeddings, dropout and the output layer, with
    the transformer blocks and the final norm as identities (no parameters)."""

    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)

    def forward(self, in_idx):
        _, seq_len = in_idx.shape
        x = self.tok_emb(in_idx) + self.pos_emb(torch.arange(seq_len))
        x = self.drop_emb(x)
        return self.out_head(x)


class ExampleDeepNeuralNetwork(nn.Module):
    """Five Linear + GELU layers; with use_shortcut each layer's input is added
    to its output where the shapes agree (all but the last, 3 -> 1)."""

    def __init__(self, layer_sizes, use_shortcut):
        super().__init__()
        self.use_shortcut = use_shortcut
        self.layers = nn.ModuleList([
            nn.Sequential(nn.Linear(layer_sizes[i], layer_sizes[i + 1]), bg.GELU())
            for i in range(5)])

    def forward(self, x):
        for layer in self.layers:
            layer_output = layer(x)
            if self.use_shortcut and x.shape == layer_output.shape:
                x = x + layer_output
            else:
                x = layer_output
        return x


def print_gradients(p, model, x):
    """The notebook's print_gradients: MSE against 0, backward, then each
    weight's mean absolute gradient, one print per weight."""
    output = model(x)
    loss = nn.MSELoss()(output, torch.tensor([[0.]]))
    loss.backward()
    for name, param in model.named_parameters():
        if "weight" in name:
            mean_abs = param.grad.abs().mean().item()
            p(name, mean_abs, f"{name} has gradient mean of {mean_abs}")


def gpt2_decoder():
    """id -> bytes from encoder.json (GPT-2's byte-to-unicode form)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    encoder = json.loads((REPO / "data" / "gpt2" / "encoder.json").read_text(encoding="utf-8"))
    return {i: bytes(byte_of[ch] for ch in tok) for tok, i in encoder.items()}


class Printer:
    def __init__(self):
        self.section = ""
        self.printed = []

    def __call__(self, name, value, *args):
        """print(*args), recorded with its name and value."""
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            print(*args)
        if isinstance(value, torch.Tensor):
            value = tensor_json(value) if value.is_floating_point() else \
                {"shape": list(value.shape), "values": value.reshape(-1).tolist()}
        self.printed.append({"section": self.section, "name": name,
                             "text": buf.getvalue().removesuffix("\n"), "value": value})


def compute(out_dir: pathlib.Path) -> None:
    torch.set_num_threads(1)
    p = Printer()
    cfg = bg.GPT_CONFIG_124M
    batch = torch.tensor(BATCH_IDS)

    p.section = "batch"
    p("batch", batch, batch)

    p.section = "dummy"
    torch.manual_seed(123)
    model = DummyGPTModel(cfg)
    with torch.no_grad():
        logits = model(batch)
    p("logits.shape", list(logits.shape), "Output shape:", logits.shape)
    p("logits", logits, logits)
    del model, logits

    torch.set_printoptions(sci_mode=None)
    try:
        layer_cells(p, cfg)
        gpt_cells(p, cfg, batch)
    finally:
        torch.set_printoptions(sci_mode=None)  # other oracle scripts run in this process

    write_json(pathlib.Path(out_dir) / "walkthrough_ch4.json", {"printed": p.printed})


def layer_cells(p, cfg):
    """Layer normalization, the feed-forward network and a transformer block."""
    p.section = "layernorm"
    torch.manual_seed(123)
    batch_example = torch.randn(2, 5)
    layer = nn.Sequential(nn.Linear(5, 6), nn.ReLU())
    with torch.no_grad():
        out = layer(batch_example)
    p("out", out, out)
    mean = out.mean(dim=-1, keepdim=True)
    var = out.var(dim=-1, keepdim=True)
    p("mean", mean, "Mean:\n", mean)
    p("var", var, "Variance:\n", var)
    out_norm = (out - mean) / torch.sqrt(var)
    p("out_norm", out_norm, "Normalized layer outputs:\n", out_norm)
    mean = out_norm.mean(dim=-1, keepdim=True)
    var = out_norm.var(dim=-1, keepdim=True)
    p("mean", mean, "Mean:\n", mean)
    p("var", var, "Variance:\n", var)
    torch.set_printoptions(sci_mode=False)  # holds for the rest of the notebook
    p("mean", mean, "Mean:\n", mean)
    p("var", var, "Variance:\n", var)
    ln = bg.LayerNorm(emb_dim=6)
    with torch.no_grad():
        out_ln = ln(out)
    mean = out_ln.mean(dim=-1, keepdim=True)
    var = out_ln.var(dim=-1, unbiased=False, keepdim=True)
    p("mean", mean, "Mean:\n", mean)
    p("var", var, "Variance:\n", var)

    p.section = "feedforward"
    p('GPT_CONFIG_124M["emb_dim"]', cfg["emb_dim"], cfg["emb_dim"])
    ffn = bg.FeedForward(cfg)  # no new seed: the generator goes on from the cells above
    x = torch.rand(2, 3, 768)
    with torch.no_grad():
        out = ffn(x)
    p("out.shape", list(out.shape), out.shape)

    p.section = "shortcut"
    layer_sizes = [3, 3, 3, 3, 3, 1]
    sample_input = torch.tensor([[1., 0., -1.]])
    for use_shortcut in (False, True):
        torch.manual_seed(123)
        model = ExampleDeepNeuralNetwork(layer_sizes, use_shortcut=use_shortcut)
        print_gradients(p, model, sample_input)

    p.section = "block"
    torch.manual_seed(123)
    x = torch.rand(2, 4, 768)
    block = bg.TransformerBlock(cfg)
    with torch.no_grad():
        output = block(x)
    p("x.shape", list(x.shape), "Input shape:", x.shape)
    p("output.shape", list(output.shape), "Output shape:", output.shape)


def gpt_cells(p, cfg, batch):
    """GPTModel, its parameter counts, and generate_text_simple."""
    p.section = "gpt"
    torch.manual_seed(123)
    model = bg.GPTModel(cfg)
    with torch.no_grad():
        out = model(batch)
    p("batch", batch, "Input batch:\n", batch)
    p("out.shape", list(out.shape), "\nOutput shape:", out.shape)
    p("out", out, out)
    total_params = sum(q.numel() for q in model.parameters())
    p("total_params", total_params, f"Total number of parameters: {total_params:,}")
    p("model.tok_emb.weight.shape", list(model.tok_emb.weight.shape),
      "Token embedding layer shape:", model.tok_emb.weight.shape)
    p("model.out_head.weight.shape", list(model.out_head.weight.shape),
      "Output layer shape:", model.out_head.weight.shape)
    total_params_gpt2 = total_params - sum(q.numel() for q in model.out_head.parameters())
    p("total_params_gpt2", total_params_gpt2,
      f"Number of trainable parameters considering weight tying: {total_params_gpt2:,}")
    total_size_mb = total_params * 4 / (1024 * 1024)
    p("total_size_mb", total_size_mb, f"Total size of the model: {total_size_mb:.2f} MB")

    p.section = "generate"
    encoded = list(HELLO_IDS)
    p("encoded", encoded, "encoded:", encoded)
    encoded_tensor = torch.tensor(encoded).unsqueeze(0)
    p("encoded_tensor.shape", list(encoded_tensor.shape),
      "encoded_tensor.shape:", encoded_tensor.shape)
    model.eval()
    out = generate_text_simple(model=model, idx=encoded_tensor, max_new_tokens=6,
                               context_size=cfg["context_length"])
    p("out", out, "Output:", out)
    p("len(out[0])", len(out[0]), "Output length:", len(out[0]))
    decoder = gpt2_decoder()
    decoded_text = b"".join(decoder[i] for i in out.squeeze(0).tolist()).decode(
        "utf-8", errors="replace")
    p("decoded_text", decoded_text, decoded_text)


def generate(out_dir) -> None:
    run_under_avx2(__file__, out_dir, compute)


if __name__ == "__main__":
    compute(pathlib.Path(sys.argv[1]))
