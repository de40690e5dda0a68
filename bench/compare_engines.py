#!/usr/bin/env python3
"""The sdpa kernel's product engines side by side (issue 41: one attention engine):
every case the kernel serves, fp32 and bf16, with bf16 on each engine this CPU
runs: "widened to fp32" (FmaEngine on widened tiles) and AVX512-BF16 (DotEngine,
VDPBF16PS), optionally beside an older attn binary's bf16 path (--attn-before).
Each cell is `attn bench --json --kind sdpa` (or sdpa-varlen): the median ms of
--repeats, measured once per round with the rounds interleaved, and the median of
the rounds shown. The last columns are fp32 ms / bf16 ms on the AVX512-BF16
engine (the gain of native bf16 for that case) and the widened engine's ms over it.

    build/attn bench ...   # what each row runs; this script only drives it
    python3 bench/compare_engines.py --attn build/attn --shapes 1x1024x768x12,1x4096x768x12

Cases: causal (plain), a sliding window of 256 keys, ALiBi, a softcap of 30, the
padded dense mask (transformers' float32 minimum), grouped-query heads (3 key/value
heads), and a varlen batch of four sequences (512, 1024, 256, 2048 tokens)."""

import argparse
import json
import statistics
import subprocess
import sys

CASES = [
    ("causal", "sdpa", []),
    ("window 256", "sdpa", ["--sliding-window-size", "256"]),
    ("ALiBi", "sdpa", ["--alibi"]),
    ("softcap 30", "sdpa", ["--softcap", "30"]),
    ("padded mask", "sdpa", ["--mask", "padded"]),
    ("GQA 12/3", "sdpa", ["--kv-heads", "3"]),
    ("varlen 4 seqs", "sdpa-varlen", ["--seqlens", "512,1024,256,2048"]),
]


def bench(attn, kind, shape, flags, dtype, repeats, bf16_path=None):
    cmd = [attn, "bench", "--json", "--kind", kind, "--shapes", shape, "--dtype", dtype,
           "--repeats", str(repeats), "--mode", "all"] + flags
    if bf16_path:
        cmd += ["--bf16-path", bf16_path]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0 and "--sliding-window-size" in flags:
        # A binary from before the CLI's one window spelling: --window-left W - 1.
        at = cmd.index("--sliding-window-size")
        cmd[at:at + 2] = ["--window-left", str(int(cmd[at + 1]) - 1)]
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: {run.stderr.strip()}")
    return {row["mode"]: row for row in json.loads(run.stdout)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attn", default="build/attn")
    ap.add_argument("--attn-before", help="another attn binary: its bf16 path's column")
    ap.add_argument("--shapes", default="1x1024x768x12,1x4096x768x12")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3,
                    help="every cell measured once per round, the rounds interleaved; "
                         "the table shows the median of the rounds' medians")
    args = ap.parse_args()

    # (shape, case, column) -> {mode: [ms per round]}, and each cell's last row.
    ms, rows = {}, {}
    columns = [("fp32", None, "float32", None), ("wide", None, "bfloat16", "widened to fp32"),
               ("dot", None, "bfloat16", None)]
    if args.attn_before:
        columns.append(("before", args.attn_before, "bfloat16", None))
    for _ in range(args.rounds):
        for shape in args.shapes.split(","):
            for name, kind, flags in CASES:
                for column, binary, dtype, path in columns:
                    if column == "before" and any(f in ("--alibi", "--softcap") for f in flags):
                        continue  # the older binary has no such flags
                    got = bench(binary or args.attn, kind, shape, flags, dtype, args.repeats, path)
                    rows[(shape, name, column)] = got
                    for mode, row in got.items():
                        ms.setdefault((shape, name, column), {}).setdefault(mode, []).append(
                            row["ms_median"])

    def cell(shape, name, column, mode):
        return statistics.median(ms[(shape, name, column)][mode])

    header = ["case", "T", "mode", "fp32", "bf16 widened", "bf16 AVX512-BF16"]
    if args.attn_before:
        header.append("bf16 before")
    header += ["fp32 / AVX512-BF16", "widened / AVX512-BF16"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] * 3 + ["---:"] * (len(header) - 3)) + "|")
    for shape in args.shapes.split(","):
        T = shape.split("x")[1]
        for name, kind, flags in CASES:
            for mode in ("fwd", "fwdbwd"):
                path = rows[(shape, name, "dot")][mode]["bf16_path"]
                if path != "AVX512-BF16":
                    sys.exit(f"{name}: the bf16 row ran on {path!r}, not AVX512-BF16 (this CPU "
                             "or build has no dot engine)")
                fp32, wide, dot = (cell(shape, name, c, mode) for c in ("fp32", "wide", "dot"))
                cells = [name, T, "fwd" if mode == "fwd" else "fwd+bwd", f"{fp32:.2f}",
                         f"{wide:.2f}", f"**{dot:.2f}**"]
                if args.attn_before:
                    key = (shape, name, "before")
                    cells.append(f"{cell(shape, name, 'before', mode):.2f} "
                                 f"({rows[key][mode]['backend']})" if key in ms else "-")
                cells += [f"{fp32 / dot:.2f}x", f"{wide / dot:.2f}x"]
                print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
