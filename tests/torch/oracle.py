#!/usr/bin/env python3
"""Runs PyTorch 1.13 (Debian's python3-torch) as the oracle for attn's tests.

Every module tests/torch/oracle_*.py defines generate(out_dir) that computes
reference values with torch and writes them under out_dir (usually one JSON
file named after the module). The C++ tests in tests/torch/*.cpp read them.
Run with /usr/bin/python3, the interpreter that sees Debian's torch.
"""
import argparse
import importlib.util
import os
import pathlib
import sys
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="folder for the reference files")
    parser.add_argument("--only", default="", help="run only oracle_<name>.py")
    args = parser.parse_args()
    torch.set_num_threads(1)  # deterministic reductions, and no contention with ctest
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    here = pathlib.Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    # oracle_util.py is the shared helper module, not an oracle script.
    scripts = sorted(s for s in here.glob("oracle_*.py") if s.stem != "oracle_util")
    if args.only:
        scripts = [s for s in scripts if s.stem == "oracle_" + args.only]
    if not scripts:
        print("oracle: no oracle_*.py scripts found", file=sys.stderr)
        return 1
    for script in scripts:
        start = time.time()
        spec = importlib.util.spec_from_file_location(script.stem, script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.generate(out)
        print(f"oracle: {script.stem} done in {time.time() - start:.1f} s")
    print(f"oracle: torch {torch.__version__}, {len(scripts)} scripts -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
