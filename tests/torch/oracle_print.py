"""Reference strings for attn::to_string: str(t) of PyTorch 1.13 with default
print options, for tensors that cover every branch of torch/_tensor_str.py.

Writes print.json: {"cases": [{"name", "tensor", "suffix", "options"?, "str"}]}, tensors as
float32 bit patterns (tensor_bits_json) so inf, NaN and -0.0 survive. "suffix"
is what to_string must append (grad_fn=<...> or requires_grad=True), taken
from the tensor itself; "options", where present, are the non-default
torch.set_printoptions the string was made with.
"""
import math

import torch

from oracle_util import tensor_bits_json, write_json

INPUTS = [[0.43, 0.15, 0.89],   # Your
          [0.55, 0.87, 0.66],   # journey
          [0.57, 0.85, 0.64],   # starts
          [0.22, 0.58, 0.33],   # with
          [0.77, 0.25, 0.10],   # one
          [0.05, 0.80, 0.55]]   # step


def generate(out_dir):
    g = torch.Generator().manual_seed(123)

    def rand(*shape):
        return torch.rand(shape, generator=g)

    def randn(*shape):
        return torch.randn(shape, generator=g)

    def t(values):
        return torch.tensor(values, dtype=torch.float32)

    inf, nan = math.inf, math.nan
    x = t(INPUTS)
    cases = [
        # values in [0, 1), fixed style
        ("rand_3", rand(3)),
        ("rand_6x3", rand(6, 3)),
        ("rand_1x1", rand(1, 1)),
        ("rand_3x1", rand(3, 1)),
        # negative values
        ("randn_4x5", randn(4, 5)),
        ("randn_7", randn(7)),
        ("neg_only", -rand(2, 4)),
        ("randn_times_10", randn(3, 4) * 10),
        ("randn_times_100", randn(5) * 100),
        # the SPEC's example and the chapter's matrices
        ("spec_inputs", x),
        ("spec_batch", torch.stack([x, x])),
        ("attn_scores", x @ x.T),
        ("attn_weights_6x6", torch.softmax(x @ x.T, dim=-1)),
        ("attn_weights_row_sums", torch.softmax(x @ x.T, dim=-1).sum(-1)),
        ("causal_weights", torch.softmax((x @ x.T).masked_fill(torch.triu(torch.ones(6, 6), 1).bool(), -inf), -1)),
        ("causal_scores_masked", (x @ x.T).masked_fill(torch.triu(torch.ones(6, 6), 1).bool(), -inf)),
        ("context_vec_2", torch.softmax(x @ x[1], 0) @ x),
        ("dropout_ones", torch.ones(6, 6) * (rand(6, 6) > 0.5) * 2),  # kept entries scaled by 1/(1-p)
        ("tril_mask", torch.tril(torch.ones(6, 6))),
        # large values: scientific beyond 1e8 or a range over 1000
        ("large_1e5", randn(3, 3) * 1e5),
        ("large_1e6", rand(4) * 1e6),
        ("large_1e7", randn(2, 3) * 1e7),
        ("large_1e8", rand(5) * 1e8),
        ("large_1e9", randn(2, 2) * 1e9),
        ("large_mixed_sign", -rand(3) * 3e6),
        ("large_1e38", t([3.0e38, -1.0e37, 1.5])),
        # tiny values: scientific below 1e-4
        ("tiny_1e-5", rand(4) * 1e-5),
        ("tiny_2d", randn(3, 3) * 1e-6),
        ("tiny_1e-4_float32", t([1e-4, 0.5])),
        ("just_above_1e-4", t([1.001e-4, 0.1])),
        ("subnormal", t([1e-40, 1.0])),
        # mixed ranges
        ("mixed_sci", t([1e-3, 1.0, 5e3])),
        ("ratio_just_under_1000", t([0.001, 1.0])),
        ("ratio_over_1000", t([0.0009, 1.0])),
        ("mixed_randn", randn(4) * torch.tensor([1e-2, 1.0, 1e2, 1e4])),
        # integer-valued: "1." style
        ("int_arange", torch.arange(6.0)),
        ("int_ones", torch.ones(2, 3)),
        ("int_zeros", torch.zeros(3)),
        ("int_negative", t([-1.0, 2.0, 300.0])),
        ("int_2d", torch.arange(12.0).reshape(3, 4) - 5),
        ("int_ratio_1000", t([1.0, 1000.0])),
        ("int_ratio_over_1000", t([1.0, 2000.0])),
        ("int_1e8", t([100000000.0])),
        ("int_over_1e8", t([123456789.0, 1.0])),
        ("int_99999999", t([99999999.0, -3.0])),
        ("int_large_sci", t([1e9, 2e9])),
        ("int_with_inf", t([1.0, inf])),
        ("int_with_nan", t([nan, 1.0])),
        ("int_0d", t(3.0)),
        # signed zero
        ("neg_zero_int", t([-0.0, 1.0])),
        ("neg_zero_alone", t([-0.0])),
        ("zeros_signed", t([0.0, -0.0])),
        ("neg_zero_fixed", t([-0.0, 0.5])),
        ("neg_zero_sci", t([-0.0, 1e-6])),
        ("round_to_neg_zero", t([-0.00004, 0.5, 0.25])),
        # inf and nan
        ("inf_nan", t([inf, -inf, nan])),
        ("fixed_nan", t([1.5, nan])),
        ("fixed_neg_inf", t([0.5, -inf])),
        ("sci_inf", t([inf, 1e-5, 1.0])),
        ("all_nan_2d", torch.full((2, 2), nan)),
        ("nan_wide", t([nan, 0.1234, -12.5])),
        ("inf_2d", t([[1.25, inf], [-inf, 0.0]])),
        # 0-d tensors
        ("scalar_half", t(0.5)),
        ("scalar_neg_zero", t(-0.0)),
        ("scalar_tiny", t(1e-5)),
        ("scalar_inf", t(inf)),
        ("scalar_nan", t(nan)),
        ("scalar_large", t(123456.7)),
        ("scalar_negative", t(-2.71828)),
        ("scalar_dot", x[1] @ x[2]),
        # empty tensors
        ("empty_1d", torch.zeros(0)),
        ("empty_0x3", torch.zeros(0, 3)),
        ("empty_2x0", torch.zeros(2, 0)),
        ("empty_1x0x2", torch.zeros(1, 0, 2)),
        # rounding of ties and carries
        ("ties", t([0.03125, 0.09375, 0.15625, 0.5])),
        ("carry", t([0.99995, 9.99995, -9.99996])),
        ("carry_sci", t([9.99996e-6, 1.0])),
        ("round_half", t([0.00015, 0.00025, 0.12345])),
        # long rows that wrap at linewidth 80
        ("wrap_rand_9", rand(9)),
        ("wrap_rand_10", rand(10)),
        ("wrap_randn_9", randn(9)),
        ("wrap_rand_30", rand(30)),
        ("wrap_randn_50", randn(50)),
        ("wrap_int_40", torch.arange(40.0)),
        ("wrap_2d", rand(3, 25)),
        ("wrap_2d_neg", randn(3, 12)),
        ("wrap_sci_row", randn(20) * 1e-6),
        ("wrap_3d", randn(2, 2, 11)),
        ("wrap_1000", rand(1000)),
        # more dims
        ("3d_2x3x4", rand(2, 3, 4)),
        ("3d_attn_2x6x6", torch.softmax(randn(2, 6, 6), -1)),
        ("4d_2x2x3x4", rand(2, 2, 3, 4)),
        ("4d_neg", randn(1, 2, 2, 2)),
        ("5d", rand(2, 1, 2, 2, 2)),
        ("8d", rand(1, 1, 1, 1, 1, 1, 1, 3)),
        ("deep_wrap", rand(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 12)),
        # summarised: more than 1000 elements
        ("sum_rand_1001", rand(1001)),
        ("sum_rand_2000", rand(2000)),
        ("sum_randn_40x40", randn(40, 40)),
        ("sum_3d", rand(10, 10, 11)),
        ("sum_wide_rows", rand(4, 300)),
        ("sum_tall", rand(300, 4)),
        ("sum_2x3x200", rand(2, 3, 200)),
        ("sum_int", torch.arange(2000.0)),
        ("sum_sci", randn(50, 50) * 1e5),
        ("sum_hidden_middle", torch.cat([rand(3), torch.full((1000,), 1e9), rand(3)])),
        ("sum_4d", randn(7, 2, 8, 10)),
        ("sum_7_rows", rand(7, 150)),
    ]
    out = []
    for name, tensor in cases:
        out.append({"name": name, "tensor": tensor_bits_json(tensor), "suffix": "", "str": str(tensor)})

    # Suffixes: grad_fn and requires_grad, on the same line or wrapped.
    w = rand(3, 2).requires_grad_(True)
    with_grad = [
        ("grad_leaf", w),
        ("grad_mm", x @ w),
        ("grad_softmax", torch.softmax(x @ w, -1)),
        ("grad_scalar", (x @ w).sum()),
        ("grad_wrapped_row", rand(9).requires_grad_(True) * 2),
        ("grad_wide_row", rand(8).requires_grad_(True) * 1e-6),
        ("grad_batched", torch.matmul(torch.stack([x, x]), w)),
        ("grad_empty", torch.zeros(0, 2).requires_grad_(True) * 1),
    ]
    for name, tensor in with_grad:
        if tensor.grad_fn is not None:
            suffix = "grad_fn=<{}>".format(type(tensor.grad_fn).__name__)
        else:
            suffix = "requires_grad=True"
        out.append({"name": name, "tensor": tensor_bits_json(tensor), "suffix": suffix, "str": str(tensor)})

    # Non-default options: torch.set_printoptions, restored afterwards.
    option_cases = [
        ("opt_precision_2", dict(precision=2), rand(3, 4)),
        ("opt_precision_6", dict(precision=6), randn(2, 3)),
        ("opt_precision_2_sci", dict(precision=2), rand(4) * 1e-6),
        ("opt_precision_0", dict(precision=0), randn(5) * 10),
        ("opt_linewidth_40", dict(linewidth=40), rand(20)),
        ("opt_linewidth_120", dict(linewidth=120), randn(3, 20)),
        ("opt_linewidth_10", dict(linewidth=10), rand(2, 3)),
        ("opt_threshold_10", dict(threshold=10), rand(4, 5)),
        ("opt_threshold_10_edge_1", dict(threshold=10, edgeitems=1), randn(3, 4, 5)),
        ("opt_edgeitems_5", dict(edgeitems=5), rand(1200)),
        ("opt_short_profile", dict(precision=2, edgeitems=2), randn(40, 40)),
        # sci_mode forced (chapter 4's notebook sets sci_mode=False): 1.13 keeps
        # the width of the notation it would have chosen.
        ("opt_sci_off_tiny", dict(sci_mode=False), torch.tensor([[-5.9605e-08], [1.9868e-08]])),
        ("opt_sci_off_range", dict(sci_mode=False), torch.tensor([1e-9, 1000.0, -2.5])),
        ("opt_sci_off_int_wide", dict(sci_mode=False), torch.tensor([1.0, 1e9])),
        ("opt_sci_off_plain", dict(sci_mode=False), rand(2, 3)),
        ("opt_sci_off_zeros", dict(sci_mode=False), torch.zeros(3)),
        ("opt_sci_off_nonfinite", dict(sci_mode=False),
         torch.tensor([float("inf"), 1e-7, float("nan"), -3.0])),
        ("opt_sci_on_plain", dict(sci_mode=True), rand(3, 4)),
        ("opt_sci_on_int", dict(sci_mode=True), torch.tensor([1.0, -2.0, 30.0])),
        ("opt_sci_on_zeros", dict(sci_mode=True), torch.zeros(2)),
    ]
    for name, options, tensor in option_cases:
        torch.set_printoptions(**options)
        try:
            text = str(tensor)
        finally:
            torch.set_printoptions(profile="default")
        out.append({"name": name, "tensor": tensor_bits_json(tensor), "suffix": "", "options": options, "str": text})

    write_json(out_dir / "print.json", {"torch": torch.__version__, "cases": out})
