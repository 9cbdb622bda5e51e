"""Level 1: single operators, one module class per family (the families of KernelBench's level 1).

Every class is parameterised by what distinguishes the variants (transposes, kernel shapes, the
activation's name...); the `register` calls at the bottom name the variants and give their sizes.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .registry import Case, indices, mask, positive, register, uniform

LEVEL = "level1"


# --------------------------------------------------------------------------------------------------
# Module families
# --------------------------------------------------------------------------------------------------
class MatMul(nn.Module):
    """A matrix product of two inputs: `torch.matmul` (2-D, batched, tensor x matrix), `torch.bmm`, or an
    einsum equation; optionally on transposed operands and with the result's triangle kept."""

    def __init__(self, op: str = "matmul", transpose_a: bool = False, transpose_b: bool = False,
                 equation: str = "", triangle: str = "") -> None:
        super().__init__()
        self.op, self.transpose_a, self.transpose_b = op, transpose_a, transpose_b
        self.equation, self.triangle = equation, triangle

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.transpose_a:
            a = a.transpose(-2, -1)
        if self.transpose_b:
            b = b.transpose(-2, -1)
        if self.op == "bmm":
            out = torch.bmm(a, b)
        elif self.op == "einsum":
            out = torch.einsum(self.equation, a, b)
        else:
            out = torch.matmul(a, b)
        if self.triangle == "upper":
            out = torch.triu(out)
        elif self.triangle == "lower":
            out = torch.tril(out)
        return out


class DiagMatMul(nn.Module):
    """diag(a) @ b: a vector scales the rows of a matrix (written with an explicit diagonal matrix)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.diag(a) @ b


class ScalarMul(nn.Module):
    """A matrix times a Python scalar."""

    def __init__(self, scalar: float) -> None:
        super().__init__()
        self.scalar = scalar

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a * self.scalar


def _new_gelu(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation of GELU as minGPT writes it, op by op."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


_ACTIVATIONS = {
    "relu": torch.relu,
    "leaky_relu": lambda x: F.leaky_relu(x, negative_slope=0.05),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "selu": F.selu,
    "elu": lambda x: F.elu(x, alpha=0.8),
    "hardsigmoid": F.hardsigmoid,
    "hardtanh": lambda x: F.hardtanh(x, min_val=-0.5, max_val=0.5),
    "softplus": F.softplus,
    "softsign": F.softsign,
    "swish": lambda x: x * torch.sigmoid(x),
    "silu": F.silu,
    "mish": F.mish,
    "relu6": F.relu6,
    "hardswish": F.hardswish,
    "new_gelu": _new_gelu,
}


class Activation(nn.Module):
    """One pointwise activation, by name (see `_ACTIVATIONS`)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ACTIVATIONS[self.name](x)


class Softmax(nn.Module):
    def __init__(self, dim: int = -1, log: bool = False) -> None:
        super().__init__()
        self.dim, self.log = dim, log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=self.dim) if self.log else torch.softmax(x, dim=self.dim)


def _randomise_running_stats(bn: nn.modules.batchnorm._NormBase) -> None:
    """Eval-mode batch norm reads its running statistics: make them non-trivial (and deterministic
    under the suite's seed)."""
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        if bn.affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)


class Normalization(nn.Module):
    """A normalisation over a (N, C, ...) input: batch (eval mode), instance, group, layer norm as
    nn modules; RMS norm written as ops; Frobenius, L1 and L2 normalisation by a norm of the input."""

    def __init__(self, kind: str, channels: int = 0, groups: int = 1, normalized_shape: tuple[int, ...] = (),
                 spatial: int = 2, eps: float = 1e-5) -> None:
        super().__init__()
        self.kind, self.eps = kind, eps
        if kind == "batch":
            self.norm = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)[spatial - 1](channels)
            _randomise_running_stats(self.norm)
        elif kind == "instance":
            self.norm = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)[spatial - 1](channels)
        elif kind == "group":
            self.norm = nn.GroupNorm(groups, channels)
        elif kind == "layer":
            self.norm = nn.LayerNorm(normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind in ("batch", "instance", "group", "layer"):
            return self.norm(x)
        if self.kind == "rms":
            return x / torch.sqrt(torch.mean(x * x, dim=1, keepdim=True) + self.eps)
        if self.kind == "frobenius":
            return x / torch.norm(x, p="fro")
        if self.kind == "l1":
            return x / torch.sum(torch.abs(x), dim=1, keepdim=True)
        if self.kind == "l2":
            return x / torch.norm(x, p=2, dim=1, keepdim=True)
        raise ValueError(self.kind)


class Pool(nn.Module):
    """Max or average pooling in 1, 2 or 3 spatial dims."""

    def __init__(self, kind: str, dims: int, kernel: int, stride: int | None = None, padding: int = 0,
                 dilation: int = 1) -> None:
        super().__init__()
        if kind == "max":
            cls = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)[dims - 1]
            self.pool = cls(kernel, stride=stride, padding=padding, dilation=dilation)
        else:
            cls = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)[dims - 1]
            self.pool = cls(kernel, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


class Reduce(nn.Module):
    """A reduction over one dim: sum, mean, max, min, prod (values), argmax, argmin (int64 indices)."""

    def __init__(self, op: str, dim: int) -> None:
        super().__init__()
        self.op, self.dim = op, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.op == "sum":
            return torch.sum(x, dim=self.dim, keepdim=True)
        if self.op == "mean":
            return torch.mean(x, dim=self.dim)
        if self.op == "max":
            return torch.max(x, dim=self.dim)[0]
        if self.op == "min":
            return torch.min(x, dim=self.dim)[0]
        if self.op == "prod":
            return torch.prod(x, dim=self.dim)
        if self.op == "argmax":
            return torch.argmax(x, dim=self.dim)
        if self.op == "argmin":
            return torch.argmin(x, dim=self.dim)
        raise ValueError(self.op)


class Conv(nn.Module):
    """A convolution in 1, 2 or 3 dims (or a transposed one) with every nn.ConvNd knob."""

    def __init__(self, dims: int, c_in: int, c_out: int, kernel, stride=1, padding=0, dilation=1, groups: int = 1,
                 bias: bool = False, transposed: bool = False, output_padding=0) -> None:
        super().__init__()
        if transposed:
            cls = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[dims - 1]
            self.conv = cls(c_in, c_out, kernel, stride=stride, padding=padding, output_padding=output_padding,
                            groups=groups, bias=bias, dilation=dilation)
        else:
            cls = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1]
            self.conv = cls(c_in, c_out, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups,
                            bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class DepthwiseSeparableConv(nn.Module):
    """A depthwise k x k convolution followed by a pointwise 1 x 1 one."""

    def __init__(self, c_in: int, c_out: int, kernel: int, padding: int = 0, bias: bool = False) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(c_in, c_in, kernel, padding=padding, groups=c_in, bias=bias)
        self.pointwise = nn.Conv2d(c_in, c_out, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


class Scan(nn.Module):
    """Prefix scans along a dim: cumsum, cumprod, reverse cumsum, exclusive cumsum, masked cumsum."""

    def __init__(self, kind: str, dim: int = 1) -> None:
        super().__init__()
        self.kind, self.dim = kind, dim

    def forward(self, x: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
        d = self.dim
        if self.kind == "cumsum":
            return torch.cumsum(x, dim=d)
        if self.kind == "cumprod":
            return torch.cumprod(x, dim=d)
        if self.kind == "reverse":
            return torch.cumsum(x.flip(d), dim=d).flip(d)
        if self.kind == "exclusive":
            return torch.cumsum(x, dim=d) - x
        if self.kind == "masked":
            return torch.cumsum(x * m, dim=d)
        raise ValueError(self.kind)


class Loss(nn.Module):
    """A loss between predictions and targets, reduced to a scalar."""

    def __init__(self, kind: str, margin: float = 1.0) -> None:
        super().__init__()
        self.kind, self.margin = kind, margin

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        if self.kind == "mse":
            return F.mse_loss(xs[0], xs[1])
        if self.kind == "cross_entropy":
            return F.cross_entropy(xs[0], xs[1])
        if self.kind == "huber":
            return F.smooth_l1_loss(xs[0], xs[1])
        if self.kind == "cosine":
            return torch.mean(1.0 - F.cosine_similarity(xs[0], xs[1], dim=1))
        if self.kind == "kl_div":
            p = xs[0] / torch.sum(xs[0], dim=1, keepdim=True)
            q = xs[1] / torch.sum(xs[1], dim=1, keepdim=True)
            return F.kl_div(torch.log(p), q, reduction="batchmean")
        if self.kind == "triplet":
            return F.triplet_margin_loss(xs[0], xs[1], xs[2], margin=self.margin)
        if self.kind == "hinge":
            return torch.mean(torch.clamp(1.0 - xs[0] * xs[1], min=0.0))
        raise ValueError(self.kind)


# --------------------------------------------------------------------------------------------------
# The workloads
# --------------------------------------------------------------------------------------------------
def _reg(name: str, family: str, make, tiny, small, default, doc: str = "") -> None:
    register(LEVEL, name, family, make, tiny, small, default, doc)


# ---- matrix products ----------------------------------------------------------------------------
def _mm(op="matmul", ta=False, tb=False, tri=""):
    def make(p):
        a = (p.K, p.M) if ta else (p.M, p.K)
        b = (p.N, p.K) if tb else (p.K, p.N)
        return Case(MatMul(op, ta, tb, triangle=tri), [uniform(*a), uniform(*b)])
    return make


_reg("matmul_square", "matmul", _mm(), dict(M=32, K=32, N=32), dict(M=256, K=256, N=256),
     dict(M=2048, K=2048, N=2048), "C = A @ B, square")
_reg("matmul_rectangular", "matmul", _mm(), dict(M=24, K=40, N=32), dict(M=256, K=384, N=192),
     dict(M=1024, K=4096, N=2048), "C = A @ B, rectangular")
_reg("matmul_transposed_a", "matmul", _mm(ta=True), dict(M=32, K=24, N=40), dict(M=256, K=192, N=320),
     dict(M=1024, K=4096, N=2048), "C = A.T @ B")
_reg("matmul_transposed_b", "matmul", _mm(tb=True), dict(M=40, K=24, N=32), dict(M=320, K=192, N=256),
     dict(M=1024, K=4096, N=2048), "C = A @ B.T")
_reg("matmul_transposed_both", "matmul", _mm(ta=True, tb=True), dict(M=32, K=32, N=24),
     dict(M=256, K=256, N=192), dict(M=1024, K=4096, N=2048), "C = A.T @ B.T")
_reg("matmul_upper_triangular", "matmul", _mm(tri="upper"), dict(M=32, K=32, N=32),
     dict(M=256, K=256, N=256), dict(M=2048, K=2048, N=2048), "C = triu(A @ B)")
_reg("matmul_lower_triangular", "matmul", _mm(tri="lower"), dict(M=32, K=32, N=32),
     dict(M=256, K=256, N=256), dict(M=2048, K=2048, N=2048), "C = tril(A @ B)")
_reg("matmul_large_k", "matmul", _mm(), dict(M=8, K=1024, N=8), dict(M=64, K=4096, N=64),
     dict(M=256, K=65536, N=256), "C = A @ B with a long contraction")
_reg("matmul_small_k", "matmul", _mm(), dict(M=64, K=8, N=64), dict(M=1024, K=16, N=1024),
     dict(M=8192, K=32, N=8192), "C = A @ B with a short contraction (memory bound)")
_reg("matmul_irregular", "matmul", _mm(), dict(M=29, K=37, N=41), dict(M=233, K=197, N=311),
     dict(M=8205, K=2949, N=5921), "C = A @ B with odd, prime-ish sizes")
_reg("matmul_tall_skinny", "matmul", _mm(), dict(M=256, K=8, N=32), dict(M=4096, K=32, N=128),
     dict(M=16384, K=16, N=1024), "C = A @ B with A tall and thin")
_reg("matvec", "matmul", _mm(), dict(M=256, K=256, N=1), dict(M=2048, K=2048, N=1),
     dict(M=256, K=65536, N=1), "C = A @ b, b a column vector")


def _bmm(op):
    return lambda p: Case(MatMul(op), [uniform(p.B, p.M, p.K), uniform(p.B, p.K, p.N)])


_reg("matmul_batched", "matmul", _bmm("bmm"), dict(B=4, M=16, K=24, N=16), dict(B=16, M=96, K=128, N=80),
     dict(B=128, M=128, K=256, N=512), "torch.bmm")
_reg("matmul_batched_broadcast", "matmul", _bmm("matmul"), dict(B=2, M=24, K=16, N=32),
     dict(B=8, M=128, K=96, N=128), dict(B=64, M=256, K=256, N=256), "torch.matmul of two 3-D tensors")
_reg("matmul_3d_tensor_matrix", "matmul",
     lambda p: Case(MatMul(), [uniform(p.B, p.M, p.K), uniform(p.K, p.N)]),
     dict(B=4, M=16, K=16, N=24), dict(B=8, M=128, K=128, N=96), dict(B=16, M=1024, K=1024, N=768),
     "(B, M, K) @ (K, N)")
_reg("matmul_4d_tensor_matrix", "matmul",
     lambda p: Case(MatMul("einsum", equation="bijl,lk->bijk"), [uniform(p.B, p.I, p.J, p.L), uniform(p.L, p.K)]),
     dict(B=2, I=4, J=8, L=16, K=24), dict(B=4, I=16, J=32, L=64, K=96), dict(B=4, I=128, J=128, L=256, K=512),
     "einsum('bijl,lk->bijk')")


def _diag(p):
    return Case(DiagMatMul(), [uniform(p.N), uniform(p.N, p.M)])


_reg("matmul_diagonal", "matmul", _diag, dict(N=32, M=48), dict(N=128, M=256), dict(N=4096, M=4096),
     "diag(a) @ B")


def _symmetric(p):
    case = _mm()(p)
    for arg in case.args:  # symmetric example inputs; fresh draws are general matrices
        arg.tensor.copy_((arg.tensor + arg.tensor.T) / 2)
    return case


_reg("matmul_symmetric", "matmul", _symmetric, dict(M=32, K=32, N=32), dict(M=192, K=192, N=192),
     dict(M=2048, K=2048, N=2048), "C = A @ B, written for symmetric A and B")
_reg("matrix_scalar", "elementwise", lambda p: Case(ScalarMul(3.5), [uniform(p.M, p.N)]),
     dict(M=128, N=256), dict(M=1024, N=2048), dict(M=4096, N=4096), "C = A * s")

# ---- activations ----------------------------------------------------------------------------------
_ACT_SIZES = (dict(B=8, D=1024), dict(B=128, D=16384), dict(B=512, D=16384))
for _name in _ACTIVATIONS:
    _reg(_name, "activation", (lambda n: lambda p: Case(Activation(n), [uniform(p.B, p.D, low=-4, high=4)]))(_name),
         *_ACT_SIZES, f"{_name}(x)")

# ---- softmax --------------------------------------------------------------------------------------
_reg("softmax", "softmax", lambda p: Case(Softmax(), [uniform(p.B, p.D, low=-4, high=4)]),
     dict(B=16, D=1024), dict(B=64, D=8192), dict(B=128, D=65536), "softmax over the last dim")
_reg("log_softmax", "softmax", lambda p: Case(Softmax(log=True), [uniform(p.B, p.D, low=-4, high=4)]),
     dict(B=16, D=1024), dict(B=64, D=8192), dict(B=128, D=65536), "log_softmax over the last dim")
_reg("softmax_dim1_3d", "softmax", lambda p: Case(Softmax(dim=1), [uniform(p.B, p.D, p.L, low=-4, high=4)]),
     dict(B=4, D=64, L=32), dict(B=16, D=256, L=256), dict(B=16, D=1024, L=1024), "softmax over a middle dim")

# ---- normalisations ----------------------------------------------------------------------------------
_NCHW = (dict(N=2, C=8, H=16, W=16), dict(N=8, C=32, H=64, W=64), dict(N=16, C=64, H=128, W=128))


def _norm(kind, **kw):
    def make(p):
        extra = dict(kw)
        if kind in ("batch", "instance", "group"):
            extra["channels"] = p.C
        if kind == "layer":
            extra["normalized_shape"] = (p.H, p.W)
        pos = kind == "l1"
        return Case(Normalization(kind, **extra), [uniform(p.N, p.C, p.H, p.W, low=0.1 if pos else -2, high=2)])
    return make


_reg("batch_norm", "normalization", _norm("batch"), *_NCHW, "BatchNorm2d (eval mode, running statistics)")
_reg("instance_norm", "normalization", _norm("instance"), *_NCHW, "InstanceNorm2d")
_reg("group_norm", "normalization", _norm("group", groups=4), *_NCHW, "GroupNorm with 4 groups")
_reg("layer_norm", "normalization", _norm("layer"), *_NCHW, "LayerNorm over (H, W)")
_reg("rms_norm", "normalization", _norm("rms"), *_NCHW, "x / sqrt(mean(x^2 over channels) + eps), as ops")
_reg("frobenius_norm", "normalization", _norm("frobenius"), *_NCHW, "x / ||x||_F")
_reg("l1_norm", "normalization", _norm("l1"), dict(N=16, C=1024, H=1, W=1), dict(N=64, C=16384, H=1, W=1),
     dict(N=128, C=65536, H=1, W=1), "x / sum(|x|) over dim 1")
_reg("l2_norm", "normalization", _norm("l2"), dict(N=16, C=1024, H=1, W=1), dict(N=64, C=16384, H=1, W=1),
     dict(N=128, C=65536, H=1, W=1), "x / ||x||_2 over dim 1")

# ---- pooling ------------------------------------------------------------------------------------------
_reg("max_pool_1d", "pooling", lambda p: Case(Pool("max", 1, 4, stride=2, padding=1, dilation=2),
                                                [uniform(p.N, p.C, p.L)]),
     dict(N=4, C=16, L=128), dict(N=16, C=64, L=1024), dict(N=16, C=64, L=16384),
     "MaxPool1d(4, stride 2, padding 1, dilation 2)")
_reg("max_pool_2d", "pooling", lambda p: Case(Pool("max", 2, 3, stride=2, padding=1),
                                                [uniform(p.N, p.C, p.H, p.W)]),
     dict(N=2, C=8, H=32, W=32), dict(N=16, C=32, H=128, W=128), dict(N=16, C=32, H=128, W=128),
     "MaxPool2d(3, stride 2, padding 1)")
_reg("max_pool_3d", "pooling", lambda p: Case(Pool("max", 3, 3, stride=2, padding=1, dilation=1),
                                                [uniform(p.N, p.C, p.D, p.H, p.W)]),
     dict(N=1, C=4, D=16, H=16, W=16), dict(N=8, C=16, D=32, H=32, W=32), dict(N=8, C=16, D=48, H=48, W=48),
     "MaxPool3d(3, stride 2, padding 1)")
_reg("avg_pool_1d", "pooling", lambda p: Case(Pool("avg", 1, 8, stride=1, padding=4), [uniform(p.N, p.C, p.L)]),
     dict(N=4, C=16, L=128), dict(N=16, C=64, L=1024), dict(N=16, C=64, L=16384),
     "AvgPool1d(8, stride 1, padding 4)")
_reg("avg_pool_2d", "pooling", lambda p: Case(Pool("avg", 2, 3), [uniform(p.N, p.C, p.H, p.W)]),
     dict(N=2, C=8, H=32, W=32), dict(N=16, C=32, H=128, W=128), dict(N=16, C=64, H=128, W=128),
     "AvgPool2d(3)")
_reg("avg_pool_3d", "pooling", lambda p: Case(Pool("avg", 3, 3, stride=2, padding=1),
                                                [uniform(p.N, p.C, p.D, p.H, p.W)]),
     dict(N=1, C=4, D=16, H=16, W=16), dict(N=8, C=16, D=32, H=32, W=32), dict(N=8, C=16, D=48, H=48, W=48),
     "AvgPool3d(3, stride 2, padding 1)")

# ---- reductions ------------------------------------------------------------------------------------------
_RED = (dict(B=8, D1=64, D2=64), dict(B=32, D1=256, D2=256), dict(B=16, D1=1024, D2=1024))
for _op in ("sum", "mean", "max", "min", "argmax", "argmin"):
    _reg(f"{_op}_over_dim", "reduction", (lambda o: lambda p: Case(Reduce(o, 1), [uniform(p.B, p.D1, p.D2)]))(_op),
         *_RED, f"torch.{_op}(x, dim=1)")
_reg("prod_over_dim", "reduction", lambda p: Case(Reduce("prod", 1), [uniform(p.B, p.D1, p.D2, low=0.9, high=1.1)]),
     *_RED, "torch.prod(x, dim=1) (factors near 1)")
_reg("sum_over_last_dim", "reduction", lambda p: Case(Reduce("sum", -1), [uniform(p.B, p.D1, p.D2)]),
     *_RED, "torch.sum(x, dim=-1)")

# ---- convolutions -------------------------------------------------------------------------------------
def _conv(dims, kernel, **kw):
    def make(p):
        spatial = (p.L,) if dims == 1 else (p.H, p.W) if dims == 2 else (p.D, p.H, p.W)
        return Case(Conv(dims, p.Ci, p.Co, kernel, **kw), [uniform(p.N, p.Ci, *spatial)])
    return make


_C1 = (dict(N=2, Ci=4, Co=8, L=64), dict(N=8, Ci=32, Co=64, L=256), dict(N=16, Ci=64, Co=128, L=8192))
_C2_SQ = (dict(N=1, Ci=3, Co=8, H=16, W=16), dict(N=2, Ci=8, Co=16, H=64, W=64),
          dict(N=16, Ci=16, Co=64, H=128, W=128))
_C2_ASYM = (dict(N=1, Ci=3, Co=8, H=12, W=24), dict(N=2, Ci=8, Co=16, H=48, W=96),
            dict(N=16, Ci=16, Co=64, H=128, W=256))
_C3_SQ = (dict(N=1, Ci=2, Co=4, D=8, H=8, W=8), dict(N=1, Ci=4, Co=8, D=20, H=20, W=20),
          dict(N=8, Ci=8, Co=32, D=32, H=32, W=32))
_C3_ASYM = (dict(N=1, Ci=2, Co=4, D=6, H=8, W=12), dict(N=1, Ci=4, Co=8, D=16, H=24, W=32),
            dict(N=8, Ci=8, Co=32, D=16, H=32, W=64))

_reg("conv1d", "conv", _conv(1, 3), *_C1, "Conv1d, kernel 3")
_reg("conv1d_dilated_strided", "conv", _conv(1, 3, stride=3, dilation=4), *_C1, "Conv1d, kernel 3, stride 3, dilation 4")
_reg("conv1d_padded_bias", "conv", _conv(1, 5, padding=2, bias=True), *_C1, "Conv1d, kernel 5, padding 2, bias")
_reg("conv2d_square_input_square_kernel", "conv", _conv(2, 3), *_C2_SQ, "Conv2d 3x3")
_reg("conv2d_square_input_asymmetric_kernel", "conv", _conv(2, (3, 5)), *_C2_SQ, "Conv2d 3x5")
_reg("conv2d_asymmetric_input_square_kernel", "conv", _conv(2, 3), *_C2_ASYM, "Conv2d 3x3 on H != W")
_reg("conv2d_asymmetric_input_asymmetric_kernel", "conv", _conv(2, (5, 3)), *_C2_ASYM, "Conv2d 5x3 on H != W")
_reg("conv2d_dilated_padded", "conv", _conv(2, (3, 5), padding=(1, 2), dilation=(2, 1)), *_C2_SQ,
     "Conv2d 3x5, padding (1, 2), dilation (2, 1)")
_reg("conv2d_strided_bias", "conv", _conv(2, 3, stride=2, padding=1, bias=True), *_C2_SQ,
     "Conv2d 3x3, stride 2, padding 1, bias")
_reg("conv3d_square_input_square_kernel", "conv", _conv(3, 3), *_C3_SQ, "Conv3d 3x3x3")
_reg("conv3d_square_input_asymmetric_kernel", "conv", _conv(3, (3, 5, 1)), *_C3_SQ, "Conv3d 3x5x1")
_reg("conv3d_asymmetric_input_square_kernel", "conv", _conv(3, 3), *_C3_ASYM, "Conv3d 3x3x3, D != H != W")
_reg("conv3d_asymmetric_input_asymmetric_kernel", "conv", _conv(3, (1, 3, 5)), *_C3_ASYM,
     "Conv3d 1x3x5, D != H != W")
_reg("conv3d_strided_padded", "conv", _conv(3, 3, stride=2, padding=1), _C3_SQ[0],
     dict(N=2, Ci=4, Co=8, D=20, H=20, W=20), _C3_SQ[2], "Conv3d 3x3x3, stride 2, padding 1")


def _dw(kernel, **kw):
    def make(p):
        return Case(Conv(2, p.C, p.C, kernel, groups=p.C, **kw), [uniform(p.N, p.C, p.H, p.W)])
    return make


_DW_SQ = (dict(N=2, C=8, H=16, W=16), dict(N=8, C=32, H=64, W=64), dict(N=16, C=64, H=128, W=128))
_DW_ASYM = (dict(N=2, C=8, H=12, W=24), dict(N=8, C=32, H=48, W=96), dict(N=16, C=64, H=64, W=256))
_reg("conv_depthwise_2d_square_input_square_kernel", "conv", _dw(3), *_DW_SQ, "depthwise Conv2d 3x3")
_reg("conv_depthwise_2d_square_input_asymmetric_kernel", "conv", _dw((3, 1)), *_DW_SQ, "depthwise Conv2d 3x1")
_reg("conv_depthwise_2d_asymmetric_input_square_kernel", "conv", _dw(3, padding=1), *_DW_ASYM,
     "depthwise Conv2d 3x3, padding 1, H != W")
_reg("conv_depthwise_2d_asymmetric_input_asymmetric_kernel", "conv", _dw((3, 5), stride=(1, 2)), *_DW_ASYM,
     "depthwise Conv2d 3x5, stride (1, 2), H != W")
_reg("conv_depthwise_separable_2d", "conv",
     lambda p: Case(DepthwiseSeparableConv(p.Ci, p.Co, 3, padding=1), [uniform(p.N, p.Ci, p.H, p.W)]),
     *_C2_SQ, "depthwise 3x3 then pointwise 1x1")
_reg("conv_pointwise_2d", "conv", _conv(2, 1), *_C2_SQ, "Conv2d 1x1")
_reg("conv_transposed_2d", "conv", _conv(2, 3, transposed=True), dict(N=1, Ci=8, Co=4, H=8, W=8),
     dict(N=4, Ci=32, Co=16, H=32, W=32), dict(N=16, Ci=64, Co=32, H=64, W=64), "ConvTranspose2d 3x3")
_reg("conv_transposed_2d_strided_padded", "conv", _conv(2, (3, 4), stride=2, padding=1, transposed=True),
     dict(N=1, Ci=8, Co=4, H=6, W=6), dict(N=2, Ci=16, Co=16, H=24, W=24), dict(N=16, Ci=64, Co=32, H=64, W=64),
     "ConvTranspose2d 3x4, stride 2, padding 1")

# ---- scans ------------------------------------------------------------------------------------------------
_SCAN = (dict(B=16, L=512), dict(B=512, L=4000), dict(B=128, L=32768))
_reg("cumsum", "scan", lambda p: Case(Scan("cumsum"), [uniform(p.B, p.L)]), *_SCAN, "torch.cumsum(x, dim=1)")
_reg("cumprod", "scan", lambda p: Case(Scan("cumprod"), [uniform(p.B, p.L, low=0.99, high=1.01)]), *_SCAN,
     "torch.cumprod(x, dim=1) (factors near 1)")
_reg("cumsum_reverse", "scan", lambda p: Case(Scan("reverse"), [uniform(p.B, p.L)]), *_SCAN,
     "cumsum from the end: flip, cumsum, flip")
_reg("cumsum_exclusive", "scan", lambda p: Case(Scan("exclusive"), [uniform(p.B, p.L)]), *_SCAN,
     "exclusive prefix sum: cumsum(x) - x")
_reg("cumsum_masked", "scan", lambda p: Case(Scan("masked"), [uniform(p.B, p.L), mask(p.B, p.L)]), *_SCAN,
     "cumsum of x where a bool mask holds")

# ---- losses -------------------------------------------------------------------------------------------------
_LOSS = (dict(B=32, D=256), dict(B=128, D=8192), dict(B=128, D=32768))
_reg("mse_loss", "loss", lambda p: Case(Loss("mse"), [uniform(p.B, p.D), uniform(p.B, p.D)]), *_LOSS, "F.mse_loss")
_reg("huber_loss", "loss", lambda p: Case(Loss("huber"), [uniform(p.B, p.D, low=-2, high=2), uniform(p.B, p.D)]),
     *_LOSS, "F.smooth_l1_loss")
_reg("cosine_similarity_loss", "loss", lambda p: Case(Loss("cosine"), [uniform(p.B, p.D), uniform(p.B, p.D)]),
     *_LOSS, "mean(1 - cosine_similarity(x, y, dim=1))")
_reg("kl_div_loss", "loss", lambda p: Case(Loss("kl_div"), [positive(p.B, p.D), positive(p.B, p.D)]),
     *_LOSS, "kl_div(log p, q, batchmean) of two row-normalised positive inputs")
_reg("triplet_margin_loss", "loss",
     lambda p: Case(Loss("triplet"), [uniform(p.B, p.D), uniform(p.B, p.D), uniform(p.B, p.D)]), *_LOSS,
     "F.triplet_margin_loss(anchor, positive, negative, margin 1)")
_reg("hinge_loss", "loss", lambda p: Case(Loss("hinge"), [uniform(p.B, p.D), uniform(p.B, p.D)]), *_LOSS,
     "mean(clamp(1 - y * t, min=0))")
_reg("cross_entropy_loss", "loss",
     lambda p: Case(Loss("cross_entropy"), [uniform(p.B, p.D, low=-4, high=4), indices(p.B, high=p.D)]),
     dict(B=64, D=100), dict(B=1024, D=2000), dict(B=4096, D=1000), "F.cross_entropy over int64 class labels")
