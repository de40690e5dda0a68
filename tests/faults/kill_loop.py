#!/usr/bin/env python3
"""SIGKILL during `attn train`, over and over, then resume (issue 46).

    python3 tests/faults/kill_loop.py ATTN_BINARY TEXT_FILE [--seconds 40] [--seed N]

A tiny model (1 layer, emb 16, context 16) is trained once straight through
into one folder. Then the same run is started in a second folder and killed
with SIGKILL at a random moment (uniform over the straight run's duration,
start-up included), again and again: a fresh start while the folder holds no
checkpoint, `--resume` once it does. After every kill the folder must hold:

- only what docs/training.md promises: checkpoint.safetensors,
  metrics.jsonl, loss.svg, and the temporaries of the atomic writer
  (".NAME.tmp.PID.N") of killed processes of this test, nothing else;
- when it holds a checkpoint: one that `attn generate` loads and samples
  from (exit 0), and a metrics.jsonl whose lines are whole JSON objects with
  increasing iterations.

When the time is up (--seconds of killing), the run is resumed to its end.
Then the folder holds checkpoint.safetensors, metrics.jsonl and loss.svg and
no temporary, and every evaluation of metrics.jsonl (iteration, train and
validation loss) equals the straight run's, bit for bit (docs/training.md,
"Exact resume"). Exit 0 when all of this held, 1 with one line per failure. Every attn runs
under a 4 GiB address-space limit (RLIMIT_AS). Python's standard library only.
"""
import argparse
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MODEL = ("--n-layers 1 --n-heads 2 --emb-dim 16 --context-length 16 --batch-size 4 "
         "--warmup-iters 5 --eval-interval 50 --eval-iters 2 --seed 3 --threads 1").split()
MAX_ITERS = "600"
PROMISED = {"checkpoint.safetensors", "metrics.jsonl", "loss.svg"}
TEMPORARY = re.compile(r"^\.(checkpoint\.safetensors|metrics\.jsonl|loss\.svg)\.tmp\.(\d+)\.\d+$")


def evaluations(folder):
    """(iter, train_loss, val_loss) of each metrics.jsonl line, as written."""
    out = []
    with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            j = json.loads(line)  # a torn line raises: a failure
            if not isinstance(j, dict):
                raise ValueError(f"metrics.jsonl line {n} is not an object")
            out.append((j["iter"], json.dumps(j["train_loss"]), json.dumps(j["val_loss"])))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("attn")
    ap.add_argument("text")
    ap.add_argument("--seconds", type=float, default=40.0, help="how long to keep killing")
    ap.add_argument("--seed", type=int, default=None, help="the kill moments' seed (default: random)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    failures = []

    def fail(what):
        failures.append(what)
        print(f"FAIL: {what}", flush=True)

    work = tempfile.mkdtemp(prefix="attn-kill-loop-")
    try:
        text = os.path.join(work, "text.txt")
        with open(args.text, "rb") as f:
            data = f.read(30000)
        with open(text, "wb") as f:
            f.write(data)
        env = dict(os.environ, OMP_NUM_THREADS="1")

        def capped():  # every attn under a 4 GiB address space: a runaway fails, the machine stays
            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

        def train(folder, resume):
            cmd = [args.attn, "train", "--text", text, "--out", folder, "--max-iters", MAX_ITERS]
            cmd += ["--resume"] if resume else MODEL
            return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                    preexec_fn=capped)

        straight = os.path.join(work, "straight")
        t0 = time.monotonic()
        p = train(straight, False)
        _, err = p.communicate()
        duration = time.monotonic() - t0
        if p.returncode != 0:
            print(f"FAIL: the straight run exited {p.returncode}: {err.decode(errors='replace').strip()}")
            return 1
        expected = evaluations(straight)
        print(f"kill_loop: seed {seed}; the straight run took {duration:.2f} s, "
              f"{len(expected)} evaluations", flush=True)

        killed = os.path.join(work, "killed")
        killed_pids = set()
        kills = finished = resumes = generated = 0
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            has_checkpoint = os.path.exists(os.path.join(killed, "checkpoint.safetensors"))
            p = train(killed, has_checkpoint)
            resumes += has_checkpoint
            time.sleep(rng.uniform(0.0, duration * 1.1))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                killed_pids.add(p.pid)
                kills += 1
            _, err = p.communicate()
            if p.returncode not in (0, -signal.SIGKILL):
                fail(f"train exited {p.returncode}: {err.decode(errors='replace').strip()}")
                break
            if p.returncode == 0:
                finished += 1
                shutil.rmtree(killed)  # start over: the killing is the point
                continue
            names = set(os.listdir(killed)) if os.path.isdir(killed) else set()
            for name in names - PROMISED:
                m = TEMPORARY.match(name)
                if not m or int(m.group(2)) not in killed_pids:
                    fail(f"after kill {kills}: an unpromised file {name!r}")
            if "checkpoint.safetensors" in names:
                g = subprocess.run([args.attn, "generate", "--model", killed, "--prompt", "To be",
                                    "--max-new-tokens", "5", "--seed", "1"],
                                   capture_output=True, env=env, preexec_fn=capped)
                generated += 1
                if g.returncode != 0:
                    fail(f"after kill {kills}: generate exited {g.returncode}: "
                         f"{g.stderr.decode(errors='replace').strip()}")
            if "metrics.jsonl" in names:
                try:
                    iters = [e[0] for e in evaluations(killed)]
                    if iters != sorted(set(iters)):
                        fail(f"after kill {kills}: metrics.jsonl iterations {iters}")
                except (ValueError, KeyError) as e:
                    fail(f"after kill {kills}: metrics.jsonl unreadable: {e}")
            if failures:
                break

        # To the end, then the whole record.
        has_checkpoint = os.path.exists(os.path.join(killed, "checkpoint.safetensors"))
        p = train(killed, has_checkpoint)
        _, err = p.communicate()
        if p.returncode != 0:
            fail(f"the last run exited {p.returncode}: {err.decode(errors='replace').strip()}")
        else:
            names = set(os.listdir(killed))
            if names != PROMISED:
                fail(f"at the end the folder holds {sorted(names)}, not {sorted(PROMISED)}")
            got = evaluations(killed)
            if got != expected:
                fail(f"metrics.jsonl differs from the straight run's: {len(got)} evaluations "
                     f"against {len(expected)}, first difference "
                     f"{next((a, b) for a, b in zip(got + [None] * len(expected), expected) if a != b)}")
        print(f"kill_loop: {kills} kills ({resumes} resumed starts, {generated} checkpoints "
              f"generated from, {finished} runs finished before their kill); "
              f"{'FAILED' if failures else 'passed'} (seed {seed})", flush=True)
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
