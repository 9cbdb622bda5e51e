"""The MetaSchedule baseline (steptp_env/measure/metaschedule.py): it tunes a program's lowered TIR with real
builds and runs, and the kernel it returns computes what the program computes."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from steptp_env import Program, build
from steptp_env.measure import measure, random_inputs
from steptp_env.measure.metaschedule import meta_schedule, tune, tune_library

MATMUL = ("L^{32}_{a=0}L^{32}_{c=0}L^{32}_{d=0}[D^{f32,g}_{a,c}=D^{f32,g}_{a,c}+A^{f32,g}_{a,d}*C^{f32,g}_{d,c};];",
          [{"name": "A", "shape": [32, 32], "dtype": "float32"}, {"name": "C", "shape": [32, 32], "dtype": "float32"},
           {"name": "D", "shape": [32, 32], "dtype": "float32", "role": "output"}])


def test_meta_schedule_loads_without_every_targets_intrinsics():
    meta_schedule()
    assert "tvm.s_tir.tensor_intrin.cuda" not in sys.modules  # registering those takes tens of seconds


def test_tuned_kernel_computes_the_program(tmp_path):
    program = Program.parse(*MATMUL)
    tuned = tune(program, trials=4, threads=1, work_dir=tmp_path / "ms")
    assert tuned.trials == 4 and tuned.tuning_s > 0
    assert (tmp_path / "ms").is_dir()  # MetaSchedule's database and logs stay in the caller's folder
    inputs = random_inputs(program, 0)
    expected = build(program)(inputs)["D"]
    np.testing.assert_allclose(tuned.kernel(inputs)["D"], expected, rtol=1e-5, atol=1e-5)
    assert len(tuned.kernel.time(inputs, number=1, repeat=2)) == 2
    # a tuned schedule, not the untuned module: MetaSchedule split the loops
    assert tuned.kernel.module.script().count("for ") > 3


def test_a_tuned_library_is_verified_and_timed_in_the_measurement_worker(tmp_path):
    """`tune_library` tunes in a process of its own and exports the kernel; `measure(library=)` loads it
    in the worker, verifies it against the program's reference and times it. A library that computes
    something else fails verification."""
    program = Program.parse(*MATMUL)
    library = tmp_path / "ms.so"
    tuned = tune_library(program, library, trials=4, threads=1)
    assert tuned["trials"] == 4 and tuned["tuning_s"] > 0 and library.stat().st_size > 0
    m = measure(program, program, library=str(library))
    assert m.ok and m.verify.equivalent and m.median_s > 0, m.error
    doubled = Program.parse(MATMUL[0].replace("A^{f32,g}_{a,d}*C", "2*A^{f32,g}_{a,d}*C"), MATMUL[1])
    build(doubled).executable.export_library(str(tmp_path / "doubled.so"))
    wrong = measure(program, program, library=str(tmp_path / "doubled.so"))
    assert not wrong.ok and "not equivalent" in wrong.error
    with pytest.raises(ValueError, match="prebuilt library"):
        measure(program, program, remote="rpc://127.0.0.1:9190/cpu", library=str(library))
