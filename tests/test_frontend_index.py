"""Index tensors (embedding, index_select, gather read through them; scatter_add in gather form), the
generated list of supported ops, and the errors a new user meets first: an unsupported op names the list, a data-dependent shape is one line
without torch's graph dump."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from steptp_env import from_torch
from steptp_env.frontend import UnsupportedOpError
from steptp_env.frontend.supported_ops import DOC, markdown
from steptp_env.measure import Protocol, measure, verify
from steptp_env.measure.inputs import index_bounds
from steptp_env.strategies import REGISTRY, get_strategy


class Lookup(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(50, 16, padding_idx=0)

    def forward(self, tokens):
        return torch.tanh(self.table(tokens)) * 2


class Select(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x, index):
        return torch.index_select(x, self.dim, index) + 1


class Gather(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x, index):
        return torch.gather(x, self.dim, index) * 3


class ScatterAdd(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x, index, src):
        return x.scatter_add(self.dim, index, src) - 1


def _cases():
    torch.manual_seed(0)
    return [("embedding", Lookup(), (torch.randint(0, 50, (4, 7)),)),
            ("index_select dim 0", Select(0), (torch.randn(6, 5), torch.tensor([5, 0, 2, 2]))),
            ("index_select dim -1", Select(-1), (torch.randn(3, 10), torch.tensor([9, 0, 4]))),
            ("gather dim 1", Gather(1), (torch.randn(3, 10), torch.randint(0, 10, (3, 5)))),
            ("gather dim 0", Gather(0), (torch.randn(6, 4), torch.randint(0, 6, (2, 4)))),
            ("scatter_add dim 0", ScatterAdd(0), (torch.randn(5, 4), torch.randint(0, 5, (9, 4)), torch.randn(9, 6))),
            ("scatter_add dim -1", ScatterAdd(-1), (torch.randn(3, 6), torch.randint(0, 6, (3, 2)), torch.randn(3, 2)))]


@pytest.mark.parametrize("name, module, args", _cases(), ids=[c[0] for c in _cases()])
def test_reads_through_an_index_tensor_verify(name, module, args):
    workload = from_torch(module, args)
    assert "i64" in workload.program.leir  # the subscript reads the index tensor
    report = verify(workload.program, workload, trials=3, seed=0)
    assert report.equivalent, report.reason


@pytest.mark.parametrize("case", [0, 5], ids=["embedding", "scatter_add"])
def test_every_strategy_keeps_an_index_program_equivalent(case):
    """The analyses meet index-tensor subscripts and one-hot selections in every strategy: two candidates
    of each, verified."""
    workload = from_torch(*_cases()[case][1:])
    checked = 0
    for name in REGISTRY:
        for action in get_strategy(name).candidates(workload.program, "llvm")[:2]:
            after = get_strategy(name).apply(workload.program, action)
            m = measure(after, workload, protocol=Protocol(threads=1, trials=2), timing=False)
            assert m.ok, (action.text, m.error)
            checked += 1
    assert checked >= 8


def test_a_scatter_index_is_drawn_inside_the_scattered_dimension():
    """A scatter index is compared with the output's loop index, not used as a subscript, yet PyTorch
    rejects one outside the dimension: fresh inputs keep it in [0, 5) (the default integer draw is [0, 8))."""
    workload = from_torch(*_cases()[5][1:])
    index = next(s.name for s in workload.program.signature.inputs if s.dtype == "int64")
    assert index_bounds(workload.program)[index] == (0, 4)
    drawn = [workload.make_inputs(seed)[index] for seed in range(5)]
    assert all(d.min() >= 0 and d.max() <= 4 for d in drawn) and any(d.max() == 4 for d in drawn)


def test_last_write_wins_scatters_and_partial_index_shapes_are_refused():
    class Scatter(torch.nn.Module):
        def forward(self, x, index, src):
            return x.scatter(0, index, src)

    with pytest.raises(UnsupportedOpError, match=r"aten\.scatter\.src.*docs/supported_ops\.md"):
        from_torch(Scatter(), (torch.zeros(5), torch.tensor([0, 1, 1]), torch.ones(3)))
    with pytest.raises(UnsupportedOpError, match=r"index shape \(2, 3\) differs from the input's \(5, 4\)"):
        from_torch(ScatterAdd(0), (torch.zeros(5, 4), torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 3)))


def test_a_data_dependent_shape_is_one_line_without_a_graph_dump():
    code = """
import torch
from steptp_env import from_torch
from steptp_env.frontend import UnsupportedOpError
class Branch(torch.nn.Module):
    def forward(self, x):
        return x * 2 if torch.nonzero(x).shape[0] > 3 else x
try:
    from_torch(Branch(), (torch.randn(8),))
except UnsupportedOpError as exc:
    print(exc)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "data-dependent shape" in done.stdout, done.stderr[-2000:]
    assert "def forward" not in done.stderr and len(done.stderr.splitlines()) < 5, done.stderr[-2000:]


def test_the_supported_ops_page_is_the_registry():
    assert DOC.read_text() == markdown(), "run: python -m steptp_env.frontend.supported_ops --write"
    assert all(f"`aten.{op}.default`" in DOC.read_text() for op in ("embedding", "gather", "scatter_add"))
