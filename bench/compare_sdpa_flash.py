#!/usr/bin/env python3
"""Times scaled_dot_product_attention's fused kernel (attn/sdpa.h) against the
flash kernel (attn/kernels.h) on the problem both solve: square, causal,
fp32, the same (B, T, H, hd) values. Side by side in one `attn bench` run,
alternating (core, sdpa, core, sdpa, ...) so that both see the same load:

    python3 bench/compare_sdpa_flash.py --attn build/attn --shapes 1x1024x768x12,1x4096x768x12

For each shape and mode it prints each side's median of the per-row medians
and the median of the per-pair ratios sdpa / core (< 1: sdpa faster). On a
shared machine the per-pair ratio is the figure to read: a pair runs back to
back, under one load.
"""
import argparse
import json
import statistics
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attn", default="build/attn", help="the attn binary")
    parser.add_argument("--shapes", default="1x1024x768x12,1x4096x768x12", help="BxTxDxH list")
    parser.add_argument("--modes", default="fwd,fwdbwd", help="fwd, fwdbwd or both")
    parser.add_argument("--pairs", type=int, default=6, help="(core, sdpa) pairs per shape and mode")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per row")
    parser.add_argument("--threads", type=int, default=0, help="attn bench --threads (0: its default)")
    args = parser.parse_args()
    print(f"{'shape':<16} {'mode':<7} {'core ms':>9} {'sdpa ms':>9} {'sdpa/core':>10}  (medians; ratio: median of {args.pairs} pairs)")
    for shape in args.shapes.split(","):
        for mode in args.modes.split(","):
            kinds = ",".join(["core,sdpa"] * args.pairs)
            out = subprocess.run([args.attn, "bench", "--json", "--kind", kinds, "--shapes", shape, "--mode", mode,
                                  "--repeats", str(args.repeats)] + (["--threads", str(args.threads)] if args.threads else []),
                                 check=True, capture_output=True, text=True).stdout
            rows = json.loads(out)
            core = [r["ms_median"] for r in rows if r["kind"] == "core"]
            sdpa = [r["ms_median"] for r in rows if r["kind"] == "sdpa"]
            ratios = [s / c for c, s in zip(core, sdpa)]
            print(f"{shape:<16} {mode:<7} {statistics.median(core):>9.2f} {statistics.median(sdpa):>9.2f} "
                  f"{statistics.median(ratios):>10.3f}  (pairs {min(ratios):.3f} .. {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
