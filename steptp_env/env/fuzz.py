"""Actions a bad policy or a confused LLM might send, for fuzzing an environment (or a wrapper of one):
`step` must turn every one of them into a penalty with `info["error"]`, never an exception."""
from __future__ import annotations

import json

import numpy as np

from .core import StepTPEnv


def bad_action(rng: np.random.Generator, env: StepTPEnv) -> object:
    """One malformed, out-of-range, inapplicable or wrongly typed action for `env`'s current program.
    (Programs that are valid LEIR but compute something else cost a build each; they are left to the
    callers that want them.)"""
    leir = env.program.leir
    choices = [
        lambda: int(rng.integers(-5, 0)), lambda: env.catalog.size + int(rng.integers(0, 9)), lambda: 2.5,
        lambda: None, lambda: "", lambda: "loop_split(", lambda: "loop_split(nest=99, loop=c, factor=2)",
        lambda: "loop_split(nest=0, loop=zz, factor=3)", lambda: "loop_split(nest=0, loop=a, factor=7)",
        lambda: "no_such_strategy(nest=0)", lambda: "cache_read_write(nest=0, tensor=NOPE, mode=read, scope=l)",
        lambda: "cache_read_write(nest=0, tensor=A, mode=read, scope=l, at=a)", lambda: "online_softmax(nest=0)",
        lambda: '{"transformed_IR": 3}', lambda: "{not json",
        lambda: json.dumps({"transformed_IR": leir.replace("[", "(", 1), "applied_strategy": "loop_split"}),
        lambda: json.dumps({"transformed_IR": leir.replace("}_{a,", "}_{", 1), "applied_strategy": "loop_split"}),
        lambda: json.dumps({"transformed_IR": leir.replace("A^", "Q^", 1), "applied_strategy": "x"}),
        lambda: "<think>hmm</think><answer>" + json.dumps({"transformed_IR": leir[:-3]}) + "</answer>",
        lambda: "".join(chr(int(c)) for c in rng.integers(32, 127, 40)),
    ]
    return choices[int(rng.integers(len(choices)))]()
