"""A few built-in LEIR programs with NumPy references: the demo's workload until the model suite exists."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Example:
    name: str
    leir: str
    signature: list[dict]
    reference: Callable[[dict[str, np.ndarray]], np.ndarray]


def _spec(name: str, shape: list[int], role: str = "input") -> dict:
    return {"name": name, "shape": shape, "dtype": "float32", "role": role}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    out = np.zeros((w.shape[0], x.shape[1], x.shape[2]), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("oc,chw->ohw", w[:, :, i, j], padded[:, i:i + x.shape[1], j:j + x.shape[2]])
    return out


def _layernorm(x: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5)


EXAMPLES = [
    Example("matmul 128^3",
            "L^{128}_{a=0}L^{128}_{c=0}L^{128}_{d=0}[C^{f32,g}_{a,c}=C^{f32,g}_{a,c}+A^{f32,g}_{a,d}*B^{f32,g}_{d,c};];",
            [_spec("A", [128, 128]), _spec("B", [128, 128]), _spec("C", [128, 128], "output")],
            lambda t: t["A"].astype(np.float64) @ t["B"]),
    Example("softmax 64x512",
            "L^{64}_{a=0}L^{512}_{c=0}[D^{f32,g}_{a}=max(D^{f32,g}_{a},A^{f32,g}_{a,c});];"
            "L^{64}_{a=0}L^{512}_{c=0}[E^{f32,g}_{a}=E^{f32,g}_{a}+exp(A^{f32,g}_{a,c}-D^{f32,g}_{a});];"
            "L^{64}_{a=0}L^{512}_{c=0}[C^{f32,g}_{a,c}=exp(A^{f32,g}_{a,c}-D^{f32,g}_{a})/E^{f32,g}_{a};];",
            [_spec("A", [64, 512]), _spec("C", [64, 512], "output")],
            lambda t: _softmax(t["A"].astype(np.float64))),
    Example("conv2d 16ch 32x32 k3",
            "L^{16}_{a=0}L^{34}_{c=0}L^{34}_{d=0}[E^{f32,g}_{a,c,d}=if_then_else(1<=c<33&1<=d<33,"
            "A^{f32,g}_{a,c-1,d-1},0);];L^{16}_{a=0}L^{32}_{c=0}L^{32}_{d=0}L^{16}_{f=0}L^{3}_{g=0}L^{3}_{h=0}"
            "[C^{f32,g}_{a,c,d}=C^{f32,g}_{a,c,d}+E^{f32,g}_{f,c+g,d+h}*D^{f32,g}_{a,f,g,h};];",
            [_spec("A", [16, 32, 32]), _spec("D", [16, 16, 3, 3]), _spec("C", [16, 32, 32], "output")],
            lambda t: _conv(t["A"].astype(np.float64), t["D"].astype(np.float64))),
    Example("layernorm 128x256",
            "L^{128}_{a=0}L^{256}_{c=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+A^{f32,g}_{a,c};];"
            "L^{128}_{a=0}[E^{f32,g}_{a}=D^{f32,g}_{a}/256;];"
            "L^{128}_{a=0}L^{256}_{c=0}[F^{f32,g}_{a}=F^{f32,g}_{a}+(A^{f32,g}_{a,c}-E^{f32,g}_{a})**2;];"
            "L^{128}_{a=0}L^{256}_{c=0}[C^{f32,g}_{a,c}=(A^{f32,g}_{a,c}-E^{f32,g}_{a})/sqrt(F^{f32,g}_{a}/256+1e-05);];",
            [_spec("A", [128, 256]), _spec("C", [128, 256], "output")],
            lambda t: _layernorm(t["A"].astype(np.float64))),
    Example("cumsum 32x1024",
            "L^{32}_{a=0}L^{1024}_{c=0}[C^{f32,g}_{a,c}=if_then_else(c-1<0,0,C^{f32,g}_{a,c-1})+A^{f32,g}_{a,c};];",
            [_spec("A", [32, 1024]), _spec("C", [32, 1024], "output")],
            lambda t: np.cumsum(t["A"].astype(np.float64), axis=1)),
]
