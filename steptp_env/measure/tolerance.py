"""The one place where numeric equivalence is defined.

Two results are equivalent when, element by element,

    |actual - expected| <= rtol * (|expected| + scale)

where `scale` is the mean magnitude of the expected tensor (so a value that cancels to nearly zero is
judged against the size of the numbers it came from), NaN sits exactly where NaN sits, and +-inf exactly
where the same infinity sits. Integer and bool outputs must be equal.

`rtol` has a floor per dtype and grows with the longest reduction in the programs compared, since
reassociating n terms changes a float sum by up to about n * eps relative to the sum of the magnitudes:

    rtol = max(FLOOR[dtype], 4 * eps * reduction_length)   (capped at 0.05)

The floors are 1e-10 (float64), 1e-5 (float32, about 84 eps), 2e-3 (float16) and 2e-2 (bfloat16). The
float64 floor is far above its eps because exact algebraic rewrites are not bitwise exact: the reference
corpus has a factorization (level2/29) whose result moves by 9.5e-13 relative through cancellation; it is
still 1,000 times tighter than torch.testing's float64 default (1e-7). Wrong programs (a misplaced
index, a missing initialisation, a term too many, a data race) miss by orders of magnitude more. The
reference implementation accepted a relative error of 5e-3 or an absolute error of 1e-7 or a mean squared
error of 1e-5, and once an error near 1e199.
"""
from __future__ import annotations

import numpy as np

EPS = {"float64": float(np.finfo(np.float64).eps), "float32": float(np.finfo(np.float32).eps),
       "float16": float(np.finfo(np.float16).eps), "bfloat16": 2.0 ** -7}
FLOOR = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}
MAX_RTOL = 0.05


def relative_tolerance(dtype: str, reduction_length: int) -> float:
    """The rtol for outputs of `dtype` when the longest reduction has `reduction_length` terms."""
    if dtype not in EPS:
        return 0.0
    return min(MAX_RTOL, max(FLOOR[dtype], 4 * EPS[dtype] * max(1, reduction_length)))
