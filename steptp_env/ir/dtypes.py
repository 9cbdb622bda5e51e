"""LEIR dtype codes and their full names (the names NumPy, TVM and the signature use)."""
from __future__ import annotations

CODE_TO_DTYPE = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8",
    "u64": "uint64", "u32": "uint32", "u16": "uint16", "u8": "uint8",
    "bool": "bool",
}
DTYPE_TO_CODE = {v: k for k, v in CODE_TO_DTYPE.items()}


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def dtype_bytes(dtype: str) -> int:
    """Bytes one element of `dtype` takes (`bool` 1)."""
    return 1 if dtype == "bool" else int("".join(c for c in dtype if c.isdigit()) or 8) // 8


def float_rank(dtype: str) -> int:
    """Orders float dtypes by width so that mixed expressions promote to the widest."""
    return {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}.get(dtype, 0)
