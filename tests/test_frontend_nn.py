"""Frontend nn ops (convolution, pooling, normalisation, attention): PyTorch modules -> LEIR, verified
against PyTorch on fresh inputs. Shapes and arguments are the awkward ones (odd sizes, size-1 dims,
strides 2/3, dilation, asymmetric padding, groups) and every program stays small."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from steptp_env import verify
from steptp_env.ir.analysis import loop_iterations
from steptp_env.frontend import UnsupportedOpError, from_torch

MAX_ITERATIONS = 200_000


def _randomise(module: nn.Module) -> nn.Module:
    """Random parameters and running stats, so that affine weights and statistics are really read
    (PyTorch initialises them to ones and zeros)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-1, 1)
        for name, buf in module.named_buffers():
            if buf.is_floating_point():
                buf.uniform_(0.5, 1.5) if name.endswith("var") else buf.uniform_(-1, 1)
    return module


def check(module: nn.Module, *inputs: torch.Tensor):
    wl = from_torch(_randomise(module), inputs)
    assert loop_iterations(wl.program.nests) < MAX_ITERATIONS, "test program too large"
    report = verify(wl.program, wl)
    assert report.equivalent, report.reason
    return wl


def rand(*shape):
    return torch.rand(*shape) * 2 - 1


class Fn(nn.Module):
    """A module calling one function, for ops without a module of their own."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


# -- convolutions -------------------------------------------------------------------------------------

CONVS = {
    "1d-stride2-pad1": (nn.Conv1d(3, 4, 3, stride=2, padding=1), (2, 3, 9)),
    "1d-dilation2-pad2-nobias": (nn.Conv1d(3, 2, 3, padding=2, dilation=2, bias=False), (1, 3, 7)),
    "1d-stride3-valid-size1-batch": (nn.Conv1d(2, 3, 2, stride=3), (1, 2, 7)),
    "2d-nonsquare-asym-groups2": (nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(2, 1), groups=2), (2, 4, 7, 5)),
    "2d-depthwise": (nn.Conv2d(3, 3, 3, padding=1, groups=3), (1, 3, 5, 5)),
    "2d-depthwise-multiplier": (nn.Conv2d(2, 4, (1, 3), stride=2, groups=2, bias=False), (2, 2, 5, 7)),
    "2d-same-dilation2-nobias": (nn.Conv2d(2, 3, 3, padding="same", dilation=2, bias=False), (1, 2, 7, 5)),
    "2d-same-even-kernel": (nn.Conv2d(2, 2, (4, 2), padding="same"), (1, 2, 6, 5)),
    "2d-valid-stride3": (nn.Conv2d(3, 2, 2, stride=3, padding="valid"), (2, 3, 7, 7)),
    "2d-1x1-size1-dims": (nn.Conv2d(3, 5, 1), (2, 3, 1, 5)),
    "3d-asym": (nn.Conv3d(2, 3, (2, 3, 1), stride=(1, 2, 1), padding=(1, 0, 1)), (1, 2, 5, 5, 3)),
    "3d-groups-dilation": (nn.Conv3d(2, 2, 2, dilation=(2, 1, 1), groups=2), (1, 2, 5, 3, 3)),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_conv(name):
    module, shape = CONVS[name]
    check(module, rand(*shape))


def test_conv2d_on_an_unbatched_input():
    check(nn.Conv2d(3, 2, 3, padding=1), rand(3, 5, 4))


def test_conv_program_pads_then_reduces_then_adds_bias():
    wl = check(nn.Conv2d(2, 3, 3, padding=(2, 1)), rand(1, 2, 5, 5))
    first, conv, bias = wl.program.leir.split(";];")[:3]
    assert "if_then_else(2<=" in first and "&1<=" in first
    assert conv.count("L^{") == 7 and bias.count("L^{") == 4


CONV_TRANSPOSES = {
    "1d-stride3-dilation2": (nn.ConvTranspose1d(3, 2, 3, stride=3, dilation=2), (2, 3, 5)),
    "1d-padding-beyond-kernel": (nn.ConvTranspose1d(2, 2, 3, stride=2, padding=3, bias=False), (1, 2, 7)),
    "2d-outpad-groups": (nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), (1, 4, 5, 4)),
    "2d-nonsquare-dilation": (nn.ConvTranspose2d(2, 3, (2, 3), stride=(1, 2), padding=(0, 2), dilation=(2, 1)),
                              (2, 2, 3, 5)),
    "2d-depthwise": (nn.ConvTranspose2d(3, 3, 3, stride=2, groups=3, bias=False), (1, 3, 3, 3)),
    "3d": (nn.ConvTranspose3d(2, 2, (2, 1, 3), stride=(2, 1, 1), padding=(0, 0, 1)), (1, 2, 3, 3, 3)),
}


@pytest.mark.parametrize("name", list(CONV_TRANSPOSES))
def test_conv_transpose(name):
    module, shape = CONV_TRANSPOSES[name]
    check(module, rand(*shape))


@pytest.mark.parametrize("transposed", [False, True])
def test_aten_convolution(transposed):
    """The generic ATen op, which torch.export keeps when a model calls it; weight (4, 3, 2, 3) is
    (Cout, Cin, ...) for a convolution and (Cin, Cout, ...) for a transposed one."""
    module = Fn(lambda x, w: torch.ops.aten.convolution(x, w, None, [2, 1], [1, 0], [1, 2], transposed,
                                                        [1, 0] if transposed else [0, 0], 1))
    check(module, rand(1, 4 if transposed else 3, 5, 7), rand(4, 3, 2, 3))


# -- pooling ------------------------------------------------------------------------------------------

POOLS = {
    "max1d-pad-dilation": (nn.MaxPool1d(3, stride=2, padding=1, dilation=2), (2, 3, 9)),
    "max2d-nonsquare": (nn.MaxPool2d((3, 2), stride=(2, 1), padding=(1, 0)), (1, 2, 7, 5)),
    "max2d-default-stride": (nn.MaxPool2d(3), (2, 1, 7, 8)),
    "max3d-stride3": (nn.MaxPool3d((2, 3, 1), stride=(1, 3, 2), padding=(1, 1, 0)), (1, 2, 5, 7, 3)),
    "avg1d-pad": (nn.AvgPool1d(3, stride=2, padding=1), (2, 3, 7)),
    "avg1d-exclude-pad": (nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False), (2, 3, 7)),
    "avg2d-exclude-pad-asym": (nn.AvgPool2d((3, 5), stride=(2, 3), padding=(1, 2), count_include_pad=False),
                               (1, 2, 7, 11)),
    "avg2d-divisor-override": (nn.AvgPool2d(2, stride=1, padding=1, divisor_override=3), (1, 2, 5, 3)),
    "avg3d-exclude-pad": (nn.AvgPool3d(3, stride=2, padding=1, count_include_pad=False), (1, 1, 5, 5, 3)),
    "adaptive-avg1d-to-1": (nn.AdaptiveAvgPool1d(1), (2, 3, 7)),
    "adaptive-avg2d-divisible": (nn.AdaptiveAvgPool2d((1, 2)), (2, 3, 5, 6)),
    "adaptive-avg2d-uneven": (nn.AdaptiveAvgPool2d((3, 4)), (1, 2, 7, 5)),
    "adaptive-avg3d": (nn.AdaptiveAvgPool3d((2, 1, 3)), (1, 2, 5, 3, 3)),
    "adaptive-max2d-uneven": (nn.AdaptiveMaxPool2d((3, 2)), (1, 2, 7, 5)),
    "adaptive-max1d": (nn.AdaptiveMaxPool1d(1), (2, 3, 7)),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pool(name):
    module, shape = POOLS[name]
    check(module, rand(*shape))


def test_pools_on_an_unbatched_input():
    check(Fn(lambda x: (F.max_pool2d(x, 3, 2), F.avg_pool2d(x, 2))), rand(3, 7, 5))


@pytest.mark.parametrize("module, shape", [
    (nn.MaxPool1d(3, stride=2, padding=1, return_indices=True), (2, 3, 7)),
    (nn.MaxPool2d((3, 2), stride=(2, 3), padding=(1, 1), dilation=(2, 1), return_indices=True), (1, 2, 7, 5)),
    (nn.MaxPool3d(2, return_indices=True), (1, 2, 3, 5, 4)),
    (nn.AdaptiveMaxPool2d((3, 2), return_indices=True), (1, 2, 7, 5)),
], ids=["max1d", "max2d", "max3d", "adaptive-max2d"])
def test_max_pool_indices(module, shape):
    wl = check(module, rand(*shape))
    assert [s.dtype for s in wl.program.signature.outputs] == ["float32", "int64"]


@pytest.mark.parametrize("module, shape, op", [
    (nn.MaxPool2d(3, stride=2, ceil_mode=True), (1, 2, 7, 7), "aten.max_pool2d.default"),
    (nn.AvgPool1d(2, ceil_mode=True), (1, 2, 7), "aten.avg_pool1d.default"),
])
def test_ceil_mode_is_unsupported(module, shape, op):
    with pytest.raises(UnsupportedOpError, match=f"{op}.*ceil_mode"):
        from_torch(module, (rand(*shape),))


# -- normalisation ------------------------------------------------------------------------------------

NORMS = {
    "batch1d-2d-input": (nn.BatchNorm1d(3), (4, 3)),
    "batch1d": (nn.BatchNorm1d(3, eps=1e-3), (2, 3, 7)),
    "batch2d-no-affine": (nn.BatchNorm2d(4, affine=False), (2, 4, 3, 5)),
    "batch3d": (nn.BatchNorm3d(2), (1, 2, 3, 1, 5)),
    "batch2d-batch-stats": (nn.BatchNorm2d(3, track_running_stats=False), (3, 3, 5, 1)),
    "layer-2-dims": (nn.LayerNorm([3, 5]), (2, 3, 5)),
    "layer-all-dims": (nn.LayerNorm([3, 5]), (3, 5)),
    "layer-no-affine": (nn.LayerNorm(7, elementwise_affine=False, eps=1e-3), (2, 3, 7)),
    "layer-no-bias": (nn.LayerNorm(5, bias=False), (1, 5)),
    "group-1-group": (nn.GroupNorm(1, 4), (2, 4, 3, 5)),
    "group-per-channel": (nn.GroupNorm(3, 3, eps=1e-3), (2, 3, 7)),
    "group-2-no-affine": (nn.GroupNorm(2, 6, affine=False), (1, 6, 3, 1, 3)),
    "instance1d": (nn.InstanceNorm1d(3), (2, 3, 7)),
    "instance2d-affine": (nn.InstanceNorm2d(3, affine=True), (2, 3, 5, 3)),
    "instance2d-running-stats": (nn.InstanceNorm2d(2, track_running_stats=True), (1, 2, 3, 5)),
    "instance3d": (nn.InstanceNorm3d(2), (1, 2, 3, 3, 3)),
    "rms-default-eps": (nn.RMSNorm(7), (2, 3, 7)),
    "rms-2-dims": (nn.RMSNorm([3, 5], eps=1e-3, elementwise_affine=False), (2, 3, 5)),
}


@pytest.mark.parametrize("name", list(NORMS))
def test_norm(name):
    module, shape = NORMS[name]
    check(module, rand(*shape))


def test_layer_norm_is_mean_then_variance_then_normalise():
    wl = check(nn.LayerNorm(5), rand(3, 5))
    nests = wl.program.leir.split(";];")
    assert len(nests) == 4 and "sqrt(" in nests[2]


# -- attention ----------------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, mask: torch.Tensor | None = None, **kwargs):
        super().__init__()
        self.kwargs = kwargs
        if mask is not None:
            self.register_buffer("mask", mask)
        else:
            self.mask = None

    def forward(self, q, k, v, *mask):
        attn_mask = mask[0] if mask else self.mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **self.kwargs)


def _bool_mask(rows: int, cols: int) -> torch.Tensor:
    """A random mask where every row keeps at least one key (a fully masked row is NaN in PyTorch)."""
    torch.manual_seed(1)
    keep = torch.rand(rows, cols) < 0.5
    keep[torch.arange(rows), torch.arange(rows) % cols] = True
    return keep


def test_sdpa_plain_odd_sizes():
    check(Attention(), rand(2, 3, 5, 7), rand(2, 3, 6, 7), rand(2, 3, 6, 3))


def test_sdpa_without_heads_dim():
    check(Attention(), rand(2, 5, 3), rand(2, 1, 3), rand(2, 1, 4))


def test_sdpa_bool_mask_broadcast():
    check(Attention(_bool_mask(5, 6)), rand(2, 3, 5, 7), rand(2, 3, 6, 7), rand(2, 3, 6, 3))


def test_sdpa_float_mask_broadcast():
    check(Attention(), rand(2, 3, 5, 4), rand(2, 3, 6, 4), rand(2, 3, 6, 3), rand(3, 1, 6))


def test_sdpa_causal_with_scale():
    check(Attention(is_causal=True, scale=0.3), rand(1, 2, 5, 4), rand(1, 2, 7, 4), rand(1, 2, 7, 5))


def test_sdpa_mqa_one_kv_head():
    check(Attention(enable_gqa=True), rand(2, 3, 5, 4), rand(2, 1, 6, 4), rand(2, 1, 6, 3))


def test_sdpa_gqa_two_kv_heads():
    check(Attention(enable_gqa=True, is_causal=True), rand(1, 4, 5, 4), rand(1, 2, 5, 4), rand(1, 2, 5, 3))


def test_sdpa_gqa_written_with_repeat_interleave():
    module = Fn(lambda q, k, v: F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=-3)))
    check(module, rand(1, 4, 5, 4), rand(1, 2, 6, 4), rand(1, 2, 6, 3))


def test_sdpa_with_dropout_is_unsupported():
    module = Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5))
    with pytest.raises(UnsupportedOpError, match="scaled_dot_product_attention.*dropout"):
        from_torch(module, (rand(1, 2, 3, 4), rand(1, 2, 3, 4), rand(1, 2, 3, 4)))


def test_aten_convolution_with_backend_flags():
    module = Fn(lambda x, w, bias: torch.ops.aten._convolution(x, w, bias, [1], [2], [3], False, [0], 1,
                                                              False, False, True, True))
    check(module, rand(2, 3, 9), rand(2, 3, 2), rand(2))


def test_native_batch_norm_inference():
    module = Fn(lambda x, w, bias, mean, var: torch.ops.aten._native_batch_norm_legit_no_training(
        x, w, bias, mean, var, 0.1, 1e-3)[0])
    check(module, rand(2, 3, 5), rand(3), rand(3), rand(3), torch.rand(3) + 0.5)
