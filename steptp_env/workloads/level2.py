"""Level 2: fused operator chains and attention blocks (the families of KernelBench's level 2).

`Chain` is one parameterised module for every "head followed by 2-5 pointwise / norm / pooling /
reduction steps" workload: the head is a Gemm (nn.Linear), a Matmul (x @ W), a Bmm of two inputs, a
Conv1d/2d/3d or a ConvTranspose2d, and each step is written as `name` or `name:arg:arg` (see `Step`).
`CausalSelfAttention` covers MHA / MQA / GQA (by the number of key/value heads), through
`scaled_dot_product_attention` or written as ops with a mask buffer, optionally followed by a Gemm, an
activation and a reduction over the hidden dim.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .level1 import _ACTIVATIONS, _randomise_running_stats
from .registry import Case, positive, register, uniform

LEVEL = "level2"


class Step(nn.Module):
    """One step of a chain on a (N, C, *spatial) tensor (spatial may be empty: a Gemm's (N, F) output).

    Steps: `bias_add` / `multiply_param` (a learned per-channel tensor); `add:v`, `subtract:v`,
    `multiply:v`, `scale:v`, `divide:v` (a constant); any name of level 1's activations (`leaky_relu:s`
    takes a slope, `hardtanh:lo:hi` bounds); `clamp:lo:hi`; `min_value:v` (min with a constant);
    `center` (x - mean over channels); `sum`, `mean`, `max`, `min`, `logsumexp` (over the channels, kept);
    `softmax`, `log_softmax` (over the channels); `batch_norm`, `group_norm:G`, `instance_norm`, `layer_norm`;
    `max_pool:k`, `avg_pool:k`, `global_avg_pool`; `residual_add` (the head's output added back);
    `gemm:F` (a Linear to F features); `matmul:P` (x @ W over the last dim); `conv:C:k:pad` (a conv to C
    channels).
    """

    def __init__(self, text: str, channels: int, spatial: int, last: int) -> None:
        super().__init__()
        name, *args = text.split(":")
        self.name = name
        self.args = [float(a) for a in args]
        self.spatial = spatial
        self.channels, self.last = channels, last  # after this step
        per_channel = (channels,) + (1,) * spatial
        if name in ("bias_add", "multiply_param"):
            self.param = nn.Parameter(torch.rand(per_channel) * 0.5 + (0.75 if name == "multiply_param" else -0.25))
        elif name == "batch_norm":
            self.norm = (nn.BatchNorm1d, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)[spatial](channels)
            _randomise_running_stats(self.norm)
        elif name == "group_norm":
            self.norm = nn.GroupNorm(int(self.args[0]) if self.args else 4, channels)
            with torch.no_grad():
                self.norm.weight.uniform_(0.5, 1.5)
                self.norm.bias.uniform_(-0.5, 0.5)
        elif name == "instance_norm":
            self.norm = (None, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)[spatial](channels)
        elif name == "layer_norm":
            self.norm = nn.LayerNorm(last)
        elif name == "gemm":
            self.linear = nn.Linear(channels, int(self.args[0]))
            self.channels = self.last = int(self.args[0])
        elif name == "matmul":
            self.weight = nn.Parameter(torch.rand(last, int(self.args[0])) * 2 / math.sqrt(last) - 1 / math.sqrt(last))
            self.last = int(self.args[0])
        elif name == "conv":
            out, k, pad = (int(a) for a in self.args)
            self.conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[spatial - 1](channels, out, k, padding=pad)
            self.channels = out
        if name in ("sum", "mean", "max", "min", "logsumexp"):
            self.channels = 1
            if spatial == 0:
                self.last = 1
        if name in ("max_pool", "avg_pool") and spatial == 0:
            self.channels = self.last = channels // int(self.args[0])

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        n, a = self.name, self.args
        if n == "bias_add":
            return x + self.param
        if n == "multiply_param":
            return x * self.param
        if n == "add":
            return x + a[0]
        if n == "subtract":
            return x - a[0]
        if n in ("multiply", "scale"):
            return x * a[0]
        if n == "divide":
            return x / a[0]
        if n == "leaky_relu" and a:
            return F.leaky_relu(x, a[0])
        if n == "hardtanh" and a:
            return F.hardtanh(x, a[0], a[1])
        if n in _ACTIVATIONS:
            return _ACTIVATIONS[n](x)
        if n == "clamp":
            return torch.clamp(x, a[0], a[1])
        if n == "min_value":
            return torch.clamp(x, max=a[0])
        if n == "center":
            return x - torch.mean(x, dim=1, keepdim=True)
        if n == "sum":
            return torch.sum(x, dim=1, keepdim=True)
        if n == "mean":
            return torch.mean(x, dim=1, keepdim=True)
        if n == "max":
            return torch.max(x, dim=1, keepdim=True)[0]
        if n == "min":
            return torch.min(x, dim=1, keepdim=True)[0]
        if n == "logsumexp":
            return torch.logsumexp(x, dim=1, keepdim=True)
        if n == "softmax":
            return torch.softmax(x, dim=1)
        if n == "log_softmax":
            return torch.log_softmax(x, dim=1)
        if n in ("batch_norm", "group_norm", "instance_norm", "layer_norm"):
            return self.norm(x)
        if n in ("max_pool", "avg_pool"):
            k = int(a[0])
            pool = {("max", 0): F.max_pool1d, ("max", 1): F.max_pool1d, ("max", 2): F.max_pool2d,
                    ("max", 3): F.max_pool3d, ("avg", 0): F.avg_pool1d, ("avg", 1): F.avg_pool1d,
                    ("avg", 2): F.avg_pool2d, ("avg", 3): F.avg_pool3d}[n[:3], self.spatial]
            if self.spatial == 0:  # pool over the features of a (N, F) tensor
                return pool(x.unsqueeze(1), k).squeeze(1)
            return pool(x, k)
        if n == "global_avg_pool":
            dims = [1] if self.spatial == 0 else list(range(2, 2 + self.spatial))
            return torch.mean(x, dim=dims, keepdim=True)
        if n == "residual_add":
            return x + residual
        if n == "gemm":
            return self.linear(x)
        if n == "matmul":
            return torch.matmul(x, self.weight)
        if n == "conv":
            return self.conv(x)
        raise ValueError(f"unknown chain step {n!r}")


class Chain(nn.Module):
    """A head (gemm, matmul, bmm, conv1d, conv2d, conv3d, conv_transpose2d, or none) and its steps."""

    def __init__(self, head: str, c_in: int, c_out: int, steps: Sequence[str], kernel: int = 3, padding: int = 0,
                 stride: int = 1) -> None:
        super().__init__()
        self.head = head
        spatial = {"gemm": 0, "matmul": 0, "bmm": 1, "none": 0, "conv1d": 1, "conv2d": 2, "conv3d": 3,
                   "conv_transpose2d": 2}[head]
        if head == "gemm":
            self.linear = nn.Linear(c_in, c_out)
        elif head == "matmul":
            bound = 1 / math.sqrt(c_in)
            self.weight = nn.Parameter(torch.rand(c_in, c_out) * 2 * bound - bound)
        elif head.startswith("conv_transpose"):
            self.conv = nn.ConvTranspose2d(c_in, c_out, kernel, stride=stride, padding=padding)
        elif head.startswith("conv"):
            self.conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[spatial - 1](c_in, c_out, kernel, padding=padding,
                                                                        stride=stride)
        layers = []
        channels, last = c_out, c_out
        for text in steps:
            step = Step(text, channels, spatial, last)
            channels, last = step.channels, step.last
            layers.append(step)
        self.steps = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
        if self.head == "gemm":
            x = self.linear(x)
        elif self.head == "matmul":
            x = torch.matmul(x, self.weight)
        elif self.head == "bmm":
            x = torch.bmm(x, more[0])
        elif self.head != "none":
            x = self.conv(x)
        residual = x
        for step in self.steps:
            x = step(x, residual)
        return x


class AddAdd(nn.Module):
    """x + y + z (an elementwise chain with three inputs)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x + y + z


class CausalSelfAttention(nn.Module):
    """Causal self-attention with Q/K/V/O projections; `kv_heads` = heads (MHA), 1 (MQA) or in between
    (GQA: each K/V head shared by heads // kv_heads query heads). `sdpa` uses
    `F.scaled_dot_product_attention(is_causal=True)`; otherwise the scores, the mask (a tril buffer, as
    minGPT registers it), the softmax and the product are written as ops, and `fused_qkv` projects Q, K and
    V with one Linear as minGPT does. `tail` follows the output projection: `gemm:F`, an activation name,
    and a reduction over the hidden dim (`sum`, `max`, `mean`)."""

    def __init__(self, d_model: int, heads: int, kv_heads: int, max_len: int, sdpa: bool = True,
                 fused_qkv: bool = False, tail: Sequence[str] = ()) -> None:
        super().__init__()
        assert d_model % heads == 0 and heads % kv_heads == 0
        self.d, self.h, self.kv, self.dh = d_model, heads, kv_heads, d_model // heads
        self.sdpa, self.fused = sdpa, fused_qkv
        if fused_qkv:
            assert kv_heads == heads
            self.qkv = nn.Linear(d_model, 3 * d_model)
        else:
            self.q = nn.Linear(d_model, d_model)
            self.k = nn.Linear(d_model, kv_heads * self.dh)
            self.v = nn.Linear(d_model, kv_heads * self.dh)
        self.o = nn.Linear(d_model, d_model)
        if not sdpa:
            self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))
        self.tail = list(tail)
        width = d_model
        for t in self.tail:
            if t.startswith("gemm:"):
                self.ff = nn.Linear(d_model, int(t.split(":")[1]))
                width = int(t.split(":")[1])
        self.width = width

    def _heads(self, t: torch.Tensor, n: int) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, n, self.dh).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        if self.fused:
            q, k, v = self.qkv(x).split(self.d, dim=2)
            q, k, v = self._heads(q, self.h), self._heads(k, self.h), self._heads(v, self.h)
        else:
            q, k, v = self._heads(self.q(x), self.h), self._heads(self.k(x), self.kv), self._heads(self.v(x), self.kv)
        if self.kv != self.h:  # share each K/V head among its group of query heads
            g = self.h // self.kv
            k = k[:, :, None].expand(b, self.kv, g, s, self.dh).reshape(b, self.h, s, self.dh)
            v = v[:, :, None].expand(b, self.kv, g, s, self.dh).reshape(b, self.h, s, self.dh)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.dh))
            att = att.masked_fill(self.mask[:, :, :s, :s] == 0, float("-inf"))
            att = torch.softmax(att, dim=-1)
            y = att @ v
        y = self.o(y.transpose(1, 2).reshape(b, s, self.d))
        for t in self.tail:
            if t.startswith("gemm:"):
                y = self.ff(y)
            elif t == "sum":
                y = torch.sum(y, dim=-1)
            elif t == "max":
                y = torch.max(y, dim=-1)[0]
            elif t == "mean":
                y = torch.mean(y, dim=-1)
            else:
                y = _ACTIVATIONS[t](y)
        return y


# --------------------------------------------------------------------------------------------------
# Sizes (tiny, small, default) per head
# --------------------------------------------------------------------------------------------------
SIZES = {
    "gemm": (dict(N=16, I=32, O=32), dict(N=128, I=512, O=256), dict(N=128, I=4096, O=4096)),
    "matmul": (dict(N=16, I=32, O=32), dict(N=128, I=512, O=256), dict(N=128, I=4096, O=4096)),
    "bmm": (dict(N=4, M=16, I=16, O=16), dict(N=16, M=128, I=64, O=128), dict(N=128, M=512, I=256, O=512)),
    "conv1d": (dict(N=2, I=4, O=8, L=32), dict(N=8, I=32, O=64, L=256), dict(N=32, I=64, O=128, L=4096)),
    "conv2d": (dict(N=1, I=3, O=8, H=8, W=8), dict(N=4, I=8, O=16, H=64, W=64), dict(N=128, I=3, O=16, H=32, W=32)),
    "conv3d": (dict(N=1, I=2, O=4, D=6, H=6, W=6), dict(N=2, I=3, O=16, D=12, H=24, W=24),
               dict(N=128, I=3, O=16, D=16, H=32, W=32)),
    "conv_transpose2d": (dict(N=1, I=4, O=4, H=6, W=6), dict(N=4, I=16, O=16, H=32, W=32),
                         dict(N=128, I=32, O=16, H=16, W=16)),
    "none": (dict(N=16, F=1024), dict(N=128, F=8192), dict(N=16, F=65536)),
}


def _args(head: str, p, low: float = -1.0, high: float = 1.0) -> list:
    if head in ("gemm", "matmul"):
        return [uniform(p.N, p.I, low=low, high=high)]
    if head == "bmm":
        return [uniform(p.N, p.M, p.I, low=low, high=high), uniform(p.N, p.I, p.O, low=low, high=high)]
    if head == "conv1d":
        return [uniform(p.N, p.I, p.L, low=low, high=high)]
    if head in ("conv2d", "conv_transpose2d"):
        return [uniform(p.N, p.I, p.H, p.W, low=low, high=high)]
    if head == "conv3d":
        return [uniform(p.N, p.I, p.D, p.H, p.W, low=low, high=high)]
    return [uniform(p.N, p.F, low=low, high=high)]


def chain(name: str, steps: Sequence[str], doc: str = "", sizes: tuple | None = None, low: float = -1.0,
          high: float = 1.0, **head_kw) -> None:
    """Register `level2/<name>`: the head is the name's first word (`conv_transpose2d` for that prefix)."""
    head = next(h for h in ("conv_transpose2d", "gemm", "matmul", "bmm", "conv1d", "conv2d", "conv3d")
                if name.startswith(h))

    def make(p):
        c_in, c_out = p.I, p.O
        steps_ = [text.format(**vars(p)) for text in steps]  # widths may name a preset size: gemm:{O}
        return Case(Chain(head, c_in, c_out, steps_, **head_kw), _args(head, p, low, high))

    register(LEVEL, name, f"{head}_chain", make, *(sizes or SIZES[head]),
             doc or f"{head} -> " + " -> ".join(steps))


# ---- Gemm (nn.Linear) chains ----------------------------------------------------------------------------
chain("gemm_gemm", ["gemm:{I}"], sizes=(dict(N=16, I=32, O=32), dict(N=128, I=256, O=256),
                                          dict(N=128, I=4096, O=4096)))
chain("gemm_relu_gemm", ["relu", "gemm:{I}"], sizes=(dict(N=16, I=32, O=32), dict(N=128, I=256, O=256),
                                                      dict(N=128, I=4096, O=4096)))
chain("gemm_multiply_leaky_relu", ["multiply:2.0", "leaky_relu:0.1"])
chain("gemm_divide_sum_scaling", ["divide:2.0", "sum", "scale:1.5"])
chain("gemm_scale_batch_norm", ["scale:0.5", "batch_norm"])
chain("gemm_group_norm_hardtanh", ["group_norm:8", "hardtanh:-2:2"])
chain("gemm_batch_norm_gelu_group_norm_mean_relu", ["batch_norm", "gelu", "group_norm:8", "mean", "relu"])
chain("gemm_sigmoid_sum_logsumexp", ["sigmoid", "sum", "logsumexp"])
chain("gemm_subtract_global_avg_pool_logsumexp_gelu_residual_add",
      ["bias_add", "global_avg_pool", "logsumexp", "gelu", "residual_add"])
chain("gemm_scaling_hardtanh_gelu", ["scale:0.5", "hardtanh:-2:2", "gelu"])
chain("gemm_relu_divide", ["relu", "divide:2.0"])
chain("gemm_sigmoid_scaling_residual_add", ["sigmoid", "scale:2.0", "residual_add"])
chain("gemm_group_norm_min_bias_add", ["group_norm:8", "min", "bias_add"])
chain("gemm_add_relu", ["bias_add", "relu"])
chain("gemm_max_subtract_gelu", ["center", "max", "gelu"])
chain("gemm_swish_divide_clamp_tanh_clamp", ["swish", "divide:2.0", "clamp:-1:1", "tanh", "clamp:-1:1"])
chain("gemm_batch_norm_scaling_softmax", ["batch_norm", "scale:1.5", "softmax"])
chain("gemm_group_norm_swish_multiply_swish", ["group_norm:16", "swish", "multiply_param", "swish"])
chain("gemm_bias_add_hardtanh_mish_group_norm", ["bias_add", "hardtanh", "mish", "group_norm:8"])
chain("gemm_layer_norm_gelu_scale", ["layer_norm", "gelu", "scale:0.5"])
chain("gemm_logsumexp_leaky_relu_leaky_relu_gelu_gelu",
      ["logsumexp", "leaky_relu:0.01", "leaky_relu:0.01", "gelu", "gelu"])
chain("gemm_elu_softplus_residual_add", ["elu", "softplus", "residual_add"])
chain("gemm_hardsigmoid_multiply_param_relu6", ["hardsigmoid", "multiply_param", "relu6"])

# ---- Matmul (x @ W) chains ----------------------------------------------------------------------------------
chain("matmul_softmax", ["softmax"])
chain("matmul_scale_residual_add_clamp_logsumexp_mish",
      ["scale:2.0", "residual_add", "clamp:-10:10", "logsumexp", "mish"])
chain("matmul_mish_mish", ["mish", "mish"])
chain("matmul_swish_scaling", ["swish", "scale:2.0"])
chain("matmul_scaling_residual_add", ["scale:0.5", "residual_add"])
chain("matmul_sigmoid_sum", ["sigmoid", "sum"])
chain("matmul_max_pool_sum_scale", ["max_pool:2", "sum", "scale:0.5"])
chain("matmul_avg_pool_gelu_scale_max", ["avg_pool:4", "gelu", "scale:2.0", "max"])
chain("matmul_divide_gelu", ["divide:10.0", "gelu"])
chain("matmul_min_subtract", ["min_value:0.5", "subtract:0.25"])
chain("matmul_subtract_multiply_relu", ["subtract:0.25", "multiply:1.5", "relu"])
chain("matmul_add_swish_tanh_gelu_hardtanh", ["bias_add", "swish", "tanh", "gelu", "hardtanh"])
chain("matmul_gelu_softmax", ["gelu", "softmax"])
chain("matmul_batch_norm_bias_add_divide_swish", ["batch_norm", "bias_add", "divide:1.5", "swish"])
chain("matmul_group_norm_leaky_relu_sum", ["group_norm:8", "leaky_relu:0.1", "sum"])
chain("matmul_center_log_softmax", ["center", "log_softmax"])
chain("matmul_matmul", ["matmul:{I}"], sizes=(dict(N=16, I=32, O=32), dict(N=128, I=256, O=256),
                                                 dict(N=128, I=4096, O=4096)))

# ---- Bmm chains -------------------------------------------------------------------------------------------------
chain("bmm_bmm", ["matmul:{I}"], sizes=(dict(N=4, M=16, I=16, O=16), dict(N=16, M=128, I=64, O=64),
                                        dict(N=128, M=512, I=256, O=512)))
chain("bmm_instance_norm_residual_add_multiply", ["instance_norm", "residual_add", "multiply:0.5"])
chain("bmm_scale_softmax", ["scale:0.125", "softmax"])

# ---- Conv chains ----------------------------------------------------------------------------------------------
_CONV2D_TWICE = (dict(N=1, I=3, O=8, H=8, W=8), dict(N=2, I=8, O=16, H=64, W=64), dict(N=128, I=3, O=16, H=32, W=32))
chain("conv2d_conv2d", ["conv:{I}:3:0"], sizes=_CONV2D_TWICE)
chain("conv2d_conv2d_padding", ["conv:{I}:3:1"], padding=1, sizes=_CONV2D_TWICE)
chain("conv2d_instance_norm_divide", ["instance_norm", "divide:2.0"])
chain("conv2d_relu_bias_add", ["relu", "bias_add"])
chain("conv2d_add_scale_sigmoid_group_norm", ["bias_add", "scale:2.0", "sigmoid", "group_norm:4"])
chain("conv2d_min_tanh_tanh", ["min", "tanh", "tanh"])
chain("conv2d_min_add_multiply", ["min_value:0.5", "bias_add", "multiply:2.0"])
chain("conv2d_scaling_min", ["scale:2.0", "min"])
chain("conv2d_subtract_hardswish_max_pool_mish", ["subtract:0.5", "hardswish", "max_pool:2", "mish"])
chain("conv2d_subtract_tanh_subtract_avg_pool", ["subtract:0.5", "tanh", "subtract:0.2", "avg_pool:2"])
chain("conv2d_mish_mish", ["mish", "mish"])
chain("conv2d_multiply_leaky_relu_gelu", ["multiply_param", "leaky_relu:0.01", "gelu"])
chain("conv2d_relu_hardswish", ["relu", "hardswish"])
chain("conv2d_avg_pool_sigmoid_sum", ["avg_pool:2", "sigmoid", "sum"])
chain("conv2d_gelu_global_avg_pool", ["gelu", "global_avg_pool"])
chain("conv2d_hardswish_relu", ["hardswish", "relu"])
chain("conv2d_divide_leaky_relu", ["divide:2.0", "leaky_relu:0.01"])
chain("conv2d_batch_norm_scaling", ["batch_norm", "scale:2.0"])
chain("conv2d_mish_batch_norm", ["mish", "batch_norm"])
chain("conv2d_tanh_scaling_bias_add_max", ["tanh", "scale:2.0", "bias_add", "max_pool:2"])
chain("conv2d_group_norm_scale_max_pool_clamp", ["group_norm:4", "scale:2.0", "max_pool:2", "clamp:0:1"])
chain("conv2d_subtract_subtract_mish", ["subtract:0.5", "subtract:0.2", "mish"])
chain("conv2d_group_norm_tanh_hardswish_residual_add_logsumexp",
      ["group_norm:4", "tanh", "hardswish", "residual_add", "logsumexp"])
chain("conv2d_bias_add_softmax", ["bias_add", "softmax"])
chain("conv1d_conv1d", ["conv:16:3:0"])
chain("conv1d_conv1d_padding", ["conv:16:3:1"], padding=1)
chain("conv1d_relu_max_pool_sum", ["relu", "max_pool:2", "sum"])
chain("conv3d_conv3d", ["conv:4:3:0"])
chain("conv3d_conv3d_padding", ["conv:4:3:1"], padding=1,
      sizes=(dict(N=1, I=2, O=4, D=4, H=4, W=4), dict(N=1, I=3, O=16, D=12, H=24, W=24),
             dict(N=128, I=3, O=16, D=16, H=32, W=32)))
chain("conv3d_group_norm_mean", ["group_norm:4", "mean"])
chain("conv3d_min_softmax", ["min_value:0.2", "softmax"])
chain("conv3d_hardswish_relu_softmax_mean", ["hardswish", "relu", "softmax", "mean"])
chain("conv3d_max_logsumexp_relu", ["max_pool:2", "logsumexp", "relu"])
chain("conv3d_mish_tanh", ["mish", "tanh"])
chain("conv3d_scaling_tanh_multiply_sigmoid", ["scale:2.0", "tanh", "multiply_param", "sigmoid"])
chain("conv3d_softmax_max_pool_max_pool", ["softmax", "max_pool:2", "max_pool:2"],
      sizes=(dict(N=1, I=2, O=4, D=8, H=8, W=8), dict(N=2, I=3, O=16, D=12, H=24, W=24),
             dict(N=128, I=3, O=16, D=16, H=32, W=32)))
chain("conv3d_multiply_instance_norm_clamp_multiply_max",
      ["multiply_param", "instance_norm", "clamp:-1:1", "multiply_param", "max"])
chain("conv3d_relu_leaky_relu_gelu_sigmoid_bias_add", ["relu", "leaky_relu:0.01", "gelu", "sigmoid", "bias_add"])
chain("conv3d_group_norm_min_clamp", ["group_norm:2", "min", "clamp:0:1"])
chain("conv3d_divide_max_global_avg_pool_bias_add_sum",
      ["divide:2.0", "max_pool:2", "global_avg_pool", "bias_add", "sum"])
chain("conv3d_leaky_relu_sum_clamp_gelu", ["leaky_relu:0.2", "sum", "clamp:-1:1", "gelu"])
chain("conv_transpose2d_bias_add_tanh", ["bias_add", "tanh"])

# ---- elementwise chains -------------------------------------------------------------------------------------
_ELEM = SIZES["none"]


class Unary(nn.Module):
    """A chain of unary torch functions (exp, log, sqrt, abs), optionally adding the input back."""

    def __init__(self, ops: Sequence[str], add_input: bool = False) -> None:
        super().__init__()
        self.ops, self.add_input = list(ops), add_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for op in self.ops:
            y = getattr(torch, op)(y)
        return y + x if self.add_input else y


register(LEVEL, "add_add", "elementwise_chain",
         lambda p: Case(AddAdd(), [uniform(p.N, p.F), uniform(p.N, p.F), uniform(p.N, p.F)]), *_ELEM, "x + y + z")
register(LEVEL, "exp_exp", "elementwise_chain", lambda p: Case(Unary(["exp", "exp"]), [uniform(p.N, p.F)]),
         *_ELEM, "exp(exp(x))")
register(LEVEL, "log_log", "elementwise_chain",
         lambda p: Case(Unary(["log", "log"]), [positive(p.N, p.F, low=1.5, high=10.0)]), *_ELEM, "log(log(x))")
register(LEVEL, "log_log_add", "elementwise_chain",
         lambda p: Case(Unary(["log", "log"], add_input=True), [positive(p.N, p.F, low=1.5, high=10.0)]), *_ELEM,
         "log(log(x)) + x")
register(LEVEL, "sqrt_sqrt", "elementwise_chain", lambda p: Case(Unary(["sqrt", "sqrt"]), [positive(p.N, p.F)]),
         *_ELEM, "sqrt(sqrt(x))")
register(LEVEL, "abs_abs", "elementwise_chain", lambda p: Case(Unary(["abs", "abs"]), [uniform(p.N, p.F)]),
         *_ELEM, "abs(abs(x))")

# ---- attention ---------------------------------------------------------------------------------------------
_ATT = (dict(B=1, T=8, D=16, H=4), dict(B=1, T=128, D=128, H=8), dict(B=8, T=512, D=768, H=12))
_KV = {"mha": lambda h: h, "mqa": lambda h: 1, "gqa": lambda h: h // 2 if h % 2 == 0 else h}


def attention(name: str, kind: str, tail: Sequence[str] = (), sdpa: bool = True, fused_qkv: bool = False,
              doc: str = "") -> None:
    def make(p):
        tail_ = [f"gemm:{2 * p.D}" if t == "gemm" else t for t in tail]
        module = CausalSelfAttention(p.D, p.H, _KV[kind](p.H), p.T, sdpa=sdpa, fused_qkv=fused_qkv, tail=tail_)
        return Case(module, [uniform(p.B, p.T, p.D)])

    register(LEVEL, name, "attention", make, *_ATT,
             doc or f"causal {kind.upper()} self-attention" + (" -> " + " -> ".join(tail) if tail else ""))


attention("mingpt_causal_attention", "mha", sdpa=False, fused_qkv=True,
          doc="minGPT's causal self-attention: fused QKV Linear, tril mask buffer, softmax, all as ops")
for _kind in ("mha", "mqa", "gqa"):
    attention(_kind, _kind)
    attention(f"{_kind}_ops", _kind, sdpa=False, doc=f"causal {_kind.upper()} written as ops with a mask buffer")
    for _red in ("sum", "max", "mean"):
        attention(f"{_kind}_{_red}", _kind, [_red])
    attention(f"{_kind}_gemm", _kind, ["gemm"])
    for _act, _alias in (("relu", "relu"), ("gelu", "gelu"), ("tanh", "tanh")):
        attention(f"{_kind}_gemm_{_alias}", _kind, ["gemm", _act])
for _kind, _act, _red in (("mha", "relu", "sum"), ("mqa", "relu", "max"), ("gqa", "relu", "mean"),
                          ("mha", "tanh", "max"), ("mqa", "tanh", "mean"), ("gqa", "tanh", "sum"),
                          ("mha", "gelu", "mean"), ("mqa", "gelu", "sum"), ("gqa", "gelu", "max")):
    attention(f"{_kind}_gemm_{_act}_{_red}", _kind, ["gemm", _act, _red])
