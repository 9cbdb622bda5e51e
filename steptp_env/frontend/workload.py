"""`Workload`: a starting program with its inputs and its PyTorch reference, and `from_torch`."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import StepTPError
from ..ir.interpret import interpret
from ..ir.program import Program
from .convert import TORCH_TO_DTYPE, UnsupportedOpError, capture, content_uri, convert_graph

_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16}


MANIFEST = "workload.json"
"""The file that makes a folder a saved workload: URI, preset, LEIR, signature, origins and input ranges."""


@dataclass(frozen=True)
class InputRange:
    """How fresh values of one user input are drawn: uniform in [low, high] (integers inclusive)."""

    low: float
    high: float


class Workload:
    """A program to optimise, how to feed it, and what it must compute.

    `make_inputs(seed)` gives every program input (user inputs drawn fresh from their ranges, parameters
    as the module holds them) by program tensor name; `reference(inputs)` runs the PyTorch module in eval
    mode, single-threaded, on copies of those inputs and returns the outputs by program tensor name.
    """

    def __init__(self, uri: str, program: Program, module: torch.nn.Module, origin: dict[str, tuple[str, Any]],
                 params: dict[str, np.ndarray], ranges: dict[str, InputRange], preset: str | None = None) -> None:
        self.uri = uri
        self.program = program
        self.module = module
        self.origin = origin
        self.params = params
        self.ranges = ranges
        self.preset = preset
        self._digest: str | None = None

    def __repr__(self) -> str:
        return f"Workload({self.uri!r}, preset={self.preset!r}, {len(self.program.nests)} nests)"

    def digest(self) -> str:
        """A hash of what the reference computes and how it is fed: the program and signature, the parameter
        values, the input ranges and the module's class (remembered: parameters can be large). Stored
        verdicts are keyed by it (`measure.context`)."""
        if self._digest is None:
            digest = hashlib.sha256()
            meta = {"leir": self.program.leir, "signature": self.program.signature.to_json(),
                    "origin": {k: list(v) for k, v in self.origin.items()},
                    "ranges": {k: [r.low, r.high] for k, r in self.ranges.items()},
                    "module": f"{type(self.module).__module__}.{type(self.module).__qualname__}"}
            digest.update(json.dumps(meta, sort_keys=True, default=str).encode())
            for name in sorted(self.params):
                array = np.ascontiguousarray(self.params[name])
                digest.update(f"{name}|{array.dtype}|{array.shape}".encode())
                digest.update(array.tobytes())
            self._digest = digest.hexdigest()[:16]
        return self._digest

    def make_inputs(self, seed: int) -> dict[str, np.ndarray]:
        from ..measure.inputs import index_bounds

        rng = np.random.default_rng(seed)
        limits = index_bounds(self.program)
        arrays: dict[str, np.ndarray] = {}
        for spec in self.program.signature.inputs:
            kind, _ = self.origin[spec.name]
            if kind == "param":
                arrays[spec.name] = self.params[spec.name].copy()
                continue
            rng_range = self.ranges[spec.name]
            if spec.dtype == "bool":
                arrays[spec.name] = np.asarray(rng.random(spec.shape) < 0.5)
            elif spec.dtype.startswith(("int", "uint")):
                lo, hi = int(rng_range.low), int(rng_range.high)
                if spec.name in limits:
                    lo, hi = max(lo, limits[spec.name][0]), min(hi, limits[spec.name][1])
                arrays[spec.name] = np.asarray(rng.integers(lo, max(lo, hi) + 1, spec.shape), dtype=spec.dtype)
            else:
                arrays[spec.name] = np.asarray(rng.uniform(rng_range.low, rng_range.high, spec.shape),
                                               dtype=spec.dtype)
        return arrays

    def torch_arguments(self, inputs: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
        """The module's positional arguments: the user inputs among `inputs`, in the order `forward` takes
        them (parameters are module state, not arguments). Copies, so a module that writes to its inputs
        leaves the caller's arrays alone; call `self.module(*args)` to run PyTorch eager directly."""
        users = sorted((pos, name) for name, (kind, pos) in self.origin.items() if kind == "input")
        return tuple(torch.from_numpy(np.array(inputs[name])) for _, name in users)

    def reference(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs the workload must compute: the PyTorch module's, or, for a workload loaded without
        its module (`load` of an untrusted folder), those of its start program run by the LEIR interpreter
        (the program was checked against the module when the workload was translated)."""
        if self.module is None:
            return interpret(self.program, inputs)
        args = self.torch_arguments(inputs)
        owned = {n for n, _ in [*self.module.named_parameters(), *self.module.named_buffers()]}
        state = {fqn: torch.from_numpy(np.array(inputs[name])) for name, (kind, fqn) in self.origin.items()
                 if kind == "param" and fqn in owned}  # constants made inside forward are not module state
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                result = torch.func.functional_call(self.module, state, args, strict=False)
        finally:
            torch.set_num_threads(threads)
        leaves = torch.utils._pytree.tree_leaves(result)
        names = [s.name for s in self.program.signature.outputs]
        return {name: leaf.detach().numpy() for name, leaf in zip(names, leaves)}

    # -- persistence (plain JSON + .npz, and the module as a torch.export archive where it exports) ----
    def save(self, directory: Path) -> Path:
        """Write the workload to `directory` (created): `workload.json`, `params.npz`, `module.pt2`. The
        folder is accepted wherever a suite URI is (`get_workload`, `StepTPEnv`, `steptp run --workload`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta = {"uri": self.uri, "preset": self.preset, "leir": self.program.leir,
                "signature": self.program.signature.to_json(),
                "origin": {k: list(v) for k, v in self.origin.items()},
                "ranges": {k: [r.low, r.high] for k, r in self.ranges.items()}}
        (directory / MANIFEST).write_text(json.dumps(meta, indent=1) + "\n")
        np.savez(directory / "params.npz", **self.params)
        try:
            exported = torch.export.export(self.module, self.torch_arguments(self.make_inputs(0)))
            torch.export.save(exported, directory / "module.pt2")
        except Exception:  # noqa: BLE001  (not every module exports; then the caller must pass the module to load)
            (directory / "module.pt2").unlink(missing_ok=True)
        return directory

    @classmethod
    def load(cls, directory: Path, module: torch.nn.Module | None = None, trust: bool = False) -> Workload:
        """Load a saved workload. The reference is `module` if given (its parameter values are taken from
        the saved file); else, with `trust=True`, the saved torch.export archive, which torch unpickles (it
        can run code: only for folders you trust); else the saved start program itself, run by the LEIR
        interpreter. So by default loading a folder someone shared reads JSON and .npz only and runs
        nothing from it."""
        directory = Path(directory)
        if not is_saved_workload(directory):
            raise StepTPError(f"{directory} is not a saved workload: it has no {MANIFEST} (Workload.save writes one)")
        meta = json.loads((directory / MANIFEST).read_text())
        with np.load(directory / "params.npz", allow_pickle=False) as data:
            params = {k: data[k] for k in data.files}
        if module is not None:
            module = module.eval()
        elif trust:
            archive = directory / "module.pt2"
            if not archive.exists():
                raise StepTPError(f"{directory} holds no exported module; pass the PyTorch module to load it")
            module = torch.export.load(archive).module()
        program = Program.parse(meta["leir"], meta["signature"])
        origin = {k: (v[0], v[1]) for k, v in meta["origin"].items()}
        ranges = {k: InputRange(*v) for k, v in meta["ranges"].items()}
        return cls(meta["uri"], program, module, origin, params,
                   ranges, meta["preset"])


def is_saved_workload(path: object) -> bool:
    """Whether `path` (a str or Path) names a folder that `Workload.save` wrote."""
    try:
        return isinstance(path, (str, Path)) and (Path(path) / MANIFEST).is_file()
    except OSError:  # a name too long for the file system, say: not a folder
        return False


def _default_range(t: torch.Tensor) -> InputRange:
    if t.dtype == torch.bool or t.numel() == 0:
        return InputRange(0, 1)
    lo, hi = float(t.min()), float(t.max())
    if not t.dtype.is_floating_point:
        return InputRange(lo, hi)
    return InputRange(lo, hi) if hi > lo else InputRange(-1.0, 1.0)


def from_torch(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor, *,
               dtype: str | None = None, target: str = "llvm", uri: str | None = None, preset: str | None = None,
               input_ranges: Sequence[InputRange | None] | None = None) -> Workload:
    """Translate a module into a `Workload`.

    `dtype` converts the module and its floating inputs first (float64, float32, float16). Fresh inputs are
    drawn uniformly over the range each example input spans (or `input_ranges`). Raises
    `UnsupportedOpError` naming the op, node and source line for anything it cannot translate.
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    args = list(example_inputs)
    module = module.eval()
    if dtype is not None:
        if dtype not in _DTYPES:
            raise UnsupportedOpError(f"dtype {dtype}", why="choose float64, float32 or float16")
        module = module.to(_DTYPES[dtype])
        args = [a.to(_DTYPES[dtype]) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    graph, kinds, state = capture(module, tuple(args))
    builder, outputs, origin = convert_graph(graph, kinds, state, args)
    program = builder.program(outputs)
    if target == "cuda":
        from .gpu import bind_outer_loops

        program = bind_outer_loops(program)
    params = {name: state[fqn].detach().cpu().numpy().copy() for name, (kind, fqn) in origin.items()
              if kind == "param"}
    ranges = {}
    for name, (kind, pos) in origin.items():
        if kind == "input":
            given = input_ranges[pos] if input_ranges is not None and pos < len(input_ranges) else None
            ranges[name] = given or _default_range(args[pos])
    assert set(TORCH_TO_DTYPE.values()) >= {s.dtype for s in program.signature.tensors}
    return Workload(uri or content_uri(program.leir, params), program, module, origin, params, ranges, preset)
