#!/usr/bin/env python3
"""Data-parallel `attn train` under mpirun (issue 23; docs/distributed.md).

Standard library only. Each case trains a tiny model on data/the-verdict.txt for
a few steps and compares what it wrote:
  equal        mpirun -np 2 (K = 1) against one process with --grad-accum-steps 2:
               the same per-step losses and bit-identical weights and moments
               (two ranks sum a + b either way), with dropout too; --deterministic
               the same; K = 2 on 2 ranks against K = 4 on one: within fp32.
  np3          3 ranks (oversubscribed) --deterministic against one rank K = 3:
               bit-identical; without --deterministic: within 1e-5.
  agreement    MPMD ranks that differ in --lr or in the text: one line naming
               rank 1 and the field, non-zero exit, no checkpoint.
  kill         rank 1 SIGKILLs itself mid-step 8: the job ends within seconds
               naming rank 1, the iteration-6 checkpoint is intact, and --resume
               (at 2 ranks, and at 1 rank with K = 2) ends with the uninterrupted
               run's losses and weights.
  global-batch resuming with another global batch is refused, naming both.
  shard        --shard-optimizer (ZeRO-1) on 2 ranks: the unsharded run's losses
               and checkpoint bit for bit, half the AdamW bytes on rank 0, and a
               sharded run killed and resumed the same.
Usage: test_mpi_train.py --attn BUILD/attn --mpirun MPIRUN --text FILE --out DIR [--only CASE]
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

ARGS = None
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def base_flags(out, extra=()):
    return ["train", "--text", ARGS.text, "--out", out, "--n-layers", "2", "--n-heads", "2",
            "--emb-dim", "32", "--context-length", "32", "--batch-size", "2", "--max-iters", "12",
            "--eval-interval", "6", "--eval-iters", "2", "--threads", "1", *extra]


def mpirun(n):
    cmd = [ARGS.mpirun, "-np", str(n), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def run(cmd, env_extra=None, timeout=180):
    env = dict(os.environ, CI="1")
    env.update(env_extra or {})
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return p, time.monotonic() - t0


def train(out, n=0, extra=(), env_extra=None, expect_ok=True):
    cmd = ([ARGS.attn] if n == 0 else mpirun(n) + [ARGS.attn]) + base_flags(out, extra)
    p, secs = run(cmd, env_extra)
    if expect_ok and p.returncode != 0:
        print(" ".join(cmd), "\n", p.stdout[-2000:], p.stderr[-2000:])
        check(False, f"{out}: exit {p.returncode}")
    return p, secs


def step_losses(stdout):
    return [float(m.group(2)) for m in re.finditer(r"^step (\d+)/\d+ loss ([0-9.]+)", stdout, re.M)]


def tensors(path):
    """name -> raw bytes of every tensor of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = body[a:b]
    return out, header.get("__metadata__", {})


def max_abs_diff(x, y):
    fx = struct.unpack(f"<{len(x) // 4}f", x)
    fy = struct.unpack(f"<{len(y) // 4}f", y)
    return max((abs(a - b) for a, b in zip(fx, fy)), default=0.0)


def compare_checkpoints(a, b, what, tol=0.0):
    ta, _ = tensors(os.path.join(a, "checkpoint.safetensors"))
    tb, _ = tensors(os.path.join(b, "checkpoint.safetensors"))
    check(sorted(ta) == sorted(tb), f"{what}: the same tensors")
    if tol == 0.0:
        differ = [k for k in ta if ta[k] != tb.get(k)]
        check(not differ, f"{what}: bit-identical weights and AdamW moments ({len(ta)} tensors; "
                          f"differ: {differ[:3]})")
    else:
        worst = max(max_abs_diff(ta[k], tb[k]) for k in ta)
        check(worst <= tol, f"{what}: weights and moments within {tol} (max |diff| {worst:.3g})")


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


FRESH = set()  # the output folders this process made (a folder left by an earlier build is stale)


def d(name):
    path = os.path.join(ARGS.out, name)
    shutil.rmtree(path, ignore_errors=True)
    FRESH.add(path)
    return path


def case_equal():
    for tag, extra in (("", ()), ("-dropout", ("--drop-rate", "0.1"))):
        one = d("one-k2" + tag)
        p1, _ = train(one, 0, ("--grad-accum-steps", "2", *extra))
        two = d("two-k1" + tag)
        p2, _ = train(two, 2, extra)
        l1, l2 = step_losses(p1.stdout), step_losses(p2.stdout)
        check(len(l1) == 12 and l1 == l2, f"equal{tag}: 2 ranks' step losses == 1 rank K=2's ({l2[:3]}...)")
        m1, m2 = metrics(one), metrics(two)
        check([(m["train_loss"], m["val_loss"]) for m in m1] == [(m["train_loss"], m["val_loss"]) for m in m2],
              f"equal{tag}: evaluation losses equal")
        check(all("mpi_wait_ms_per_iter" in m for m in m2), f"equal{tag}: metrics carry mpi_wait_ms_per_iter")
        compare_checkpoints(one, two, f"equal{tag}")
    det = d("two-k1-det")
    train(det, 2, ("--deterministic",))
    compare_checkpoints(d("one-k2") if False else os.path.join(ARGS.out, "one-k2"), det, "equal --deterministic")
    # K = 2 on 2 ranks against K = 4 on one (one rank adds 4 in a row, the ranks (g0+g1)+(g2+g3)).
    a, b = d("one-k4"), d("two-k2")
    pa, _ = train(a, 0, ("--grad-accum-steps", "4"))
    pb, _ = train(b, 2, ("--grad-accum-steps", "2"))
    la, lb = step_losses(pa.stdout), step_losses(pb.stdout)
    check(len(la) == 12 and max(abs(x - y) for x, y in zip(la, lb)) <= 1e-4,
          "K=2 x 2 ranks: step losses within 1e-4 of 1 rank K=4")
    compare_checkpoints(a, b, "K=2 x 2 ranks vs 1 rank K=4", tol=1e-5)


def case_decoder():
    # Today's open models (--arch): the layers' gradients handed on in buckets as
    # backward finishes each, summed over 2 ranks = one rank's K = 2, bit for bit.
    for arch, extra in (("qwen3", ("--n-kv-groups", "1")),
                        ("gemma3", ("--n-kv-groups", "1", "--sliding-window-size", "8",
                                    "--sliding-window-stride", "1"))):
        flags = ("--arch", arch, "--tokenizer", "gpt2", *extra)
        one = d(f"{arch}-one-k2")
        p1, _ = train(one, 0, ("--grad-accum-steps", "2", *flags))
        two = d(f"{arch}-two-k1")
        p2, _ = train(two, 2, flags)
        l1, l2 = step_losses(p1.stdout), step_losses(p2.stdout)
        check(len(l1) == 12 and l1 == l2, f"decoder {arch}: 2 ranks' step losses == 1 rank K=2's ({l2[:3]}...)")
        model_type = {"qwen3": "qwen3", "gemma3": "gemma3_text"}[arch]
        check(f"{model_type} decoder" in p2.stdout, f"decoder {arch}: the banner names the decoder")
        compare_checkpoints(one, two, f"decoder {arch}")
        check(os.path.isfile(os.path.join(two, "config.json")), f"decoder {arch}: rank 0 wrote the Hub layout")


def case_np3():
    one = d("one-k3")
    train(one, 0, ("--grad-accum-steps", "3"))
    det = d("three-det")
    train(det, 3, ("--deterministic",))
    compare_checkpoints(one, det, "3 ranks --deterministic vs 1 rank K=3")
    plain = d("three")
    train(plain, 3)
    compare_checkpoints(one, plain, "3 ranks (MPI_Iallreduce) vs 1 rank K=3", tol=1e-5)


def case_agreement():
    out = d("agree-lr")
    cmd = mpirun(1) + [ARGS.attn] + base_flags(out) + [":", "-np", "1", ARGS.attn] + base_flags(out, ("--lr", "2e-3"))
    if os.geteuid() == 0:
        pass  # --allow-run-as-root is in mpirun(1)
    p, _ = run(cmd)
    lines = [l for l in p.stderr.splitlines() if "disagrees" in l]
    check(p.returncode != 0 and len(lines) == 1 and "rank 1" in lines[0] and "training flags" in lines[0],
          f"agreement: --lr differing on rank 1 -> one line, exit {p.returncode}: {lines}")
    check(not os.path.exists(os.path.join(out, "checkpoint.safetensors")), "agreement: no checkpoint written")
    other = os.path.join(ARGS.out, "other.txt")
    with open(ARGS.text, encoding="utf-8") as f:
        text = f.read()
    with open(other, "w", encoding="utf-8") as f:
        f.write(text[::-1])
    out = d("agree-text")
    flags = base_flags(out)
    flags2 = list(flags)
    flags2[flags2.index("--text") + 1] = other
    p, _ = run(mpirun(1) + [ARGS.attn] + flags + [":", "-np", "1", ARGS.attn] + flags2)
    lines = [l for l in p.stderr.splitlines() if "disagrees" in l]
    check(p.returncode != 0 and len(lines) == 1 and "rank 1" in lines[0] and "--text" in lines[0],
          f"agreement: a different text on rank 1 -> {lines}")


def case_kill():
    ref = os.path.join(ARGS.out, "two-k1")
    if ref not in FRESH:  # made by case_equal in this run, or now
        train(d("two-k1"), 2)
    out = d("killed")
    p, secs = train(out, 2, (), {"ATTN_TEST_KILL_RANK": "1", "ATTN_TEST_KILL_STEP": "8",
                                 "OMPI_MCA_mca_base_env_list": "ATTN_TEST_KILL_RANK;ATTN_TEST_KILL_STEP"},
                    expect_ok=False)
    said = p.stdout + p.stderr
    check(p.returncode != 0 and re.search(r"rank 1\b.*signal 9", said) is not None and secs < 30,
          f"kill: job ended (exit {p.returncode}) in {secs:.1f} s naming rank 1 and signal 9")
    _, meta = tensors(os.path.join(out, "checkpoint.safetensors"))
    check(meta.get("iter") == "6", f"kill: the last checkpoint is intact at iteration {meta.get('iter')}")
    keep = d("killed-copy")
    shutil.copytree(out, keep)
    p2, _ = train(out, 2, ("--resume",))
    check([m["val_loss"] for m in metrics(out)] == [m["val_loss"] for m in metrics(ref)],
          "kill: --resume at 2 ranks gives the uninterrupted run's losses")
    compare_checkpoints(ref, out, "kill: resumed at 2 ranks")
    p3, _ = train(keep, 0, ("--resume",))
    check("data parallel: 1 ranks x 2" in p3.stdout, "kill: resume on 1 rank takes K = 2 from the checkpoint")
    compare_checkpoints(ref, keep, "kill: resumed at 1 rank x K=2")


def case_global_batch():
    src = os.path.join(ARGS.out, "one-k2")
    if src not in FRESH:
        train(d("one-k2"), 0, ("--grad-accum-steps", "2"))
    out = d("gb")
    shutil.copytree(src, out)
    p, _ = train(out, 0, ("--resume", "--grad-accum-steps", "3"), expect_ok=False)
    check(p.returncode != 0 and "2 micro-batches" in p.stderr and "= 3" in p.stderr,
          f"global-batch: another global batch refused: {p.stderr.strip()[:200]}")


def case_shard():
    plain = d("two-k1")
    p1, _ = train(plain, 2, ("--drop-rate", "0.1"))
    shard = d("two-shard")
    p2, _ = train(shard, 2, ("--drop-rate", "0.1", "--shard-optimizer"))
    check(step_losses(p1.stdout) == step_losses(p2.stdout) and len(step_losses(p2.stdout)) == 12,
          "shard: --shard-optimizer's step losses == unsharded")
    compare_checkpoints(plain, shard, "shard: checkpoint (moments gathered from their owners)")
    full, part = metrics(plain)[-1]["optimizer_bytes"], metrics(shard)[-1]["optimizer_bytes"]
    check(full == 2 * 4 * 30272 and 0.4 * full <= part <= 0.6 * full,
          f"shard: rank 0 holds {part} of {full} bytes of AdamW moments")
    # Killed and resumed sharded: each rank reads its own moments back.
    killed = d("shard-killed")
    train(killed, 2, ("--drop-rate", "0.1", "--shard-optimizer"),
          {"ATTN_TEST_KILL_RANK": "0", "ATTN_TEST_KILL_STEP": "7",
           "OMPI_MCA_mca_base_env_list": "ATTN_TEST_KILL_RANK;ATTN_TEST_KILL_STEP"}, expect_ok=False)
    train(killed, 2, ("--resume", "--shard-optimizer"))
    compare_checkpoints(plain, killed, "shard: killed at step 8 and resumed sharded")


CASES = {"equal": case_equal, "decoder": case_decoder, "np3": case_np3, "agreement": case_agreement, "kill": case_kill,
         "global-batch": case_global_batch, "shard": case_shard}


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", choices=sorted(CASES))
    ARGS = ap.parse_args()
    os.makedirs(ARGS.out, exist_ok=True)
    for name, case in CASES.items():
        if ARGS.only in (None, name):
            case()
    print(f"{len(FAILS)} failed" if FAILS else "all passed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
