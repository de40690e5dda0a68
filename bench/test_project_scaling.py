"""Unit tests of bench/project_scaling.py against hand-computed cases (ctest:
project_scaling; or python3 -m unittest bench/test_project_scaling.py)."""
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import project_scaling as ps  # noqa: E402


class ProjectScaling(unittest.TestCase):
    def test_gpt2_parameter_counts(self):
        # OpenAI's GPT-2 small and medium (tied head, qkv bias).
        self.assertEqual(ps.MODELS["124M"], 124_439_808)
        self.assertEqual(ps.MODELS["355M"], 354_823_168)
        # The book's GPTModel (untied head, no qkv bias): 163,009,536.
        self.assertEqual(ps.gpt2_params(12, 768, tied=False, qkv_bias=False), 163_009_536)

    def test_ring_allreduce(self):
        # 100M parameters = 400 MB of gradients over 4 ranks at 10 GB/s:
        # 2 * 3/4 * 400e6 / 10e9 = 0.06 s; with 5 us latency, 6 messages more.
        self.assertAlmostEqual(ps.allreduce_seconds(100e6, 4, 10e9), 0.06, places=12)
        self.assertAlmostEqual(ps.allreduce_seconds(100e6, 4, 10e9, 5e-6), 0.06 + 30e-6, places=12)
        self.assertEqual(ps.allreduce_seconds(100e6, 1, 10e9), 0.0)
        # 2 ranks: each sends and receives the whole gradient once.
        self.assertAlmostEqual(ps.allreduce_seconds(1e9, 2, 4e9), 1.0, places=12)

    def test_step_with_and_without_overlap(self):
        # compute 0.3 s (forward 0.1, backward 0.2), allreduce 0.06 s, 400 MB
        # of gradients in 25 MB buckets (f = 1/16).
        self.assertAlmostEqual(ps.step_seconds(0.3, 0.06, False, 400e6, 25e6), 0.36)
        # the link keeps up: backward, then the last bucket 0.06 / 16.
        self.assertAlmostEqual(ps.step_seconds(0.3, 0.06, True, 400e6, 25e6), 0.1 + 0.2 + 0.00375)
        # the link is the bottleneck: it starts after the first bucket's share of backward.
        self.assertAlmostEqual(ps.step_seconds(0.3, 0.6, True, 400e6, 25e6), 0.1 + 0.2 / 16 + 0.6)
        # one bucket as large as the gradients: no overlap at all.
        self.assertAlmostEqual(ps.step_seconds(0.3, 0.06, True, 400e6, 400e6), 0.36)

    def test_zero1_memory(self):
        # 1e9 parameters at 8 ranks: 4 + 4 bytes whole, 8 / 8 bytes of moments.
        self.assertEqual(ps.zero1_bytes_per_rank(1e9, 8, True), 9e9)
        self.assertEqual(ps.zero1_bytes_per_rank(1e9, 8, False), 16e9)

    def run_main(self, args):
        f = io.StringIO()
        with redirect_stdout(f):
            self.assertEqual(ps.main(args), 0)
        return f.getvalue()

    def test_table_row_by_hand(self):
        # 1000 tokens in 1 s on the 124M model itself: 124M at 8 ranks over
        # 25 Gbit/s moves 1.75 * 497,759,232 B / 3.125e9 B/s = 0.278745 s, so a
        # step is 1.278745 s: 8000 / 1.278745 = 6,256 tokens/s, 78%. Memory:
        # 16 P = 1.854 GiB whole, (8 + 8/8) P = 1.043 GiB with ZeRO-1, 7/16 saved.
        out = self.run_main(["--step-ms", "1000", "--tokens-per-step", "1000",
                             "--measured-params", "124439808", "--ranks", "8", "--links-gbit", "25"])
        self.assertIn("| 124M | 1 | - | 1,000 ms | 1,000 | 100% |", out)
        self.assertIn("| 124M | 8 | 25 Gbit/s | 1,279 ms | 6,256 | 78% |", out)
        self.assertIn("| 124M | 8 | 1.85 GiB | 1.04 GiB | 44% |", out)

    def test_reads_metrics_and_allreduce_json(self):
        with tempfile.TemporaryDirectory() as d:
            metrics = os.path.join(d, "metrics.jsonl")
            with open(metrics, "w") as f:
                f.write(json.dumps({"iter": 0, "ms_per_iter": None, "tokens_per_s": None}) + "\n")
                for ms in (900.0, 1000.0, 1100.0):
                    f.write(json.dumps({"iter": 1, "ms_per_iter": ms, "tokens_per_s": 512 * 1000 / ms}) + "\n")
            self.assertEqual(ps.measured_from_metrics(metrics), (1000.0, 512))
            ar = os.path.join(d, "ar.json")
            with open(ar, "w") as f:
                json.dump({"ranks": 2, "results": [
                    {"op": "allreduce", "bytes": 1 << 20, "busbw_GBps": 5.0},
                    {"op": "allreduce", "bytes": 1 << 26, "busbw_GBps": 7.5},
                    {"op": "iallreduce", "bytes": 1 << 26, "busbw_GBps": 9.0}]}, f)
            self.assertEqual(ps.measured_busbw(ar), (7.5e9, 2, 1 << 26))
            out = self.run_main(["--metrics", metrics, "--measured-params", "1e8", "--allreduce-json", ar])
            self.assertIn("1000.0 ms per step of 512 tokens", out)
            self.assertIn("measured 7.50 GB/s (N=2, 64 MiB)", out)


if __name__ == "__main__":
    unittest.main()
