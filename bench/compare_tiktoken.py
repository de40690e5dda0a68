#!/usr/bin/env python3
"""Times attn's GPT-2 tokenizer against tiktoken on the same texts, in one run.

    scripts/bench-venv   # ~/venv-torch2, with tiktoken
    ~/venv-torch2/bin/python bench/compare_tiktoken.py --build build

tiktoken's "gpt2" encoding is built offline from data/gpt2/ (nothing is
downloaded). Texts: data/tinyshakespeare.txt, data/the-verdict.txt, and a
multilingual text this script makes (seeded, about 1 MB: sentences and
made-up words in 16 scripts, numbers, emoji, mixed white space), written to
BUILD/bench/multilingual.txt. For each text it
  1. checks that attn's ids (`attn tokenize --file`) are tiktoken's;
  2. times tiktoken's encode_ordinary on one thread: --repeats runs, the
     median and the best;
  3. runs build/bench/bench_tokenizer (Google Benchmark, --repeats
     repetitions) for attn's encode (one thread) and encode_parallel (all
     cores), and takes its median and best;
and prints a Markdown table (MB/s of UTF-8 input, tokens/s, attn / tiktoken)
for docs/performance.md, with the CPU as lscpu names it.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

import tiktoken
import tiktoken.load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

SENTENCES = [
    "The quick brown fox jumps over the lazy dog, and it's not the first time we've seen it.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω τὴν ψυχοφθόρα βδελυγμία, είπε ο δάσκαλος.",
    "مرحبا بالعالم! هذا نص عربي قصير للاختبار.",
    "שלום עולם, זהו טקסט קצר בעברית.",
    "नमस्ते दुनिया। यह हिन्दी का एक छोटा वाक्य है।",
    "你好，世界！这是一个用于测试的简短中文句子。",
    "日本語のテキストです。漢字とひらがなとカタカナを含みます。",
    "สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "안녕하세요 세계! 이것은 짧은 한국어 문장입니다.",
    "Größere Straßen führen über die Brücke nach Köln.",
    "Ærøskøbing ligger på Ærø; São Paulo é uma cidade enorme.",
    "Բարեւ աշխարհ, սա հայերեն նախադասություն է։",
    "გამარჯობა მსოფლიო, ეს არის ქართული წინადადება.",
    "ሰላም ዓለም፣ ይህ የአማርኛ ዓረፍተ ነገር ነው።",
    "வணக்கம் உலகம், இது ஒரு தமிழ் வாக்கியம்.",
]
ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyz", "абвгдежзийклмнопрстуфхцчшщыэюя", "αβγδεζηθικλμνξοπρστυφχψω",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي", "אבגדהוזחטיכלמנסעפצקרשת", "कखगघचछजझटठडढणतथदधनपफबभमयरलवशसह",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年", "あいうえおかきくけこさしすせそたちつてとなにぬねの",
    "กขคงจฉชซญดตถทธนบปผพฟภมยรลวศษสหอฮ", "가나다라마바사아자차카타파하거너더러머버서어저처",
    "äöüßéèêàçñ", "ԱԲԳԴԵԶԷԸԹԺԻԼԽԾԿՀ", "აბგდევზთიკლმნოპ", "ሀለሐመሠረሰሸቀበተቸኀነኘአ", "அஆஇஈஉஊஎஏஐஒஓஔகஙசஞ",
]
EXTRAS = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "e\u0301", "\u00a0", "\u3000", "\t", "\n", "\r\n", "  ", "...", "—", "«", "»"]


def multilingual_text(size, seed=2024):
    rng = random.Random(seed)
    words = [w for s in SENTENCES for w in s.split()]
    out, n = [], 0
    while n < size:
        r = rng.random()
        if r < 0.45:
            piece = rng.choice(words)
        elif r < 0.8:
            alphabet = rng.choice(ALPHABETS)
            piece = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 9)))
        elif r < 0.9:
            piece = str(rng.randint(0, 10 ** rng.randint(1, 7)))
        else:
            piece = rng.choice(EXTRAS)
        piece += "\n" if rng.random() < 0.05 else " "
        out.append(piece)
        n += len(piece.encode("utf-8"))
    return "".join(out)


def gpt2():
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        os.path.join(ROOT, "data", "gpt2", "vocab.bpe"), os.path.join(ROOT, "data", "gpt2", "encoder.json"))
    return tiktoken.Encoding(name="gpt2", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


def cpu_name():
    info = {}
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        k, _, v = line.partition(":")
        info[k.strip()] = v.strip()
    return (f"{info.get('Model name', '?')}, family {info.get('CPU family', '?')} model "
            f"{info.get('Model', '?')}, {info.get('CPU(s)', '?')} CPUs")


def time_tiktoken(enc, text, repeats):
    enc.encode_ordinary(text)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        enc.encode_ordinary(text)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def run_attn_bench(build, texts, repeats):
    args = [os.path.join(build, "bench", "bench_tokenizer"), "--benchmark_format=json",
            f"--benchmark_repetitions={repeats}", "--benchmark_min_time=0.2"]
    for name, path in texts:
        if name not in ("tinyshakespeare", "the-verdict"):
            args += ["--text", f"{name}={path}"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    results = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        key = b["run_name"].replace("/real_time", "")
        seconds = b["real_time"] / 1e3  # wall clock, in ms (every benchmark uses real time)
        results.setdefault(key, []).append(seconds)
    return {k: (statistics.median(v), min(v)) for k, v in results.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--multilingual-bytes", type=int, default=1 << 20)
    opts = ap.parse_args()

    ml_path = os.path.join(opts.build, "bench", "multilingual.txt")
    os.makedirs(os.path.dirname(ml_path), exist_ok=True)
    with open(ml_path, "w", encoding="utf-8", newline="") as f:
        f.write(multilingual_text(opts.multilingual_bytes))
    texts = [("tinyshakespeare", os.path.join(ROOT, "data", "tinyshakespeare.txt")),
             ("the-verdict", os.path.join(ROOT, "data", "the-verdict.txt")),
             ("multilingual", ml_path)]

    enc = gpt2()
    attn_cli = os.path.join(opts.build, "attn")
    rows = []
    attn = run_attn_bench(opts.build, texts, opts.repeats)
    for name, path in texts:
        with open(path, encoding="utf-8", newline="") as f:  # bytes as they are (\r\n too)
            text = f.read()
        ids = enc.encode_ordinary(text)
        got = subprocess.run([attn_cli, "tokenize", "--file", path], capture_output=True, text=True, check=True).stdout
        if [int(x) for x in got.split()] != ids:
            sys.exit(f"compare_tiktoken: attn's ids differ from tiktoken's on {name}")
        mb = len(text.encode("utf-8")) / 1e6
        tk_med, tk_best = time_tiktoken(enc, text, opts.repeats)
        se_med, se_best = attn[f"encode/{name}"]
        pa_med, pa_best = attn[f"encode_parallel/{name}"]
        rows.append((name, mb, len(ids), tk_med, tk_best, se_med, se_best, pa_med, pa_best))

    load = os.getloadavg()
    print(f"CPU: {cpu_name()}; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"tiktoken {tiktoken.__version__}; wall clock, median of {opts.repeats} (best in brackets)\n")
    print("| text | MB | tokens | tiktoken MB/s | attn encode MB/s | ratio | attn encode_parallel MB/s | ratio "
          "| tiktoken tokens/s | attn encode tokens/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, mb, n, tk_med, tk_best, se_med, se_best, pa_med, pa_best in rows:
        print(f"| {name} | {mb:.2f} | {n:,} | {mb / tk_med:.1f} ({mb / tk_best:.1f}) "
              f"| {mb / se_med:.1f} ({mb / se_best:.1f}) | {tk_med / se_med:.2f}x "
              f"| {mb / pa_med:.1f} ({mb / pa_best:.1f}) | {tk_med / pa_med:.2f}x "
              f"| {n / tk_med / 1e6:.2f}M | {n / se_med / 1e6:.2f}M |")
    print("\nids: attn tokenize == tiktoken encode_ordinary on every text")


if __name__ == "__main__":
    main()
