"""Chapter 5's notebook up to train_model_simple (`attn walkthrough --chapter 5`)
as PyTorch 1.13 runs it.

In the notebook's order: GPTModel(GPT_CONFIG_124M with context_length 256)
under torch.manual_seed(123), eval mode, generate_text_simple of 10 tokens from
"Every effort moves you"; the loss example (probabilities, argmax, target
probabilities, log probabilities, cross entropy, perplexity); The Verdict's
characters and tokens; the train/validation loaders and their passes; and
calc_loss_loader on both under torch.manual_seed(123); then (after the training,
which is not here) the decoding strategies on the 9-word vocabulary. The model is the book's
(book_gpt.py); the dataset, loader and loss helpers are written here in our own
words. What each print() writes is captured from stdout, under the section and
name tests/torch/test_walkthrough_ch5_torch.cpp expects of attn.

Debian has no tiktoken: the notebook's fixed ids are constants, The Verdict is
tokenized by a small GPT-2 BPE over data/gpt2/encoder.json and vocab.bpe (its
pre-tokenizer spelled for ASCII text, which the-verdict.txt is), checked against
tiktoken's count and id hash in tests/fixtures/tokenizer/cases.json; decoding
reads encoder.json with GPT-2's byte-to-unicode table.

Writes walkthrough_ch5.json: {"printed": [{"section", "name", "text", "value"}]}.
As oracle_walkthrough_ch4.py, reruns itself under ATEN_CPU_CAPABILITY=avx2.
"""
import contextlib
import io
import json
import pathlib
import re
import sys

import torch
from torch.utils.data import DataLoader

import book_gpt as bg
from book_data import Windows
from book_generate import generate_text_simple
from oracle_util import run_under_avx2, tensor_json, write_json
from oracle_walkthrough_ch4 import gpt2_decoder

REPO = pathlib.Path(__file__).resolve().parents[2]

START_IDS = [6109, 3626, 6100, 345]           # "Every effort moves you"
INPUTS = [[16833, 3626, 6100], [40, 1107, 588]]  # "every effort moves", "I really like"
TARGETS = [[3626, 6100, 345], [1107, 588, 11311]]  # " effort moves you", " really like chocolate"


class Bpe:
    """GPT-2's byte-level BPE for ASCII text: pre-tokenize, map bytes to GPT-2's
    printable characters, merge the lowest-ranked pair until none is left."""

    PATTERN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+"""
                         r"""|\s+(?!\S)|\s+""")

    def __init__(self):
        gpt2 = REPO / "data" / "gpt2"
        self.encoder = json.loads((gpt2 / "encoder.json").read_text(encoding="utf-8"))
        lines = (gpt2 / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
        self.ranks = {tuple(l.split()): i for i, l in enumerate(l for l in lines if l.strip())}
        byte_to_char = {b: ch for ch, b in _char_to_byte().items()}
        self.byte_to_char = byte_to_char

    def _merge(self, word):
        parts = list(word)
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), 1 << 60), k) for k, (a, b) in
                     enumerate(zip(parts, parts[1:]))]
            rank, k = min(pairs)
            if rank == 1 << 60:
                break
            first, second = parts[k], parts[k + 1]
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == first and parts[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def encode(self, text):
        if not text.isascii() or "<|endoftext|>" in text:
            raise ValueError("this BPE spells GPT-2's pre-tokenizer for ASCII text without "
                             "special tokens")
        ids = []
        for piece in self.PATTERN.findall(text):
            word = "".join(self.byte_to_char[b] for b in piece.encode("utf-8"))
            ids += [self.encoder[p] for p in self._merge(word)]
        return ids


def _char_to_byte():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def fnv1a_ids(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(8, "little", signed=True):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def check_against_tiktoken(ids):
    """The fixture records tiktoken's count and FNV-1a hash of The Verdict's ids."""
    cases = json.loads((REPO / "tests" / "fixtures" / "tokenizer" / "cases.json")
                       .read_text(encoding="utf-8"))["cases"]
    case = next(c for c in cases if c["name"] == "the-verdict")
    got = (len(ids), f"{fnv1a_ids(ids):016x}")
    if got != (case["count"], case["fnv1a"]):
        raise RuntimeError(f"the oracle's BPE gives {got} for the-verdict.txt, tiktoken "
                           f"{(case['count'], case['fnv1a'])}")


def make_loader(bpe, text, batch_size, max_length, stride, shuffle, drop_last):
    return DataLoader(Windows(bpe.encode(text), max_length, stride), batch_size=batch_size,
                      shuffle=shuffle, drop_last=drop_last, num_workers=0)


def batch_loss(input_batch, target_batch, model):
    logits = model(input_batch)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target_batch.flatten())


def loader_loss(loader, model):
    """The mean of the batch losses as Python floats, every batch of one pass."""
    if len(loader) == 0:
        return float("nan")
    total = 0.
    for input_batch, target_batch in loader:
        total += batch_loss(input_batch, target_batch, model).item()
    return total / len(loader)


class Printer:
    def __init__(self):
        self.section = ""
        self.printed = []

    def __call__(self, name, value, *args):
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
    decoder = gpt2_decoder()

    def to_text(ids):
        return b"".join(decoder[int(i)] for i in ids).decode("utf-8", errors="replace")

    cfg = dict(bg.GPT_CONFIG_124M, context_length=256)
    torch.manual_seed(123)
    model = bg.GPTModel(cfg)
    model.eval()

    p.section = "generate"
    with torch.no_grad():
        token_ids = generate_text_simple(model=model, idx=torch.tensor([START_IDS]),
                                         max_new_tokens=10, context_size=cfg["context_length"])
    text = to_text(token_ids.squeeze(0).tolist())
    p("token_ids_to_text(token_ids, tokenizer)", text, "Output text:\n", text)

    p.section = "loss"
    inputs, targets = torch.tensor(INPUTS), torch.tensor(TARGETS)
    with torch.no_grad():
        logits = model(inputs)
    probas = torch.softmax(logits, dim=-1)
    p("probas.shape", list(probas.shape), probas.shape)
    token_ids = torch.argmax(probas, dim=-1, keepdim=True)
    p("token_ids", token_ids, "Token IDs:\n", token_ids)
    t = to_text(targets[0].tolist())
    p("targets[0]", t, f"Targets batch 1: {t}")
    t = to_text(token_ids[0].flatten().tolist())
    p("token_ids[0].flatten()", t, f"Outputs batch 1: {t}")
    target_probas_1 = probas[0, [0, 1, 2], targets[0]]
    p("target_probas_1", target_probas_1, "Text 1:", target_probas_1)
    target_probas_2 = probas[1, [0, 1, 2], targets[1]]
    p("target_probas_2", target_probas_2, "Text 2:", target_probas_2)
    log_probas = torch.log(torch.cat((target_probas_1, target_probas_2)))
    p("log_probas", log_probas, log_probas)
    avg_log_probas = torch.mean(log_probas)
    p("avg_log_probas", avg_log_probas, avg_log_probas)
    neg_avg_log_probas = avg_log_probas * -1
    p("neg_avg_log_probas", neg_avg_log_probas, neg_avg_log_probas)
    p("logits.shape", list(logits.shape), "Logits shape:", logits.shape)
    p("targets.shape", list(targets.shape), "Targets shape:", targets.shape)
    logits_flat, targets_flat = logits.flatten(0, 1), targets.flatten()
    p("logits_flat.shape", list(logits_flat.shape), "Flattened logits:", logits_flat.shape)
    p("targets_flat.shape", list(targets_flat.shape), "Flattened targets:", targets_flat.shape)
    loss = torch.nn.functional.cross_entropy(logits_flat, targets_flat)
    p("loss", loss, loss)
    perplexity = torch.exp(loss)
    p("perplexity", perplexity, perplexity)

    p.section = "data"
    text_data = (REPO / "data" / "the-verdict.txt").read_text(encoding="utf-8")
    p("text_data[:99]", text_data[:99], text_data[:99])
    p("text_data[-99:]", text_data[-99:], text_data[-99:])
    bpe = Bpe()
    all_ids = bpe.encode(text_data)
    check_against_tiktoken(all_ids)
    p("total_characters", len(text_data), "Characters:", len(text_data))
    p("total_tokens", len(all_ids), "Tokens:", len(all_ids))

    p.section = "loaders"
    split_idx = int(0.90 * len(text_data))
    train_data, val_data = text_data[:split_idx], text_data[split_idx:]
    n = cfg["context_length"]
    torch.manual_seed(123)
    train_loader = make_loader(bpe, train_data, 2, n, n, shuffle=True, drop_last=True)
    val_loader = make_loader(bpe, val_data, 2, n, n, shuffle=False, drop_last=False)
    p("Train loader:", "Train loader:", "Train loader:")
    for x, y in train_loader:
        p("x.shape, y.shape", [list(x.shape), list(y.shape)], x.shape, y.shape)
    p("\\nValidation loader:", "\nValidation loader:", "\nValidation loader:")
    for x, y in val_loader:
        p("x.shape, y.shape", [list(x.shape), list(y.shape)], x.shape, y.shape)
    train_tokens = sum(x.numel() for x, _ in train_loader)
    val_tokens = sum(x.numel() for x, _ in val_loader)
    p("train_tokens", train_tokens, "Training tokens:", train_tokens)
    p("val_tokens", val_tokens, "Validation tokens:", val_tokens)
    p("train_tokens + val_tokens", train_tokens + val_tokens, "All tokens:",
      train_tokens + val_tokens)

    p.section = "loader_loss"
    torch.manual_seed(123)
    with torch.no_grad():
        train_loss = loader_loss(train_loader, model)
        val_loss = loader_loss(val_loader, model)
    p("train_loss", train_loss, "Training loss:", train_loss)
    p("val_loss", val_loss, "Validation loss:", val_loss)

    p.section = "decoding"
    decoding_cells(p)

    write_json(pathlib.Path(out_dir) / "walkthrough_ch5.json", {"printed": p.printed})


VOCAB = {"closer": 0, "every": 1, "effort": 2, "forward": 3, "inches": 4, "moves": 5,
         "pizza": 6, "toward": 7, "you": 8}
NEXT_TOKEN_LOGITS = [4.51, 0.89, -1.90, 6.75, 1.63, -1.62, -1.89, 6.28, 1.79]


def decoding_cells(p):
    """The notebook's decoding strategies on its 9-word vocabulary (after the
    training, needing no model)."""
    inverse_vocab = {v: k for k, v in VOCAB.items()}
    next_token_logits = torch.tensor(NEXT_TOKEN_LOGITS)

    def sampled_tokens(probas, name):
        torch.manual_seed(123)
        sample = [torch.multinomial(probas, num_samples=1).item() for _ in range(1_000)]
        for i, freq in enumerate(torch.bincount(torch.tensor(sample))):
            p(f"sampled_ids[{i}]", int(freq), f"{freq} x {inverse_vocab[i]}")

    probas = torch.softmax(next_token_logits, dim=0)
    next_token_id = torch.argmax(probas).item()
    p("inverse_vocab[next_token_id]", inverse_vocab[next_token_id], inverse_vocab[next_token_id])
    torch.manual_seed(123)
    next_token_id = torch.multinomial(probas, num_samples=1).item()
    p("inverse_vocab[next_token_id]", inverse_vocab[next_token_id], inverse_vocab[next_token_id])
    sampled_tokens(probas, "probas")

    temperatures = [1, 0.1, 5]
    scaled_probas = [torch.softmax(next_token_logits / t, dim=0) for t in temperatures]
    for i, probas in enumerate(scaled_probas):
        p("temperatures[i]", temperatures[i], "\n\nTemperature:", temperatures[i])
        sampled_tokens(probas, f"scaled_probas[{i}]")

    top_logits, top_pos = torch.topk(next_token_logits, 3)
    p("top_logits", top_logits, "Top logits:", top_logits)
    p("top_pos", top_pos, "Top positions:", top_pos)
    new_logits = torch.where(condition=next_token_logits < top_logits[-1],
                             input=torch.tensor(float("-inf")), other=next_token_logits)
    # JSON has no -inf: the masked entries' values as the string "-inf", as attn writes them.
    value = tensor_json(new_logits)
    value["values"] = [v if v == v and abs(v) != float("inf") else repr(v) for v in value["values"]]
    p("new_logits", value, new_logits)
    topk_probas = torch.softmax(new_logits, dim=0)
    p("topk_probas", topk_probas, topk_probas)


def generate(out_dir) -> None:
    run_under_avx2(__file__, out_dir, compute)


if __name__ == "__main__":
    compute(pathlib.Path(sys.argv[1]))
