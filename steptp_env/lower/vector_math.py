"""float32 exp, log and erf as plain TIR arithmetic, so that LLVM can vectorise the loops that use them.

TVM lowers `tirx.exp` on the CPU to LLVM's `llvm.exp.f32`, which becomes one call to libm's `expf` per
element: a `V^{16}` loop over exp compiled to 16 scalar calls with shuffles around them
(../shared/notes/performance.md). The functions here compute the same values from floor, multiply-add,
integer shifts and bit reinterpretation, all of which have vector instructions, and choose between
branches with `Select` (both sides computed, no control flow), so a loop over them vectorises like a
loop over additions.

Accuracy (tests/test_vector_math.py, against NumPy's float64 results rounded to float32, on every
exponent range and the special values): exp and log within 2 ulp over their whole domains, erf within
3e-7 absolute and 3 ulp where |x| < 0.5. That is far inside the float32 floor of the verification
tolerance (1e-5 relative, measure/tolerance.py). Special values follow IEEE/libm: exp(+inf)=inf,
exp(-inf)=0, log(0)=-inf, log(x<0)=NaN, log(inf)=inf, erf(+-inf)=+-1, NaN in gives NaN out; results
that fall into the subnormal range are computed, not flushed.

The method is the textbook one (Cody and Waite range reduction, polynomial on the reduced argument,
scaling by a power of two built in the exponent bits); the polynomial coefficients of exp and log are
the published Cephes single-precision ones, erf uses its Maclaurin series near zero and the Chebyshev
fit of erfc (fractional error below 1.2e-7) elsewhere.
"""
from __future__ import annotations

import math

import tvm
from tvm import tirx
from tvm.ir.expr import Expr as PrimExpr

FUNCTIONS = ("exp", "log", "erf")
ELEMENTWISE_BUILTINS = ("tirx.reinterpret", "tirx.isnan")
"""Builtins the forms below use that TVM 0.27 does not mark `TVectorizable`. Its VectorizeLoop pass turns a
`T.vectorized` loop holding any call without that mark into a serial loop, which LLVM's loop vectoriser then
takes at its preferred width for the target (8 float lanes, 256-bit registers, on Intel cores tuned
`prefer-256-bit`), so a `V^{16}` loop over exp ran as two 8-lane halves with scalar `floor`. Both are pure and
elementwise, and TVM's LLVM code generator emits them for vectors (a bitcast, an unordered compare), so they
are marked here, once per process, unless TVM marks them itself."""
MAX_NESTED = 3
"""A call is expanded only when fewer than this many expanded calls are nested in its argument; deeper ones
keep libm. TVM's code generator substitutes every `Let` value into the expressions that use it while it
simplifies them, so each expanded level multiplies the size of the levels inside it: `mish(mish(x))` (six
levels) did not finish building; three levels build in seconds (a V^{16} loop over mish, ~5 s) to about a
minute and a half (exp in log in erf, tests/test_vector_math.py), see `vector_call`."""

_LN2_HI = 0.693359375  # ln 2 split so that n * _LN2_HI is exact for the n that occur
_LN2_LO = -2.12194440e-4
_EXP_MAX = 88.72283905206835  # above it expf overflows
_EXP_MIN = -104.0  # below it expf rounds to 0 (the smallest subnormal is exp(-103.28))
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
             5.0000001201e-1)
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
             -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
_ERFC_POLY = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
              0.37409196, 1.00002368, -1.26551223)
_ERF_SMALL = 0.5  # below it erf's series, above it 1 - erfc
_ERF_SATURATED = 4.0  # erf(4) = 1 - 1.5e-8 rounds to 1 in float32, and so does erf of anything larger
_ERF_SERIES = tuple(2 / math.sqrt(math.pi) * (-1) ** k / (math.factorial(k) * (2 * k + 1)) for k in range(7))


def _mark_vectorizable() -> None:
    for name in ELEMENTWISE_BUILTINS:
        if tvm.ir.Op.get(name).get_attr("TVectorizable") is None:
            tvm.ir.register_op_attr(name, "TVectorizable", True)


_mark_vectorizable()


def _f(value: float) -> PrimExpr:
    return tirx.FloatImm("float32", value)


def _i(value: int) -> PrimExpr:
    return tirx.IntImm("int32", value)


class _Lets:
    """Names for values used more than once. TIR expressions are trees: a value written twice is computed
    twice, and nested calls (`log(1+exp(x))` inside `tanh`) multiply the copies until LLVM spends minutes
    on one kernel. Each bound value becomes a `Let`, computed once."""

    def __init__(self, short_chains: bool) -> None:
        self.bindings: list[tuple[tirx.Var, PrimExpr]] = []
        self.short_chains = short_chains

    def __call__(self, name: str, value: PrimExpr) -> PrimExpr:
        if isinstance(value, (tirx.Var, tirx.FloatImm, tirx.IntImm)):
            return value
        var = tirx.Var(name, str(value.ty.dtype))
        self.bindings.append((var, value))
        return var

    def wrap(self, body: PrimExpr) -> PrimExpr:
        for var, value in reversed(self.bindings):
            body = tirx.Let(var, value, body)
        return body

    def polynomial(self, x: PrimExpr, coefficients: tuple[float, ...]) -> PrimExpr:
        """c0*x^(k-1) + ... + c(k-1): by Estrin's scheme where the form may have short chains, else Horner's."""
        return _estrin(self, x, coefficients) if self.short_chains else _horner(x, coefficients)


def _horner(x: PrimExpr, coefficients: tuple[float, ...]) -> PrimExpr:
    """c0*x^(k-1) + ... + c(k-1), highest power first, one multiply-add after the other (the rounding that
    keeps erf's series within 3 ulp near 0)."""
    result = _f(coefficients[0])
    for c in coefficients[1:]:
        result = result * x + _f(c)
    return result


def _estrin(lets: _Lets, x: PrimExpr, coefficients: tuple[float, ...]) -> PrimExpr:
    """The polynomial of `_horner` evaluated pairwise (Estrin's scheme): (c(k-1) + c(k-2) x) + (...) x^2, and
    so on with x^4, x^8: Horner's k-1 dependent multiply-adds become about log2(k) levels. In a vector loop
    over erf the dependency chain, not the number of operations, set the time (the core's out-of-order
    window holds about two iterations of a chain that long). It reads x and its powers more often than
    Horner's, which matters where calls nest (see `vector_call`)."""
    terms = [_f(c) for c in reversed(coefficients)]  # lowest power first
    power = x
    while len(terms) > 1:
        paired = [terms[i] + terms[i + 1] * power for i in range(0, len(terms) - 1, 2)]
        terms = paired + terms[len(paired) * 2:]
        if len(terms) > 1:
            power = lets("power", power * power)
    return terms[0]


def _times_power_of_two(lets: _Lets, x: PrimExpr, n: PrimExpr) -> PrimExpr:
    """x * 2**n for int32 n in [-252, 254], by two factors that are each a normal float32, applied one after
    the other (2**128 alone would overflow where x * 2**128 does not)."""
    half = lets("half", tirx.shift_right(n, _i(1)))
    first = tirx.reinterpret("float32", tirx.shift_left(half + _i(127), _i(23)))
    second = tirx.reinterpret("float32", tirx.shift_left(n - half + _i(127), _i(23)))
    return x * first * second


def _exp_in_range(lets: _Lets, x: PrimExpr, normal_result: bool) -> PrimExpr:
    """exp(x) for x in [_EXP_MIN, _EXP_MAX]: x = n ln2 + r with |r| <= ln2/2, exp(r) by a polynomial, times
    2**n. Where the caller knows the result is a normal float32 (2**n itself normal), one scaling factor."""
    n = lets("n", tirx.floor(x * _f(1 / math.log(2)) + _f(0.5)))
    r = lets("r", x - n * _f(_LN2_HI) - n * _f(_LN2_LO))
    poly = lets.polynomial(r, _EXP_POLY) * (r * r) + r + _f(1.0)
    ni = lets("ni", tirx.Cast("int32", n))
    if normal_result:
        return poly * tirx.reinterpret("float32", tirx.shift_left(ni + _i(127), _i(23)))
    return _times_power_of_two(lets, poly, ni)


def exp_f32(x: PrimExpr, short_chains: bool = True) -> PrimExpr:
    """exp(x) for float32 x, with IEEE special values; see `_exp_in_range`."""
    lets = _Lets(short_chains)
    x = lets("x", x)
    clamped = lets("clamped", tirx.min(tirx.max(x, _f(_EXP_MIN)), _f(_EXP_MAX)))
    value = _exp_in_range(lets, clamped, normal_result=False)
    value = tirx.Select(x > _f(_EXP_MAX), _f(math.inf), value)
    return lets.wrap(tirx.Select(tirx.isnan(x), x, value))


def log_f32(x: PrimExpr, short_chains: bool = True) -> PrimExpr:
    """log(x) for float32 x: x = m 2**e with m in [sqrt(1/2), sqrt(2)), log(1 + f) by a polynomial in f = m-1,
    plus e ln2. Subnormal x are scaled by 2**23 first."""
    lets = _Lets(short_chains)
    x = lets("x", x)
    subnormal = x < _f(1.1754943508222875e-38)  # conditions stay inline: a Let of a boolean vector fails to build
    bits = lets("bits", tirx.reinterpret("int32", tirx.Select(subnormal, x * _f(8388608.0), x)))
    exponent = tirx.bitwise_and(tirx.shift_right(bits, _i(23)), _i(0xFF)) - _i(126)
    exponent = exponent - tirx.Select(subnormal, _i(23), _i(0))
    mantissa = lets("m", tirx.reinterpret("float32", tirx.bitwise_or(tirx.bitwise_and(bits, _i(0x007FFFFF)),
                                                                      _i(0x3F000000))))
    below = mantissa < _f(math.sqrt(0.5))
    e = lets("e", tirx.Cast("float32", exponent - tirx.Select(below, _i(1), _i(0))))
    f = lets("f", tirx.Select(below, mantissa + mantissa - _f(1.0), mantissa - _f(1.0)))
    z = lets("z", f * f)
    y = lets.polynomial(f, _LOG_POLY) * f * z + e * _f(_LN2_LO) - _f(0.5) * z
    value = f + y + e * _f(_LN2_HI)
    value = tirx.Select(x == _f(0.0), _f(-math.inf), value)
    value = tirx.Select(x < _f(0.0), _f(math.nan), value)
    value = tirx.Select(x == _f(math.inf), x, value)
    return lets.wrap(tirx.Select(tirx.isnan(x), x, value))


def erf_f32(x: PrimExpr, short_chains: bool = True) -> PrimExpr:
    """erf(x) for float32 x: the odd Maclaurin series where |x| < 0.5 (relative accuracy near 0), else
    sign(x) (1 - erfc z) with erfc(z) = t exp(-z^2 + P(t)), t = 1/(1 + z/2), z = min(|x|, _ERF_SATURATED).
    The clamp keeps exp's argument in [-18, -1], so its result is normal and needs no special values."""
    lets = _Lets(short_chains)
    x = lets("x", x)
    z = lets("z", tirx.min(tirx.abs(x), _f(_ERF_SATURATED)))
    series = x * _horner(lets("x2", x * x), _ERF_SERIES[::-1])
    t = lets("t", _f(1.0) / (_f(1.0) + _f(0.5) * z))
    erfc = t * _exp_in_range(lets, lets.polynomial(t, _ERFC_POLY) - z * z, normal_result=True)
    tail = lets("tail", _f(1.0) - erfc)
    value = tirx.Select(z < _f(_ERF_SMALL), series, tirx.Select(x < _f(0.0), -tail, tail))
    return lets.wrap(tirx.Select(tirx.isnan(x), x, value))


def vector_call(func: str, x: PrimExpr, short_chains: bool = True) -> PrimExpr:
    """The vectorisable form of `func` (one of FUNCTIONS) applied to float32 `x`. `short_chains` (Estrin's
    polynomials) for a call that neither holds nor sits inside another expanded call: TVM's LLVM code
    generator binds every `Let` in its arithmetic analyzer, which simplifies each bound value with the
    earlier ones substituted, so a form's cost to build grows with how often it reads its argument, and
    nested forms multiply (erf(erf(x)) built in 27 s with Estrin's forms at both levels, 5.6 s with
    Horner's)."""
    return {"exp": exp_f32, "log": log_f32, "erf": erf_f32}[func](x, short_chains)
