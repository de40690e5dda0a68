#!/usr/bin/env python3
"""Serving throughput and latency of OpenAI-compatible servers under the same
load (issue 43): attn serve beside llama-server, or any server that speaks
/v1/completions with streaming.

For each server URL and each concurrency C, C clients each send streaming
completion requests back to back for --seconds (a closed loop: a client sends
its next request when its stream ends). Every request has the same length:
a prompt of --prompt-tokens token ids (a seeded random draw, given as ids so
that no tokenizer is involved) and --max-tokens new tokens, greedy,
ignore_eos (llama-server and vLLM read it; attn serve too). Every request
sends the same prompt (what a server's prefix cache serves: a shared system
prompt), or with --distinct-prompts a fresh draw each (every prompt
computed: the prefill-bound case). Reported per
server and C: output tokens/s over the run, requests done, time to first
token and time per output token (median and p99), errors.

    # terminal 1 and 2: the same checkpoint, the same slots
    build/attn serve --model qwen3-0.6b-f32 --parallel 16 --port 8081
    llama-server -m qwen3-0.6b-f32.gguf --parallel 16 -c 16384 --port 8082 -t 2
    # terminal 3
    python3 bench/compare_serve.py --url attn=http://127.0.0.1:8081 \\
        --url llama=http://127.0.0.1:8082 --concurrency 1 4 16 64 --json out.json

Standard library only. Run the servers one at a time on a quiet machine when
timing (the script drives them one after the other, never at once).
"""
import argparse
import http.client
import json
import random
import statistics
import threading
import time
import urllib.parse


def stream_one(url, body, timeout):
    """(time to first token, [times between tokens], tokens, error) of one streaming request."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    t0 = time.perf_counter()  # TPOT below: the gaps between chunks
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return None, [], 0, f"HTTP {r.status}"
        ttft, gaps, last, tokens, usage = None, [], None, 0, None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                break
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            if not chunk.get("choices"):
                continue
            if chunk["choices"][0].get("finish_reason") is not None and not chunk["choices"][0].get("text"):
                continue
            now = time.perf_counter()
            tokens += 1
            if ttft is None:
                ttft = now - t0
            else:
                gaps.append(now - last)
            last = now
        # A token whose text is held back (a split character) sends no chunk: the usage counts it.
        return ttft, gaps, usage if usage is not None else tokens, None
    except (OSError, http.client.HTTPException, ValueError) as e:
        return None, [], 0, type(e).__name__
    finally:
        conn.close()


def percentile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def wait_healthy(url, seconds=120):
    """Polls GET /health until it answers 200 (a server still loading its model refuses)."""
    u = urllib.parse.urlparse(url)
    deadline = time.time() + seconds
    while True:
        try:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit(f"{url} did not answer /health within {seconds} s")
        time.sleep(0.2)


def run(url, concurrency, seconds, prompt, max_tokens, timeout, distinct_vocab=0):
    deadline = time.perf_counter() + seconds
    lock = threading.Lock()
    ttfts, gaps, errors = [], [], []
    tokens = [0]
    done = [0]

    def client(i):
        rng = random.Random(1000 + i)
        while time.perf_counter() < deadline:
            if distinct_vocab:
                this = [rng.randrange(distinct_vocab) for _ in range(len(prompt))]
            else:
                this = prompt
            body = {"prompt": this, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "ignore_eos": True, "seed": i, "stream_options": {"include_usage": True}}
            ttft, g, n, err = stream_one(url, body, timeout)
            with lock:
                if err:
                    errors.append(err)
                    continue
                if ttft is not None:
                    ttfts.append(ttft)
                gaps.extend(g)
                tokens[0] += n
                done[0] += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return {"concurrency": concurrency, "seconds": elapsed, "requests": done[0],
            "output_tokens": tokens[0], "output_tokens_per_s": tokens[0] / elapsed,
            "ttft_median_s": statistics.median(ttfts) if ttfts else float("nan"),
            "ttft_p99_s": percentile(ttfts, 0.99),
            "tpot_median_s": statistics.median(gaps) if gaps else float("nan"),
            "tpot_p99_s": percentile(gaps, 0.99), "errors": len(errors)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", action="append", required=True, help="NAME=URL of a running server")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--vocab", type=int, default=1000, help="prompt ids are drawn below this")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--distinct-prompts", action="store_true",
                   help="a fresh prompt for every request (no prefix to reuse)")
    p.add_argument("--json", help="write the results here too")
    a = p.parse_args()
    rng = random.Random(0)
    prompt = [rng.randrange(a.vocab) for _ in range(a.prompt_tokens)]
    results = []
    print(f"{'server':<10} {'C':>4} {'tok/s':>9} {'req':>6} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'TPOT p50':>9} {'TPOT p99':>9} {'err':>4}")
    for spec in a.url:
        name, url = spec.split("=", 1)
        wait_healthy(url)
        for c in a.concurrency:
            r = run(url, c, a.seconds, prompt, a.max_tokens, a.timeout,
                    a.vocab if a.distinct_prompts else 0)
            r["server"] = name
            results.append(r)
            print(f"{name:<10} {c:>4} {r['output_tokens_per_s']:>9.1f} {r['requests']:>6} "
                  f"{r['ttft_median_s']*1e3:>8.1f}m {r['ttft_p99_s']*1e3:>8.1f}m "
                  f"{r['tpot_median_s']*1e3:>8.2f}m {r['tpot_p99_s']*1e3:>8.2f}m {r['errors']:>4}",
                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
