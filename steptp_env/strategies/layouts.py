"""Layout strategies: how a tensor's elements are ordered in memory.

layout_transformation    copy a tensor read by a nest into a new tensor with another layout
set_storage_layout       change the layout of an intermediate in place (every access re-indexed)

A layout is a list of groups, one per dimension of the new tensor: `k` keeps old dimension k, `[k1,k2]`
merges old dimensions into one row-major dimension (k1 slowest), `[k,div,f]` and `[k,mod,f]` split old
dimension k into `i//f` and `i%f`. `[1,0]` transposes a matrix, `[[1,0]]` stores it flattened column-major,
`[[0,div,4],[0,mod,4],1]` splits its rows into blocks of four. A copy (layout_transformation, not
set_storage_layout) may also pad: `[k,pad,P]` keeps dimension k but stores it with extent P, zeros after the
elements read, so that a sum reduction along k can run to P (a multiple of the vector width; see
`padding.py`). `[0,[1,pad,208]]` pads the 197 columns of a GEMM's left operand to 208.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import IllegalActionError
from ..ir.analysis import scans, writes
from ..ir.ast import Access, BinOp, Const, Equation, Expr, Loop, Nest, Var, all_loops, equations, free_vars
from ..ir.program import Program
from .base import Action, Strategy, register
from .memory import (_applies, _bind_first, _check_intermediate, _check_tensor_name, _copy_source, _extent_of, _fail,
                     _is_gpu, _iterations, _map_accesses, _read_site, _rebuild, _shape, _Site, _site_binding, _sites,
                     _staging_loops, _substitute, _text, _vars_of)
from .padding import extend_reduction, pad_extent, pad_fill, padding_zeros, zero_from
from .util import factor_menu, fresh_loop_var, fresh_tensor, nest_at


def _needs_site(layout: tuple) -> bool:
    """Whether a layout splits or pads: its copy needs a plain loop variable subscript, so only applying it
    tells whether it is legal at a site."""
    return any(isinstance(group, tuple) and len(group) == 3 and group[1] in ("div", "mod", "pad")
               for group in layout)


def _layout_parses(layout, shape: tuple[int, ...]) -> bool:
    try:
        _parse_layout(layout, shape, padding=True)
    except IllegalActionError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Group:
    """One dimension of a new layout: old dimensions merged row-major, one part of a split dimension, or one
    dimension padded to extent `factor`."""

    dims: tuple[int, ...]
    split: str = ""  # "", "div", "mod" or "pad"
    factor: int = 0


def _parse_layout(layout, shape: tuple[int, ...], padding: bool = False) -> list[_Group]:
    """Check a layout against a tensor shape: every old dimension used exactly once (a split dimension by
    one div and one mod part with the same factor, which must divide it; a padded one, where `padding`
    allows it, by one pad group to a larger extent, in a layout that splits nothing), and not the identity."""
    if not isinstance(layout, tuple) or not layout:
        _fail(f"layout must be a non-empty list of groups, got {layout!r}")
    groups = [_parse_group(item, len(shape)) for item in layout]
    pads = [g for g in groups if g.split == "pad"]
    for group in pads:
        if not padding:
            _fail("a layout changed in place cannot pad: the shape is what the accesses reach (pad a copy "
                  "with layout_transformation)")
        if group.factor <= shape[group.dims[0]]:
            _fail(f"padding dimension {group.dims[0]} of extent {shape[group.dims[0]]} to {group.factor} "
                  "does not enlarge it")
    plain = [d for g in groups if g.split in ("", "pad") for d in g.dims]
    parts = [(g.dims[0], g.split, g.factor) for g in groups if g.split in ("div", "mod")]
    if pads and parts:
        _fail("a layout either splits or pads dimensions, not both")
    for dim, kind, factor in parts:
        partner = "mod" if kind == "div" else "div"
        if (dim, partner, factor) not in parts or parts.count((dim, kind, factor)) > 1:
            _fail(f"dimension {dim} needs exactly one div and one mod part with the same factor")
        if not 1 < factor < shape[dim] or shape[dim] % factor:
            _fail(f"split factor {factor} does not divide dimension {dim} of extent {shape[dim]} "
                  "into two proper parts")
    used = plain + sorted({dim for dim, _, _ in parts})
    if sorted(used) != list(range(len(shape))) or len(used) != len(set(used)):
        _fail(f"layout {_format_layout(layout)} must use each of the {len(shape)} dimensions exactly once")
    if not parts and not pads and all(len(g.dims) == 1 for g in groups) and plain == list(range(len(shape))):
        _fail("the layout is the current one")
    return groups


def _parse_group(item, rank: int) -> _Group:
    if isinstance(item, int):
        item = (item,)
    if not isinstance(item, tuple) or not item:
        _fail(f"a layout group must be a dimension or a list, got {item!r}")
    if len(item) == 3 and item[1] in ("div", "mod", "pad"):
        dim, kind, factor = item
        if not isinstance(dim, int) or not isinstance(factor, int):
            _fail(f"split or pad group {item!r} must be [dimension, div|mod|pad, extent]")
        group = _Group((dim,), kind, factor)
    elif all(isinstance(d, int) for d in item):
        group = _Group(tuple(item))
    else:
        _fail(f"layout group {item!r} is neither a list of dimensions nor [dimension, div|mod|pad, extent]")
    if any(not 0 <= d < rank for d in group.dims):
        _fail(f"layout group {item!r} names a dimension outside 0..{rank - 1}")
    return group


def _format_layout(layout) -> str:
    return Action.of("x", layout=layout).text[len("x(layout="):-1]


def _relayout(indices: tuple[Expr, ...], groups: list[_Group], shape: tuple[int, ...]) -> tuple[Expr, ...]:
    """The subscripts of the new layout for an access at `indices` of a tensor of `shape`."""
    out = []
    for group in groups:
        if group.split == "pad":
            out.append(indices[group.dims[0]])
            continue
        if group.split:
            op = "//" if group.split == "div" else "%"
            out.append(BinOp(op, indices[group.dims[0]], Const(group.factor)))
            continue
        expr = None
        for pos, dim in enumerate(group.dims):
            stride = math.prod(shape[d] for d in group.dims[pos + 1:])
            term = indices[dim] if stride == 1 else BinOp("*", indices[dim], Const(stride))
            expr = term if expr is None else BinOp("+", expr, term)
        out.append(expr)
    return tuple(out)


def _derive_layout(old: tuple[Expr, ...], new: tuple[Expr, ...]):
    """The layout that maps subscripts `old` to `new`, read off the loop variables of each new subscript;
    None when the old subscripts do not tell their dimensions apart."""
    dim_of: dict[str, int] = {}
    for dim, index in enumerate(old):
        for var in free_vars(index):
            if dim_of.setdefault(var, dim) != dim:
                return None
    layout = []
    for index in new:
        if isinstance(index, BinOp) and index.op in ("//", "%") and isinstance(index.rhs, Const):
            dims = {dim_of.get(v) for v in free_vars(index.lhs)}
            if len(dims) != 1 or None in dims:
                return None
            layout.append((dims.pop(), "div" if index.op == "//" else "mod", index.rhs.value))
            continue
        dims = []
        for var in free_vars(index):
            if var not in dim_of:
                return None
            if dim_of[var] not in dims:
                dims.append(dim_of[var])
        if not dims:
            return None
        layout.append(dims[0] if len(dims) == 1 else tuple(dims))
    return tuple(layout)


LANE_BLOCKS = (16, 8)
"""Block sizes of the blocked layouts the menu offers, first that divides: 16 float32 lanes fill an AVX-512
register, 8 an AVX2 one."""


def _layout_menu(shape: tuple[int, ...], loop_order: tuple[int, ...] | None = None,
                 lanes: int | None = None) -> list[tuple]:
    """A few layouts worth trying: the dimensions in loop order (so the innermost loop walks the last
    dimension), reversed, column-major flattened, the first dimension split in blocks, and, when dimension
    `lanes` is the one the innermost loop walks, blocked layouts that make it vector lanes: packed
    (`[[k,div,16],...,[k,mod,16]]`, the block index outermost: a GEMM's packed weights, each column block
    contiguous) and in place (`[...,[k,div,16],...,[k,mod,16]]`: NCHWc when k is the channels)."""
    rank = len(shape)
    menu: list[tuple] = []
    identity = tuple(range(rank))
    if loop_order is not None and loop_order != identity:
        menu.append(loop_order)
    if rank >= 2:
        menu.append(tuple(reversed(identity)))
        menu.append((tuple(reversed(identity)),))
    factors = factor_menu(shape[0]) if rank else []
    if factors:
        f = factors[len(factors) // 2]
        menu.append(((0, "div", f), (0, "mod", f)) + identity[1:])
    block = next((f for f in LANE_BLOCKS if lanes is not None and f < shape[lanes] and shape[lanes] % f == 0), None)
    if block is not None:
        others = tuple(d for d in identity if d != lanes)
        menu.append(((lanes, "div", block),) + others + ((lanes, "mod", block),))
        if lanes != rank - 1:
            menu.append(tuple((d, "div", block) if d == lanes else d for d in identity) + ((lanes, "mod", block),))
    unique = []
    for layout in menu:
        if layout not in unique:
            unique.append(layout)
    return unique


def _lanes_dimension(site: _Site) -> int | None:
    """The dimension whose subscript is the innermost loop's variable, alone (a blocked layout can make it
    vector lanes), or None."""
    if not site.loops:
        return None
    innermost = Var(site.loops[-1].var)
    return next((d for d, index in enumerate(site.access.indices) if index == innermost), None)


# ---------------------------------------------------------------------------------------------------------
# layout_transformation
# ---------------------------------------------------------------------------------------------------------


@register
class LayoutTransformation(Strategy):
    """Copy `tensor`, as read by nest `nest`, into a new tensor with layout `layout` (see the module
    docstring) and make the nest read the copy.

    The copy nest is placed just before the nest and covers the elements of the first read of `tensor`
    there; every read at the same subscripts is re-indexed into the copy. A split group copies over the
    split loop (`[k,div,f]`/`[k,mod,f]` need dimension k's subscript to be a plain loop variable whose
    extent f divides and which no other subscript uses). Preconditions: as for a read cache (the nest reads
    `tensor` and does not write it; the subscripts hold no index tensor and stay inside `tensor`); the
    layout uses every dimension once and is not the identity. The layout's dimensions are the extents the
    subscripts reach (the reference's strides), so the copy is one-to-one on the elements read.
    """

    name = "layout_transformation"
    params = ("nest", "tensor", "layout")
    nest_local = True

    def nest_context(self, program: Program, index: int) -> tuple:
        """The shapes of the tensors the nest accesses (a copy's legality depends on them) and where each
        holds padding zeros (a padded copy is not offered another pad)."""
        names = [n for n in dict.fromkeys(s.access.name for s in _sites(program.nests[index])) if n in program.tensors]
        zeros = padding_zeros(program, names)
        return tuple((name, program.tensors[name].shape, zeros[name]) for name in names)

    def nest_candidates(self, program: Program, n: int, target: str) -> list[Action]:
        found: list[Action] = []
        padded: list[Action] = []
        for tensor in dict.fromkeys(s.access.name for s in _sites(program.nests[n]) if not s.is_write):
            site, _ = _copy_source(program, n, tensor)
            if site is None or not site.access.indices:
                continue
            shape = _extent_of(site.access.indices, site.loops)
            menu = [self.action(nest=n, tensor=tensor, layout=layout)
                    for layout in _layout_menu(shape, _loop_order(site), _lanes_dimension(site))]
            # the site decides whether a permutation applies, so after the first one the others only
            # have to parse (applying each would rebuild and re-validate the whole program); a split or
            # padded layout also needs a plain subscript, so it is always applied
            if menu and _applies(self, program, menu[0]):
                found += [menu[0]] + [a for a in menu[1:] if (_applies(self, program, a) if _needs_site(a["layout"])
                                                              else _layout_parses(a["layout"], shape))]
            padded.extend(self.action(nest=n, tensor=tensor, layout=layout)
                          for layout in _pad_menu(program, program.nests[n], site, shape))
        # after every other layout of the nest, so that the earlier ranks keep their meaning
        return found + [a for a in padded if _applies(self, program, a)]

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        n, tensor, layout = action["nest"], action["tensor"], action["layout"]
        nest = nest_at(program, n)
        _check_tensor_name(tensor)
        site, reason = _copy_source(program, n, tensor)
        if site is None:
            _fail(reason)
        source = site.access
        if not source.indices:
            _fail(f"{tensor} is a scalar; it has no layout to change")
        shape = _extent_of(source.indices, site.loops)
        groups = _parse_layout(layout, shape, padding=True)
        copy_name = fresh_tensor(program)
        new_read = Access(copy_name, source.dtype, "g", _relayout(source.indices, groups, shape))
        copy = _layout_copy(nest, site, groups, shape, copy_name)
        staged = _map_accesses(nest, lambda a: new_read if a == source else a, _site_binding(site))
        result = _rebuild(program, list(program.nests[:n]) + [copy, staged] + list(program.nests[n + 1:]))
        return _extended(result, n, site, groups, shape)

    def infer(self, before: Program, after: Program) -> list[Action]:
        """Read the layout off the first re-indexed read in the nest after the new copy nest."""
        if len(after.nests) != len(before.nests) + 1:
            return []
        for n, nest in enumerate(before.nests):
            if after.nests[n] == nest:
                continue
            copy, staged = after.nests[n], after.nests[n + 1] if n + 1 < len(after.nests) else None
            if staged is None or len(writes(copy)) != 1:
                return []
            new_name = writes(copy)[0]
            for old, new in zip(_sites(nest), _sites(staged)):
                if new.access.name == new_name and old.access.name != new_name:
                    layout = _derive_layout(old.access.indices, new.access.indices)
                    if layout is None:
                        return []
                    reach = _extent_of(old.access.indices, old.loops)
                    stored = after.tensors[new_name].shape
                    if reach is not None and len(stored) == len(layout):  # a padded dimension is stored larger
                        layout = tuple((g, "pad", size) if isinstance(g, int) and size > reach[g] else g
                                       for g, size in zip(layout, stored))
                    return [self.action(nest=n, tensor=old.access.name, layout=layout)]
            return []
        return []

    def explain(self, before: Program, action: Action, after: Program) -> str:
        n, tensor, layout = action["nest"], action["tensor"], action["layout"]
        site = _read_site(before.nests[n], tensor)
        copy = after.nests[n]
        new_name = writes(copy)[0]
        new_read = next(s.access for s in _sites(after.nests[n + 1]) if s.access.name == new_name)
        shape = _shape(before, tensor)
        grown = [f"loop {l.var} from {o.extent} to {l.extent}" for l, o in zip(all_loops(after.nests[n + 1]),
                                                                              all_loops(before.nests[n]))
                 if l.extent != o.extent]
        padding = "" if not any(isinstance(g, tuple) and g[1:2] == ("pad",) for g in layout) else (
            " The padded positions hold zeros" + (f", so nest {n + 1} now runs its sum reduction {', '.join(grown)}: "
                                                  "the added terms are products of those zeros, exactly +0, and "
                                                  "leave every sum as it was; the loop's new extent has the "
                                                  "factors tiles and vector loops need." if grown else
                                                  "; once every tensor the reduction reads along the padded "
                                                  "dimension is padded the same way, its loop can run to the "
                                                  "padded extent."))
        return (f"Copied {tensor} ({'x'.join(map(str, shape))}) as read by nest {n} into {new_name} with layout "
                f"{_format_layout(layout)} ({'x'.join(map(str, after.tensors[new_name].shape))}): the new nest "
                f"{n} fills it in {_iterations(copy)} iteration(s) and nest {n + 1} reads {_text(new_read)} "
                f"where it read {_text(site.access)}. Legal because nest {n} does not write {tensor}, its "
                f"subscripts stay inside {tensor}, and the new subscripts are a one-to-one map of the old ones "
                f"(strides from the extents they reach). The copy costs one pass over the elements read; it "
                f"pays off when the new order makes the innermost loop of nest {n + 1} walk consecutive "
                f"addresses.{padding}")


def _loop_order(site: _Site) -> tuple[int, ...] | None:
    """The permutation of dimensions that sorts them by the position of the innermost loop variable of
    their subscripts (so the innermost loop walks the last dimension); None when some dimension has no
    loop variable."""
    position = {l.var: i for i, l in enumerate(site.loops)}
    keys = []
    for index in site.access.indices:
        places = [position[v] for v in free_vars(index) if v in position]
        if not places:
            return None
        keys.append(max(places))
    return tuple(sorted(range(len(keys)), key=lambda d: (keys[d], d)))


def _written_order(program: Program, tensor: str) -> tuple[int, ...] | None:
    """The loop order (`_loop_order`) of the first write of `tensor`: the layout in which the loops that
    write it walk it contiguously (a local accumulator whose vector loop runs over its second dimension
    stored with that dimension last)."""
    for nest in program.nests:
        for site in _sites(nest):
            if site.access.name == tensor and site.is_write:
                return _loop_order(site)
    return None


def _layout_copy(nest: Nest, site: _Site, groups: list[_Group], shape: tuple[int, ...], name: str) -> Nest:
    """The nest that fills the re-laid-out copy of the access at `site`. A split copies over the tensor's
    dimensions in order (the reference's form), with the split loop cut into an outer loop over the blocks
    and the old loop over the block. A padded dimension's loop runs to the padded extent, storing zeros past
    the elements read."""
    source = site.access
    split = next((g for g in groups if g.split in ("div", "mod")), None)
    target = _relayout(source.indices, groups, shape)
    if split is None:
        loops = _staging_loops(site.loops, _vars_of(source.indices))
        guards = [(_plain_var(source, g.dims[0], "padding").name, shape[g.dims[0]], g.factor)
                  for g in groups if g.split == "pad"]
        loops = [replace(l, extent=next((p for v, _, p in guards if v == l.var), l.extent)) for l in loops]
        value = pad_fill(source, [(v, e) for v, e, _ in guards]) if guards else source
        rename = _bind_first(loops, _is_gpu(nest))
        write = Access(name, source.dtype, "g", tuple(_substitute(t, rename) for t in target))
        return Nest(tuple(loops), (Equation(write, _substitute(value, rename)),))
    dim, factor = split.dims[0], split.factor
    var = _plain_var(source, dim, "splitting")
    extents = {l.var: l for l in site.loops}
    order = dict.fromkeys(v for index in source.indices for v in free_vars(index))
    loops = _staging_loops(tuple(extents[v] for v in order), set(order))
    pos = list(order).index(var.name)
    outer = fresh_loop_var(nest)
    loops[pos:pos + 1] = [Loop("L", loops[pos].extent // factor, outer), replace(loops[pos], extent=factor)]
    target = tuple(Var(outer) if g.split == "div" else var if g.split == "mod" else t for g, t in zip(groups, target))
    read = _substitute(source, {var.name: BinOp("+", BinOp("*", Var(outer), Const(factor)), var)})
    rename = _bind_first(loops, _is_gpu(nest))
    write = Access(name, source.dtype, "g", tuple(_substitute(t, rename) for t in target))
    return Nest(tuple(loops), (Equation(write, _substitute(read, rename)),))


def _plain_var(source: Access, dim: int, what: str) -> Var:
    """The loop variable that is subscript `dim` of `source` and appears in no other subscript."""
    var = source.indices[dim]
    if not isinstance(var, Var) or sum(var.name in free_vars(i) for i in source.indices) != 1:
        _fail(f"{what} dimension {dim} needs a plain loop variable subscript used nowhere else, "
              f"got {_text(var)}")
    return var


def _pad_menu(program: Program, nest: Nest, site: _Site, shape: tuple[int, ...]) -> list[tuple]:
    """Padded layouts for the dimensions whose subscript is a loop variable the site's equation reduces
    over (it does not index the written element), each to `pad_extent`, unless the tensor read is a padded
    copy already: the layouts that can let a sum reduction's loop run to a multiple of the vector width."""
    written = {v for s in _sites(nest) if s.is_write and s.loops == site.loops
               for index in s.access.indices for v in free_vars(index)}
    loops = {l.var for l in site.loops}
    menu = []
    for dim, index in enumerate(site.access.indices):
        padded = pad_extent(shape[dim])
        if (isinstance(index, Var) and index.name in loops and index.name not in written and padded is not None
                and zero_from(program, site.access.name, dim) is None):
            menu.append(tuple((d, "pad", padded) if d == dim else d for d in range(len(shape))))
    return menu


def _extended(program: Program, n: int, site: _Site, groups: list[_Group], shape: tuple[int, ...]) -> Program:
    """`program` (the copy at nest n, the reading nest at n + 1) with the reading nest's sum reductions run to
    the padded extent of each padded dimension where `extend_reduction` allows it."""
    for group in groups:
        if group.split != "pad":
            continue
        var = site.access.indices[group.dims[0]].name
        grown = extend_reduction(program, program.nests[n + 1], var, shape[group.dims[0]], group.factor)
        if grown is not None:
            program = _rebuild(program, list(program.nests[:n + 1]) + [grown] + list(program.nests[n + 2:]))
    return program


# ---------------------------------------------------------------------------------------------------------
# set_storage_layout
# ---------------------------------------------------------------------------------------------------------


@register
class SetStorageLayout(Strategy):
    """Store intermediate `tensor` in layout `layout` (see the module docstring): every write and read of it,
    in every nest, is re-indexed the same way, with strides from its inferred shape.

    Preconditions: `tensor` is an intermediate of rank >= 1 (the caller fixes the layout of signature
    tensors); no equation reads it at an element lagging its write (a prefix scan recognises its
    predecessor by the subscripts, which a merged or split layout would hide); the layout uses each
    dimension once and is not the identity. The map is one-to-one on the tensor's shape, so every read
    still finds the value written for it.
    """

    name = "set_storage_layout"
    params = ("tensor", "layout")

    def candidates(self, program: Program, target: str = "llvm") -> list[Action]:
        found, stored = [], []
        for name, info in program.intermediates.items():
            if info.shape and not _scanned(program, name):
                menu = _layout_menu(info.shape)
                found.extend(self.action(tensor=name, layout=layout) for layout in menu)
                order = _written_order(program, name)
                if order is not None and order != tuple(range(len(info.shape))) and order not in menu:
                    stored.append(self.action(tensor=name, layout=order))
        return found + stored  # after the fixed menus, so that their ranks keep their meaning

    def apply(self, program: Program, action: Action) -> Program:
        self.check(action)
        tensor, layout = _check_tensor_name(action["tensor"]), action["layout"]
        _check_intermediate(program, tensor)
        shape = _shape(program, tensor)
        if not shape:
            _fail(f"{tensor} is a scalar; it has no layout to change")
        if _scanned(program, tensor):
            _fail(f"{tensor} is a prefix scan (read at an element lagging its write); re-indexing would hide "
                  "the lag its first element relies on")
        groups = _parse_layout(layout, shape)

        def relayout(acc: Access) -> Access:
            return replace(acc, indices=_relayout(acc.indices, groups, shape)) if acc.name == tensor else acc

        return _rebuild(program, [_map_accesses(nest, relayout) for nest in program.nests])

    def infer(self, before: Program, after: Program) -> list[Action]:
        """Read the layout off the first access whose subscripts changed."""
        if len(after.nests) != len(before.nests):
            return []
        found = []
        for old_nest, new_nest in zip(before.nests, after.nests):
            for old, new in zip(_sites(old_nest), _sites(new_nest)):
                if old.access.name == new.access.name and old.access.indices != new.access.indices:
                    layout = _derive_layout(old.access.indices, new.access.indices)
                    action = self.action(tensor=old.access.name, layout=layout)
                    if layout is not None and action not in found:
                        found.append(action)
        return found[:3]

    def explain(self, before: Program, action: Action, after: Program) -> str:
        tensor, layout = action["tensor"], action["layout"]
        old_shape, new_shape = before.tensors[tensor].shape, after.tensors[tensor].shape
        count = sum(1 for nest in before.nests for s in _sites(nest) if s.access.name == tensor)
        example = next((o.access, n.access) for on, nn in zip(before.nests, after.nests)
                       for o, n in zip(_sites(on), _sites(nn)) if o.access.name == tensor)
        return (f"Stored the intermediate {tensor} in layout {_format_layout(layout)}: shape "
                f"{'x'.join(map(str, old_shape))} becomes {'x'.join(map(str, new_shape))}, and all {count} "
                f"accesses are re-indexed the same way ({_text(example[0])} becomes "
                f"{_text(example[1])}). Legal because {tensor} is not in the signature, is not a "
                f"prefix scan, and the new subscripts are a one-to-one map of the old ones within its shape. "
                f"No arithmetic changes; what changes is which accesses are consecutive in memory, which "
                f"decides cache-line and vector use of the loops that walk {tensor}.")


def _scanned(program: Program, tensor: str) -> bool:
    return any(s.tensor == tensor for nest in program.nests for loops, eq in equations(nest)
               for s in scans(loops, eq))


__all__ = ["LayoutTransformation", "SetStorageLayout"]
