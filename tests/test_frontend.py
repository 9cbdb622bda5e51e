"""from_torch: the driver, the Workload contract, error paths, and elementwise/linalg/shape handlers on
shapes and arguments the suite does not use."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from steptp_env import Program, build, verify
from steptp_env.frontend import InputRange, UnsupportedOpError, Workload, from_torch


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def check(fn, *inputs, **kwargs) -> Workload:
    wl = from_torch(Lambda(fn), inputs, **kwargs)
    report = verify(wl.program, wl)
    assert report.equivalent, report.reason
    return wl


def randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


# -- elementwise and broadcasting ---------------------------------------------------------------------

@pytest.mark.parametrize("fn", [
    lambda x, y: x + y * 2 - 1, lambda x, y: x / (y.abs() + 1), lambda x, y: torch.maximum(x, y),
    lambda x, y: torch.where(x > y, x, -y), lambda x, y: (x >= 0.1) & (y < 0.3), lambda x, y: x.sub(y, alpha=3),
    lambda x, y: torch.pow(x.abs() + 0.5, y), lambda x, y: x.masked_fill(y > 0, -2.5),
    lambda x, y: torch.div(x * 4, y.abs() + 0.5, rounding_mode="floor"),
    lambda x, y: torch.div(x * 4, y + 3, rounding_mode="trunc"), lambda x, y: 2 - x, lambda x, y: x ** 2,
])
def test_binary_ops_broadcast_over_size_one_and_missing_dims(fn):
    check(fn, randn(3, 1, 5), randn(4, 1))


@pytest.mark.parametrize("fn", [
    F.relu, F.relu6, lambda x: F.leaky_relu(x, 0.2), lambda x: F.elu(x, 0.7), F.selu, F.gelu,
    lambda x: F.gelu(x, approximate="tanh"), torch.sigmoid, torch.tanh, F.softplus, lambda x: F.softplus(x, 2.0, 5.0),
    F.softsign, F.mish, F.silu, lambda x: F.hardtanh(x, -0.5, 0.7), F.hardsigmoid, F.hardswish, torch.exp,
    lambda x: torch.log(x.abs() + 0.1), lambda x: torch.rsqrt(x.abs() + 0.1), torch.neg, lambda x: x.clamp(-0.3, 0.4),
    lambda x: x.clamp(min=0.1), lambda x: x.clamp(max=0.1), torch.erf, torch.square, lambda x: torch.logical_not(x > 0),
])
def test_unary_ops(fn):
    check(fn, randn(2, 7, 3) * 4)


def test_activations_stay_finite_for_large_inputs():
    # tanh as a ratio of exponentials overflows to NaN at |x| ~ 355 in float64; ours must not
    check(lambda x: torch.tanh(x) + F.mish(x) + F.gelu(x, approximate="tanh"), randn(64) * 400, dtype="float64")


# -- products -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, shapes", [
    (torch.matmul, [(7,), (7,)]), (torch.matmul, [(3, 7), (7,)]), (torch.matmul, [(7,), (7, 2)]),
    (torch.matmul, [(2, 1, 3, 5), (4, 5, 6)]), (torch.bmm, [(2, 3, 5), (2, 5, 1)]),
    (lambda a, b: torch.einsum("bij,bjk->bik", a, b), [(2, 3, 4), (2, 4, 5)]),
    (lambda a, b: torch.einsum("ij,ij->i", a, b), [(3, 4), (3, 4)]),
    (lambda a, b: torch.einsum("ii->i", a) + b[0, 0], [(4, 4), (1, 1)]),
    (lambda a, b: torch.addmm(b[0], a, a.t(), beta=0.5, alpha=2.0), [(3, 4), (1, 3)]),
])
def test_matrix_products(fn, shapes):
    check(fn, *[randn(*s) for s in shapes])


def test_linear_with_and_without_bias_and_batch_dims():
    check(nn.Linear(5, 3).forward, randn(2, 4, 5))
    check(nn.Linear(5, 1, bias=False).forward, randn(5))


# -- data movement --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [
    lambda x: x.reshape(6, 5, 4), lambda x: x.reshape(2, 60),
    lambda x: x.view(-1), lambda x: x.flatten(1), lambda x: x.permute(2, 0, 1) * 1,
    lambda x: x.transpose(-1, 0).contiguous(), lambda x: x.unsqueeze(-1).unsqueeze(0), lambda x: x[:, :1].squeeze(1),
    lambda x: x[:, None, :, 1].expand(4, 3, 5), lambda x: x[1:, ::2, -3:], lambda x: x[:, -1],
    lambda x: torch.cat([x, x[:, :2] * 2], dim=-2), lambda x: torch.stack(torch.chunk(x, 2, 0)).sum(0),
    lambda x: torch.split(x, [1, 4], 1)[1] + 1, lambda x: x.flip(0, -1), lambda x: x[0].triu(1) + x[1].tril(-1),
    lambda x: torch.diag(x[0, :, 0]) + torch.diag(x[0], 1).sum(), lambda x: x.unbind(2)[3],
])
def test_data_movement(fn):
    check(fn, randn(4, 5, 6))


# -- the Workload contract ------------------------------------------------------------------------------

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.register_buffer("shift", torch.full((4,), 0.25))

    def forward(self, x, mask):
        return torch.where(mask, F.relu(self.fc(x)) - self.shift, 0.0)


def net_workload() -> Workload:
    torch.manual_seed(0)
    return from_torch(Net(), (randn(3, 6), torch.ones(3, 4, dtype=torch.bool)))


def test_parameters_and_buffers_become_param_inputs_after_user_inputs():
    wl = net_workload()
    roles = [(s.role, s.shape) for s in wl.program.signature.tensors]
    assert roles == [("input", (3, 6)), ("input", (3, 4)), ("param", (4, 6)), ("param", (4,)), ("param", (4,)),
                     ("output", (3, 4))]
    inputs = wl.make_inputs(1)
    np.testing.assert_array_equal(inputs["D"], wl.module.fc.weight.detach().numpy())
    assert inputs["C"].dtype == np.bool_ and 0 < inputs["C"].mean() < 1


def test_inputs_are_fresh_per_seed_and_within_the_example_range():
    wl = from_torch(Lambda(torch.log), (torch.rand(50) + 2,))
    a, b = wl.make_inputs(0)["A"], wl.make_inputs(1)["A"]
    assert not np.array_equal(a, b) and a.min() >= 2 and a.max() <= 3
    wl = from_torch(Lambda(torch.log), (torch.rand(50),), input_ranges=[InputRange(5, 6)])
    assert wl.make_inputs(0)["A"].min() >= 5


def test_reference_uses_the_parameters_it_is_given():
    wl = net_workload()
    inputs = wl.make_inputs(0)
    out = wl.program.signature.outputs[0].name
    changed = dict(inputs, F=inputs["F"] + 1.0)  # F is the buffer `shift`
    delta = wl.reference(changed)[out] - wl.reference(inputs)[out]
    np.testing.assert_allclose(delta, np.where(inputs["C"], -1.0, 0.0), atol=1e-6)


def test_save_and_load_round_trip(tmp_path):
    wl = net_workload()
    wl.save(tmp_path / "wl")
    again = Workload.load(tmp_path / "wl", Net())
    assert again.uri == wl.uri and again.program == wl.program
    inputs = again.make_inputs(3)
    np.testing.assert_array_equal(inputs["D"], wl.make_inputs(3)["D"])
    assert verify(again.program, again).equivalent
    assert not list(tmp_path.glob("**/*.pkl"))


class _Payload:
    """Unpickling this runs code: it creates the file named in it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_loading_an_untrusted_folder_runs_nothing_from_it(tmp_path):
    """A shared folder whose module archive is a crafted pickle: the default load reads JSON and .npz only
    (no file appears), checks against the saved start program, and still verifies; trust=True loads the
    archive of a folder one trusts."""
    import pickle

    wl = net_workload()
    wl.save(tmp_path / "wl")
    marker = tmp_path / "pwned"
    (tmp_path / "wl" / "module.pt2").write_bytes(pickle.dumps(_Payload(str(marker))))
    loaded = Workload.load(tmp_path / "wl")
    assert not marker.exists() and loaded.module is None
    inputs = loaded.make_inputs(1)
    for name, value in loaded.reference(inputs).items():
        np.testing.assert_allclose(value, wl.reference(inputs)[name], rtol=1e-5, atol=1e-6)
    assert verify(loaded.program, loaded).equivalent
    wl.save(tmp_path / "trusted")
    assert Workload.load(tmp_path / "trusted", trust=True).module is not None  # the archive, on request


def test_content_uri_is_deterministic_and_depends_on_parameters():
    a, b = net_workload(), net_workload()
    assert a.uri == b.uri and a.uri.startswith("torch/")
    with torch.no_grad():
        b.module.fc.weight += 1
    assert from_torch(b.module, (randn(3, 6), torch.ones(3, 4, dtype=torch.bool))).uri != a.uri


def test_float64_and_cuda_target_options():
    wl = from_torch(Net(), (randn(3, 6), torch.ones(3, 4, dtype=torch.bool)), dtype="float64", target="cuda")
    assert all(s.dtype in ("float64", "bool") for s in wl.program.signature.tensors)
    assert all(n.loops[0].kind == "B" and n.loops[0].var == "tx" for n in wl.program.nests)
    assert "__global__" in build(wl.program, "cuda").source
    assert verify(wl.program, wl).equivalent  # B loops run serially on the CPU


# -- errors ---------------------------------------------------------------------------------------------

def test_unknown_op_names_the_op_node_and_source_line():
    with pytest.raises(UnsupportedOpError) as info:
        from_torch(Lambda(lambda x: torch.sort(x, 1).values), (randn(3, 4),))
    assert info.value.op == "aten.sort.default" and info.value.node == "sort"
    assert "test_frontend.py" in info.value.source


def test_data_dependent_shape_is_rejected():
    with pytest.raises(UnsupportedOpError, match="data-dependent shape"):
        from_torch(Lambda(lambda x: x[x > 0].sum()), (randn(8),))


def test_in_place_mutation_of_an_input_is_rejected_but_of_an_intermediate_is_fine():
    def mutate_input(x):
        x.add_(1)
        return x * 2

    with pytest.raises(UnsupportedOpError, match="in-place mutation of an input"):
        from_torch(Lambda(mutate_input), (randn(4),))

    def mutate_intermediate(x):
        h = x * 3
        h.add_(1)
        return h.relu_() - x

    check(mutate_intermediate, randn(4, 2))


def test_falls_back_to_fx_tracing_when_export_fails(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("export refused this module")

    monkeypatch.setattr(torch.export, "export", refuse)
    wl = net_workload()
    assert [s.role for s in wl.program.signature.tensors].count("param") == 3
    inputs = wl.make_inputs(0)
    np.testing.assert_array_equal(inputs["D"], wl.module.fc.weight.detach().numpy())
    assert verify(wl.program, wl).equivalent


def test_untraceable_module_is_an_unsupported_op_error(monkeypatch):
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    with pytest.raises(UnsupportedOpError, match="untraceable module"):
        from_torch(Lambda(lambda x: x * 2 if x.sum() > 0 else x), (randn(3),))


def test_program_is_never_partial():
    with pytest.raises(UnsupportedOpError):
        from_torch(Lambda(lambda x: torch.fft.fft(x).real + x), (randn(8),))
    assert isinstance(net_workload().program, Program)
