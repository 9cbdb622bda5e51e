"""`from_torch`: a PyTorch module -> a verified-ready LEIR `Workload`.

The module is captured with `torch.export` (falling back to `torch.fx` symbolic tracing where export
fails) at the ATen level it produces by default (no decompositions: `aten.linear`, `aten.softmax`,
`aten.layer_norm` stay whole, which keeps the LEIR close to one nest family per PyTorch op). Every graph
node goes to the handler registered for its target in `HANDLERS`; a node without one raises
`UnsupportedOpError` and no partial program is ever returned.
"""
from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import sys
import tempfile
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ..errors import StepTPError
from .emit import Builder, Value

Handler = Callable[..., Any]
HANDLERS: dict[str, Handler] = {}


class UnsupportedOpError(StepTPError):
    """A PyTorch operation the frontend cannot translate; names the op, the graph node and the source."""

    def __init__(self, op: str, node: str = "", source: str = "", why: str = "") -> None:
        self.op, self.node, self.source = op, node, source
        detail = f": {why}" if why else ""
        where = f" at node {node!r}" if node else ""
        src = f" ({source})" if source else ""
        listed = (" (the supported ones: docs/supported_ops.md, or `python -m steptp_env.frontend.supported_ops`)"
                  if op.startswith("aten.") else "")
        super().__init__(f"unsupported op {op}{where}{src}{detail}{listed}")


def handles(*targets: str) -> Callable[[Handler], Handler]:
    """Register a handler for ATen targets given as text (`"aten.relu.default"`)."""

    def register(fn: Handler) -> Handler:
        for target in targets:
            HANDLERS[target] = fn
        return fn

    return register


def target_name(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    return str(target)


TORCH_TO_DTYPE = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
                  torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
                  torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}


def dtype_of(t: torch.Tensor) -> str:
    try:
        return TORCH_TO_DTYPE[t.dtype]
    except KeyError:
        raise UnsupportedOpError(f"tensor dtype {t.dtype}") from None


def _source_line(node: torch.fx.Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    lines = [l.strip() for l in trace.strip().splitlines() if l.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            return lines[i] + (f": {lines[i + 1]}" if i + 1 < len(lines) else "")
    return ""


def capture(module: torch.nn.Module, args: tuple) -> tuple[torch.fx.Graph, dict[str, str], dict[str, torch.Tensor]]:
    """(graph, node name -> 'input' or 'param:<qualified name>', tensors by qualified name).

    `torch.export` first; where it fails for a reason other than a data-dependent shape, `torch.fx`
    symbolic tracing followed by `make_fx`, which gives an ATen graph with parameters as attributes."""
    try:
        with _stderr_held_back():
            ep = torch.export.export(module, args)
    except Exception as exc:  # export raises many error types for data-dependent or untraceable code
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "data-dependent" in str(exc) or "DataDependent" in type(exc).__name__:
            raise UnsupportedOpError("data-dependent shape", why=message) from exc
        return _capture_with_fx(module, args, message)
    kinds: dict[str, str] = {}
    state: dict[str, torch.Tensor] = {}
    for spec in ep.graph_signature.input_specs:
        name = spec.arg.name
        if spec.kind.name == "USER_INPUT":
            kinds[name] = "input"
        else:
            kinds[name] = "param:" + str(spec.target)
            state[str(spec.target)] = (ep.state_dict.get(spec.target) if spec.target in ep.state_dict
                                       else ep.constants[spec.target])
    mutations = [s for s in ep.graph_signature.output_specs if s.kind.name in ("USER_INPUT_MUTATION",
                                                                                 "BUFFER_MUTATION")]
    if mutations:
        raise UnsupportedOpError("in-place mutation of an input", mutations[0].arg.name,
                                 why="the module writes one of its inputs or buffers")
    return ep.graph, kinds, state


@contextlib.contextmanager
def _stderr_held_back() -> Iterator[None]:
    """File descriptor 2 goes to a temporary file inside the block, and out to the real stderr after it only
    if the block did not raise: a failed `torch.export` (a guard on a data-dependent value) prints the
    graph around the guard there, tens of lines, before raising the error `capture` turns into one line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)  # reached only without an exception: pass export's warnings on
        sys.stderr.write(held.read().decode(errors="replace"))


def _capture_with_fx(module: torch.nn.Module, args: tuple, export_error: str):
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        gm = make_fx(torch.fx.symbolic_trace(module), tracing_mode="real")(*args)
    except Exception as exc:
        raise UnsupportedOpError("untraceable module", why=f"torch.export: {export_error}; torch.fx: {exc}") from exc
    owners = {t.data_ptr(): name for name, t in [*module.named_parameters(), *module.named_buffers()]}
    kinds: dict[str, str] = {}
    state: dict[str, torch.Tensor] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            kinds[node.name] = "input"
        elif node.op == "get_attr":
            tensor = getattr(gm, node.target)
            qualified = owners.get(tensor.data_ptr(), node.target)
            kinds[node.name] = "param:" + qualified
            state[qualified] = tensor
    return gm.graph, kinds, state


def convert_graph(graph: torch.fx.Graph, kinds: dict[str, str], state: dict[str, torch.Tensor],
                  args: Sequence[torch.Tensor]) -> tuple[Builder, list[Value], dict[str, tuple[str, Any]]]:
    """Translate every node; returns the builder, the output values, and for every signature input the
    pair (program tensor name -> ('input', position) or ('param', qualified name))."""
    b = Builder()
    env: dict[torch.fx.Node, Any] = {}
    origin: dict[str, tuple[str, Any]] = {}
    user_position = 0
    placeholders = [n for n in graph.nodes if n.op in ("placeholder", "get_attr")]
    # User inputs first, then parameters and buffers: the order of the program's parameters.
    for node in sorted(placeholders, key=lambda n: kinds[n.name] != "input"):
        kind = kinds[node.name]
        if kind == "input":
            tensor = args[[p for p in placeholders if kinds[p.name] == "input"].index(node)]
            if not isinstance(tensor, torch.Tensor):
                raise UnsupportedOpError("non-tensor input", node.name)
            value = b.input(tensor.shape, dtype_of(tensor), "input")
            origin[value.name] = ("input", user_position)
            user_position += 1
        else:
            tensor = state[kind.split(":", 1)[1]]
            value = b.input(tensor.shape, dtype_of(tensor), "param")
            origin[value.name] = ("param", kind.split(":", 1)[1])
        env[node] = value
    outputs: list[Value] = []
    for node in graph.nodes:
        if node.op == "call_function":
            env[node] = _call(b, node, env)
        elif node.op == "output":
            for item in torch.utils._pytree.tree_leaves(node.args[0]):
                value = env.get(item) if isinstance(item, torch.fx.Node) else None
                if not isinstance(value, Value):
                    raise UnsupportedOpError("non-tensor output", str(item))
                outputs.append(value)
        elif node.op not in ("placeholder", "get_attr"):
            raise UnsupportedOpError(node.op, node.name, _source_line(node))
    return b, outputs, origin


def _mutated_arg(node: torch.fx.Node) -> torch.fx.Node | None:
    """The argument an in-place ATen op (`add_`, `relu_`, ...) writes, if the node is one."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.is_mutable or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    return node.args[0]


def _check_static(node: torch.fx.Node) -> None:
    for val in torch.utils._pytree.tree_leaves(node.meta.get("val")):
        if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape):
            raise UnsupportedOpError("data-dependent shape", node.name, _source_line(node),
                                     f"{target_name(node.target)} produces shape {tuple(val.shape)}")


def _call(b: Builder, node: torch.fx.Node, env: dict) -> Any:
    name = target_name(node.target)
    _check_static(node)
    written = _mutated_arg(node)
    if written is not None and written.op == "placeholder":
        raise UnsupportedOpError("in-place mutation of an input", node.name, _source_line(node),
                                 f"{name} writes {written.name}")
    handler = HANDLERS.get(name)
    if handler is None:
        raise UnsupportedOpError(name, node.name, _source_line(node))

    def resolve(x):
        return env[x] if isinstance(x, torch.fx.Node) else x

    args = torch.fx.node.map_aggregate(node.args, resolve)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, resolve)
    try:
        result = handler(b, node, *args, **kwargs)
    except UnsupportedOpError as exc:
        if not exc.node:
            raise UnsupportedOpError(exc.op, node.name, _source_line(node), str(exc).split(": ", 1)[-1]) from exc
        raise
    if written is not None:
        env[written] = result  # later readers of the mutated tensor see the new value
    return result


def content_uri(program_leir: str, params: dict[str, np.ndarray]) -> str:
    """A URI for a workload without a suite name: a hash of its program and parameter values."""
    digest = hashlib.sha256(program_leir.encode())
    for name in sorted(params):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(params[name]).tobytes())
    return "torch/" + digest.hexdigest()[:16]
