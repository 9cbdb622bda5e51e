"""Versioned evaluation suites: fixed workload lists that results from different agents and papers share.

A suite is frozen once published: its name carries a version, and a change of workloads or preset is a new
name (`eval-small-v1`), never an edit, so a figure reported against `eval-small-v0` always means the same
programs. `eval-small-v0` is a split of the suite by family: for each of the 18 operator families
(`WorkloadSpec.family`) that has a workload outside the packaged cost model's training set (the 58 workloads
in `costmodel/default_model/data.npz`), one such workload, drawn with `random.Random(0).choice` over the
family's sorted untrained URIs, families in sorted order. No shipped policy exists to be disjoint from (PPO
trains on the workload it is evaluated on unless given `--policy`). `eval-tiny-v0` is the same workloads at
`tiny`, for quick checks and tests; its figures are not comparable with `small`'s.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import StepTPError


@dataclass(frozen=True)
class EvalSuite:
    """A named, frozen list of suite URIs at one preset."""

    name: str
    preset: str
    uris: tuple[str, ...]


_FAMILY_SPLIT_V0 = (
    "level1/softsign",                                        # activation
    "level2/mha_gemm_tanh",                                   # attention
    "level2/bmm_scale_softmax",                               # bmm_chain
    "level1/conv1d_padded_bias",                              # conv
    "level2/conv1d_conv1d_padding",                           # conv1d_chain
    "level2/conv2d_subtract_tanh_subtract_avg_pool",          # conv2d_chain
    "level2/conv3d_multiply_instance_norm_clamp_multiply_max",  # conv3d_chain
    "level1/matrix_scalar",                                   # elementwise
    "level2/exp_exp",                                         # elementwise_chain
    "level2/gemm_max_subtract_gelu",                          # gemm_chain
    "level1/triplet_margin_loss",                             # loss
    "level1/matmul_batched_broadcast",                        # matmul
    "level2/matmul_min_subtract",                             # matmul_chain
    "level1/frobenius_norm",                                  # normalization
    "level1/avg_pool_3d",                                     # pooling
    "level1/mean_over_dim",                                   # reduction
    "level1/cumprod",                                         # scan
    "level1/softmax_dim1_3d",                                 # softmax
)

EVAL_SUITES: dict[str, EvalSuite] = {
    "eval-small-v0": EvalSuite("eval-small-v0", "small", _FAMILY_SPLIT_V0),
    "eval-tiny-v0": EvalSuite("eval-tiny-v0", "tiny", _FAMILY_SPLIT_V0),
}


class UnknownSuiteError(StepTPError, KeyError):
    """A suite name that is not in `EVAL_SUITES`; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0])


def eval_suite(name: str) -> EvalSuite:
    """The suite called `name`, or UnknownSuiteError naming the known suites."""
    if name not in EVAL_SUITES:
        raise UnknownSuiteError(f"unknown evaluation suite {name!r}; known: {', '.join(EVAL_SUITES)}")
    return EVAL_SUITES[name]
