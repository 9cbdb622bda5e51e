"""Frontend reductions, the softmax family, scans and losses: PyTorch modules -> LEIR, verified against
PyTorch on fresh inputs. Arguments are the awkward ones (negative dims, keepdim, two of four dims, size-1
dims, odd sizes, 0-d results, argmax ties, every loss reduction) and every program stays small."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from steptp_env import verify
from steptp_env.ir.analysis import loop_iterations
from steptp_env.frontend import HANDLERS, InputRange, UnsupportedOpError, from_torch

MAX_ITERATIONS = 200_000
INF = float("inf")


class Fn(nn.Module):
    """A module calling one function."""

    def __init__(self, fn, **buffers):
        super().__init__()
        self.fn = fn
        for name, value in buffers.items():
            self.register_buffer(name, value)

    def forward(self, *args):
        return self.fn(self, *args)


def check(fn, *inputs, ranges=None, **buffers):
    """Convert `fn(*inputs)` (fn gets the module first when buffers are given) and verify it."""
    module = Fn(fn if buffers else (lambda _, *a: fn(*a)), **buffers)
    wl = from_torch(module, inputs, input_ranges=ranges)
    assert loop_iterations(wl.program.nests) < MAX_ITERATIONS, "test program too large"
    report = verify(wl.program, wl)
    assert report.equivalent, f"{report.reason}\n{wl.program.leir}"
    return wl


torch.manual_seed(0)
X4 = torch.rand(2, 3, 5, 7) * 2 - 1
X3 = torch.rand(3, 5, 7) * 2 - 1
POS = InputRange(0.5, 1.5)


# -- reductions ----------------------------------------------------------------------------------------
REDUCTIONS = {
    "sum_all": lambda x: x.sum(),
    "sum_two_of_four_keepdim": lambda x: x.sum(dim=(1, 3), keepdim=True),
    "sum_negative_dim": lambda x: x.sum(-2),
    "sum_dtype": lambda x: x.sum(dim=(0, 2), dtype=torch.float64),
    "sum_bool": lambda x: (x > 0).sum(dim=-1),
    "sum_of_0d": lambda x: x.sum().sum(),
    "sum_empty_dim_list": lambda x: torch.sum(x, dim=[]),
    "mean_all": lambda x: x.mean(),
    "mean_two_dims_keepdim": lambda x: x.mean(dim=(0, -2), keepdim=True),
    "mean_negative_dim": lambda x: x.mean(-1),
    "amax_two_dims": lambda x: x.amax(dim=(1, 2)),
    "amin_keepdim": lambda x: x.amin(dim=-1, keepdim=True),
    "max_all": lambda x: x.max(),
    "min_all": lambda x: x.min(),
    "max_dim": lambda x: tuple(x.max(dim=2)),
    "min_dim_keepdim": lambda x: tuple(x.min(dim=-3, keepdim=True)),
    "argmax_none": lambda x: x.argmax(),
    "argmax_none_keepdim": lambda x: torch.argmax(x, keepdim=True),
    "argmax_dim0": lambda x: x.argmax(0),
    "argmin_negative_keepdim": lambda x: x.argmin(-1, keepdim=True),
    "any_all": lambda x: ((x > 0.9).any(), (x > -0.95).all(dim=1)),
    "var_correction0": lambda x: torch.var(x, dim=(1, 3), correction=0),
    "var_correction1_keepdim": lambda x: torch.var(x, dim=-1, correction=1, keepdim=True),
    "var_unbiased_false": lambda x: x.var(2, unbiased=False),
    "var_all": lambda x: x.var(),
    "std_all": lambda x: x.std(),
    "std_dims_keepdim": lambda x: x.std(dim=(0, 2), keepdim=True),
    "std_correction0": lambda x: torch.std(x, dim=1, correction=0),
    "var_mean": lambda x: torch.var_mean(x, dim=1),
    "std_mean_all": lambda x: torch.std_mean(x),
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction(name):
    check(REDUCTIONS[name], X4)


@pytest.mark.parametrize("fn", [lambda x: x.prod(), lambda x: x.prod(1, keepdim=True), lambda x: x.prod(-1)],
                         ids=["all", "dim_keepdim", "negative"])
def test_prod(fn):
    check(fn, torch.rand(3, 5, 7) + 0.5, ranges=[POS])


def test_size_one_dims():
    x = torch.rand(3, 1, 5)
    check(lambda x: (x.sum(1), x.mean(1, keepdim=True), x.argmax(1), x.amax(0), torch.softmax(x, 1),
                     x.cumsum(1), x.var(dim=(0, 1))), x)


def test_0d_input():
    check(lambda x: (x.sum(), x.mean(0), x.argmax(), torch.softmax(x, 0), x.cumsum(0), x.amax()), torch.tensor(0.5))


@pytest.mark.parametrize("fn", [
    lambda t: tuple(t.max(1)), lambda t: tuple(t.min(-1, keepdim=True)), lambda t: t.argmax(),
    lambda t: t.argmin(0), lambda t: (t * 1.0).argmax(-1), lambda t: torch.argmax(t, dim=None, keepdim=True)],
    ids=["max_dim", "min_dim", "argmax_flat", "argmin_dim0", "argmax_float", "argmax_flat_keepdim"])
def test_argmax_ties_pick_the_first(fn):
    """Integer inputs in [0, 2] tie everywhere; PyTorch returns the first index of the extreme."""
    t = torch.randint(0, 3, (5, 7))
    check(fn, t, ranges=[InputRange(0, 2)])


# -- norms ---------------------------------------------------------------------------------------------
NORMS = {
    "vector_2_flat": lambda x: torch.linalg.vector_norm(x),
    "vector_1_dims": lambda x: torch.linalg.vector_norm(x, ord=1, dim=(0, 2)),
    "vector_inf": lambda x: torch.linalg.vector_norm(x, ord=INF, dim=-1),
    "vector_minus_inf_keepdim": lambda x: torch.linalg.vector_norm(x, ord=-INF, dim=1, keepdim=True),
    "vector_0": lambda x: torch.linalg.vector_norm(x, ord=0, dim=1),
    "vector_3": lambda x: torch.linalg.vector_norm(x, ord=3, dim=(1, 2)),
    "norm_fro": lambda x: torch.norm(x, p="fro"),
    "norm_default": lambda x: torch.norm(x),
    "norm_dim": lambda x: torch.norm(x, dim=1),
    "norm_fro_dims": lambda x: torch.norm(x, p="fro", dim=(1, 2)),
    "norm_p1_keepdim": lambda x: torch.norm(x, p=1, dim=-1, keepdim=True),
    "matrix_fro": lambda x: torch.linalg.matrix_norm(x),
    "matrix_1": lambda x: torch.linalg.matrix_norm(x, ord=1),
    "matrix_inf_keepdim": lambda x: torch.linalg.matrix_norm(x, ord=INF, keepdim=True),
    "matrix_minus1_dims": lambda x: torch.linalg.matrix_norm(x, ord=-1, dim=(0, 2)),
    "matrix_1_reversed_dims": lambda x: torch.linalg.matrix_norm(x, ord=1, dim=(2, 0)),
    "matrix_minus_inf_reversed_dims": lambda x: torch.linalg.matrix_norm(x, ord=-INF, dim=(-1, -2)),
    "linalg_norm": lambda x: torch.linalg.norm(x),
    "linalg_norm_dim": lambda x: torch.linalg.norm(x, dim=-1),
    "linalg_norm_matrix": lambda x: torch.linalg.norm(x[0], ord=INF),
    "linalg_norm_fro": lambda x: torch.linalg.norm(x, "fro", dim=(0, 1)),
    "normalize": lambda x: F.normalize(x, dim=1),
}


@pytest.mark.parametrize("name", NORMS)
def test_norm(name):
    check(NORMS[name], X3)


@pytest.mark.parametrize("fn", [lambda x: torch.linalg.matrix_norm(x, ord=2),
                                lambda x: torch.linalg.matrix_norm(x, "nuc")], ids=["ord2", "nuc"])
def test_matrix_norm_needing_singular_values_is_unsupported(fn):
    with pytest.raises(UnsupportedOpError, match="linalg_matrix_norm"):
        from_torch(Fn(lambda _, x: fn(x)), (X3,))


# -- softmax family ------------------------------------------------------------------------------------
SOFTMAX = {
    "softmax_dim0": lambda x: torch.softmax(x, 0),
    "softmax_dim1": lambda x: F.softmax(x, dim=1),
    "softmax_last": lambda x: nn.Softmax(dim=-1)(x),
    "softmax_dtype": lambda x: torch.softmax(x, -2, dtype=torch.float64),
    "log_softmax_dim0": lambda x: F.log_softmax(x, dim=0),
    "log_softmax_negative": lambda x: nn.LogSoftmax(dim=-2)(x),
    "logsumexp_two_dims_keepdim": lambda x: torch.logsumexp(x, dim=(0, 2), keepdim=True),
    "logsumexp_last": lambda x: torch.logsumexp(x, dim=-1),
    "logsumexp_all": lambda x: torch.logsumexp(x, dim=(0, 1, 2)),
}


@pytest.mark.parametrize("name", SOFTMAX)
def test_softmax_family(name):
    check(SOFTMAX[name], X3)


def test_softmax_is_steptp_three_nests():
    """Max reduction, sum of exp(x - max) reduction, output: the reference's softmax."""
    leir = check(lambda x: torch.softmax(x, -1), X3).program.leir
    nests = leir.split("];")[:-1]
    assert len(nests) == 3 and "max(" in nests[0] and "exp(" in nests[1] and "/" in nests[2]


def test_softmax_family_stays_finite_for_large_inputs():
    check(lambda x: (torch.softmax(x, 1), F.log_softmax(x, -1), torch.logsumexp(x, 1)), X3 * 300,
          ranges=[InputRange(-300, 300)])


# -- scans ---------------------------------------------------------------------------------------------
SCANS = {
    "cumsum_dim0": lambda x: x.cumsum(0),
    "cumsum_last": lambda x: torch.cumsum(x, dim=-1),
    "cumsum_middle_dtype": lambda x: x.cumsum(1, dtype=torch.float64),
    "cumsum_int": lambda x: (x > 0).cumsum(-1),
    "reverse_cumsum": lambda x: x.flip(-1).cumsum(-1).flip(-1),
    "exclusive_cumsum": lambda x: torch.cat([x[:, :, :1] * 0, x[:, :, :-1]], dim=-1).cumsum(-1),
    "exclusive_cumsum_by_subtraction": lambda x: x.cumsum(0) - x,
    "logcumsumexp": lambda x: torch.logcumsumexp(x, 1),
}


@pytest.mark.parametrize("name", SCANS)
def test_scan(name):
    check(SCANS[name], X3)


@pytest.mark.parametrize("dim", [0, -1])
def test_cumprod(dim):
    check(lambda x: x.cumprod(dim), torch.rand(3, 5, 7) + 0.5, ranges=[POS])


@pytest.mark.skipif("aten.zeros_like.default" not in HANDLERS, reason="zeros_like has no handler yet")
def test_exclusive_cumsum_kernelbench_form():
    """KernelBench's exclusive cumsum: cat a zeros_like column in front, drop the last row, cumsum."""
    check(lambda x: torch.cumsum(torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), x), dim=1)[:-1], dim=1),
          X3)


def test_masked_cumsum():
    check(lambda x, m: torch.cumsum(x * m, dim=1), X3, torch.rand(3, 5, 7) > 0.5)


def test_cumsum_is_a_linear_prefix_scan():
    wl = check(lambda x: x.cumsum(1), X3)
    assert len(wl.program.nests) == 1 and loop_iterations(wl.program.nests) == X3.numel()
    assert "C^{f32,g}_{a,d,c}=if_then_else(d-1<0,0,C^{f32,g}_{a,d-1,c})+A^{f32,g}_{a,d,c}" in wl.program.leir


# -- losses --------------------------------------------------------------------------------------------
REDUCTION = ["mean", "sum", "none"]
A = torch.rand(5, 7) * 2 - 1
B = torch.rand(5, 7) * 2 - 1

POINTWISE_LOSSES = {
    "mse": lambda x, y, r: F.mse_loss(x, y, reduction=r),
    "l1": lambda x, y, r: F.l1_loss(x, y, reduction=r),
    "smooth_l1": lambda x, y, r: F.smooth_l1_loss(x, y, reduction=r, beta=0.5),
    "smooth_l1_beta0": lambda x, y, r: F.smooth_l1_loss(x, y, reduction=r, beta=0.0),
    "huber": lambda x, y, r: F.huber_loss(x, y, reduction=r, delta=0.4),
    "soft_margin": lambda x, y, r: F.soft_margin_loss(x, y, reduction=r),
    "margin_ranking": lambda x, y, r: F.margin_ranking_loss(x[0], x[1], y[2], margin=0.3, reduction=r),
    "bce_with_logits": lambda x, y, r: F.binary_cross_entropy_with_logits(x, (y + 1) / 2, reduction=r),
    "hinge_as_ops": lambda x, y, r: {"mean": torch.mean, "sum": torch.sum, "none": lambda t: t}[r](
        torch.clamp(1 - x * y, min=0)),
}


@pytest.mark.parametrize("reduction", REDUCTION)
@pytest.mark.parametrize("name", POINTWISE_LOSSES)
def test_pointwise_loss(name, reduction):
    check(lambda x, y: POINTWISE_LOSSES[name](x, y, reduction), A, B)


@pytest.mark.parametrize("reduction", REDUCTION)
def test_loss_broadcasts_target(reduction):
    check(lambda x, y: F.mse_loss(x, y.expand_as(x), reduction=reduction), A, B[0])


@pytest.mark.parametrize("reduction", ["batchmean", "mean", "sum", "none"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(reduction, log_target):
    target = torch.rand(5, 7) * 0.9 + 0.05
    check(lambda x, t: F.kl_div(F.log_softmax(x, -1), t.log() if log_target else t, reduction=reduction,
                                log_target=log_target), A, target, ranges=[None, InputRange(0.05, 0.95)])


@pytest.mark.parametrize("reduction", REDUCTION)
def test_hinge_embedding_loss(reduction):
    """Targets are exactly +-1, so both branches of ATen's formula are taken."""
    t = torch.randint(0, 2, (5, 7))
    check(lambda x, t: F.hinge_embedding_loss(x, t * 2.0 - 1, margin=0.5, reduction=reduction), A, t,
          ranges=[None, InputRange(0, 1)])


@pytest.mark.parametrize("reduction", REDUCTION)
def test_binary_cross_entropy(reduction):
    p = torch.rand(5, 7) * 0.9 + 0.05
    check(lambda m, p, y: F.binary_cross_entropy(p, y, weight=m.w, reduction=reduction), p, torch.rand(5, 7),
          ranges=[InputRange(0.05, 0.95), InputRange(0, 1)], w=torch.rand(7) + 0.5)


def test_bce_with_logits_weights():
    check(lambda m, x, y: F.binary_cross_entropy_with_logits(x, y, weight=m.w, pos_weight=m.pw), A * 4,
          torch.rand(5, 7), ranges=[None, InputRange(0, 1)], w=torch.rand(7) + 0.5, pw=torch.rand(7) * 3)


C = 4
LOGITS = torch.rand(6, C) * 4 - 2
LABELS = torch.randint(0, C, (6,))
CLASS_RANGE = [None, InputRange(0, C - 1)]


@pytest.mark.parametrize("reduction", REDUCTION)
def test_cross_entropy(reduction):
    check(lambda x, t: F.cross_entropy(x, t, reduction=reduction), LOGITS, LABELS, ranges=CLASS_RANGE)


@pytest.mark.parametrize("reduction", REDUCTION)
def test_cross_entropy_3d(reduction):
    """Input (N, C, d1), target (N, d1): the class dim is 1."""
    check(lambda x, t: F.cross_entropy(x, t, reduction=reduction), torch.rand(3, C, 5), torch.randint(0, C, (3, 5)),
          ranges=CLASS_RANGE)


def test_cross_entropy_single_sample():
    """Input (C,) with a 0-d target: the class dim is 0."""
    check(lambda x, t: F.cross_entropy(x, t), LOGITS[0], LABELS[0], ranges=CLASS_RANGE)


@pytest.mark.parametrize("reduction", REDUCTION)
def test_cross_entropy_ignore_index_and_weight(reduction):
    check(lambda m, x, t: F.cross_entropy(x, t, weight=m.w, ignore_index=1, reduction=reduction), LOGITS, LABELS,
          ranges=CLASS_RANGE, w=torch.rand(C) + 0.5)


@pytest.mark.parametrize("reduction", REDUCTION)
def test_cross_entropy_label_smoothing(reduction):
    check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.2, ignore_index=2, reduction=reduction),
          torch.rand(3, C, 5), torch.randint(0, C, (3, 5)), ranges=CLASS_RANGE)


@pytest.mark.parametrize("reduction", REDUCTION)
def test_cross_entropy_probability_targets(reduction):
    check(lambda x, t: F.cross_entropy(x, t.softmax(1), label_smoothing=0.1, reduction=reduction),
          torch.rand(3, C, 5), torch.rand(3, C, 5))


def test_cross_entropy_module_with_weight():
    """The class weights come in as a buffer of the loss module."""
    loss = nn.CrossEntropyLoss(weight=torch.rand(C) + 0.5)
    wl = from_torch(loss, (LOGITS, LABELS), input_ranges=CLASS_RANGE)
    report = verify(wl.program, wl)
    assert report.equivalent, report.reason


def test_cross_entropy_weight_with_label_smoothing_is_unsupported():
    with pytest.raises(UnsupportedOpError, match="cross_entropy_loss"):
        from_torch(Fn(lambda m, x, t: F.cross_entropy(x, t, weight=m.w, label_smoothing=0.1), w=torch.ones(C)),
                   (LOGITS, LABELS))


@pytest.mark.parametrize("reduction", REDUCTION)
def test_nll_loss(reduction):
    check(lambda x, t: F.nll_loss(F.log_softmax(x, 1), t, reduction=reduction), LOGITS, LABELS, ranges=CLASS_RANGE)


@pytest.mark.parametrize("reduction", REDUCTION)
def test_nll_loss_3d_weight_ignore_index(reduction):
    check(lambda m, x, t: F.nll_loss(x, t, weight=m.w, ignore_index=0, reduction=reduction), torch.rand(3, C, 5),
          torch.randint(0, C, (3, 5)), ranges=CLASS_RANGE, w=torch.rand(C) + 0.5)


@pytest.mark.parametrize("args", [dict(), dict(dim=0, eps=1e-6), dict(dim=-1)], ids=["default", "dim0_eps", "last"])
def test_cosine_similarity(args):
    check(lambda x, y: F.cosine_similarity(x, y, **args), A, B)


def test_cosine_similarity_broadcast_and_tiny_norms():
    """A broadcast second operand; the first scaled down so that its norm is clamped to eps."""
    check(lambda x, y: F.cosine_similarity(x * 1e-9, y, dim=-1, eps=1e-6), A, B[0])


def test_cosine_embedding_style_mean():
    check(lambda x, y: torch.mean(1 - F.cosine_similarity(x, y)), A, B)


@pytest.mark.parametrize("args", [dict(), dict(p=1.0, keepdim=True), dict(p=3.0, eps=0.0)], ids=["l2", "l1", "l3"])
def test_pairwise_distance(args):
    check(lambda x, y: F.pairwise_distance(x, y, **args), A, B)


@pytest.mark.parametrize("reduction", REDUCTION)
def test_triplet_margin_loss(reduction):
    check(lambda a, p, n: F.triplet_margin_loss(a, p, n, margin=0.5, reduction=reduction), A, B, A.flip(0))


@pytest.mark.parametrize("args", [dict(p=1), dict(swap=True), dict(p=3, eps=1e-3, margin=2.0)],
                         ids=["p1", "swap", "p3"])
def test_triplet_margin_loss_arguments(args):
    check(lambda a, p, n: F.triplet_margin_loss(a, p, n, **args), A, B, A.flip(0))


def test_loss_modules():
    check(lambda x, y: (nn.MSELoss()(x, y), nn.L1Loss(reduction="sum")(x, y), nn.HuberLoss(delta=2.0)(x, y),
                        nn.SmoothL1Loss(reduction="none")(x, y)), A, B)
