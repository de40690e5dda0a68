"""The book's chapter-5 data loaders as torch 1.13 runs them: which windows each
batch holds, pass by pass, and what the global generator draws meanwhile.

The dataset is chapter 2's GPTDatasetV1 in our own words (book_data.Windows) (windows of max_length
token ids every stride, targets shifted by one) in a torch DataLoader, as the
book's create_dataloader_v1 builds it. Each case records, for a token sequence
0..n-1 (so a window's first input id is its start), the first id of every row
of every batch over several passes (training-style: shuffle, drop_last;
validation-style: in order, short last batch kept), one pass cut short after
one batch as calc_loss_loader cuts it, then torch.rand(4) from the global
generator: attn must have drawn exactly as much. Also randperm and
int64 random_() directly.
"""
import pathlib

import torch
from torch.utils.data import DataLoader

from book_data import Windows
from oracle_util import write_json


CASES = [  # n tokens, batch, max_length, stride, shuffle/drop_last, seed
    (5145, 2, 256, 256, True, 123),    # the book's chapter 5 training loader
    (5145, 2, 256, 256, False, 123),   # ... and its validation loader's shape
    (600, 3, 8, 5, True, 7),
    (600, 3, 8, 5, False, 7),
    (100, 4, 4, 1, True, 2**40 + 5),   # a seed above 32 bits
    (37, 5, 4, 4, False, 0),           # a short last batch
]


def generate(out_dir):
    cases = []
    for n, batch, max_length, stride, shuffle, seed in CASES:
        ds = Windows(list(range(n)), max_length, stride)
        loader = DataLoader(ds, batch_size=batch, shuffle=shuffle, drop_last=shuffle, num_workers=0)
        torch.manual_seed(seed)
        passes = []
        for _ in range(3):
            passes.append([[int(x[r, 0]) for r in range(x.shape[0])] for x, y in loader])
        for x, y in loader:  # a pass cut short after one batch (calc_loss_loader)
            break
        after = torch.rand(4).tolist()
        cases.append({"n": n, "batch": batch, "max_length": max_length, "stride": stride,
                      "shuffle": shuffle, "seed": seed, "windows": len(ds), "batches": len(loader),
                      "passes": passes, "rand_after": after})
    perms = []
    for seed, n in [(0, 1), (1, 2), (123, 10), (3624216819017203053, 1000), (99, 70000)]:
        g = torch.Generator().manual_seed(seed)
        perms.append({"seed": seed, "n": n, "perm": torch.randperm(n, generator=g).tolist()})
    torch.manual_seed(123)
    int64s = [int(torch.empty((), dtype=torch.int64).random_().item()) for _ in range(8)]
    write_json(pathlib.Path(out_dir) / "loader.json",
               {"cases": cases, "randperm": perms, "random_int64_seed123": int64s})
