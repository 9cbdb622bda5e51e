"""The workload suite: every workload converts at every preset, verifies against PyTorch at `tiny`, has
sizes in its preset's band, is deterministic; the lookup API and the `steptp workloads` commands."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from typer.testing import CliRunner

from steptp_env import StepTPError, verify
from steptp_env.cli import app
from steptp_env.ir.analysis import loop_iterations
from steptp_env.workloads import PRESETS, UnknownWorkloadError, get_workload, list_workloads, spec

URIS = list_workloads()
runner = CliRunner()

# Workloads whose tiny program does not match PyTorch because of a frontend handler (not the suite):
# uri -> reason. Kept empty when every handler is right.
KNOWN_WRONG: dict[str, str] = {}


@functools.lru_cache(maxsize=None)
def tiny(uri: str):
    return get_workload(uri, "tiny")


def _convert(uri: str, preset: str):
    return tiny(uri) if preset == "tiny" else get_workload(uri, preset)


# -- (a) + (c): every workload converts at every preset, within its preset's size band ----------------------
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("uri", URIS)
def test_converts_at_every_preset(uri, preset):
    wl = _convert(uri, preset)
    assert wl.uri == uri and wl.preset == preset
    assert wl.program.signature.outputs, uri
    iterations = loop_iterations(wl.program.nests)
    if preset == "tiny":
        assert iterations <= 1e5, f"{uri} tiny has {iterations:,} loop iterations"
    elif preset == "small":
        assert 1e6 <= iterations <= 3e7, f"{uri} small has {iterations:,} loop iterations"
    else:
        assert iterations >= loop_iterations(tiny(uri).program.nests)


# -- (b): at tiny every workload lowers, builds and matches PyTorch ------------------------------------------
@pytest.mark.parametrize("uri", [pytest.param(u, marks=pytest.mark.xfail(reason=KNOWN_WRONG[u], strict=True))
                                 if u in KNOWN_WRONG else u for u in URIS])
def test_tiny_verifies_against_pytorch(uri):
    wl = tiny(uri)
    report = verify(wl.program, wl)
    assert report.equivalent, f"{uri}: {report.reason}"


# -- (c): counts -------------------------------------------------------------------------------------------
def test_suite_size_and_names():
    level1 = [u for u in URIS if u.startswith("level1/")]
    level2 = [u for u in URIS if u.startswith("level2/")]
    assert len(level1) >= 80 and len(level2) >= 60, (len(level1), len(level2))
    assert len(level1) + len(level2) == len(URIS)
    for uri in URIS:
        name = uri.split("/", 1)[1]
        assert name == name.lower() and name.replace("_", "").isalnum(), uri
        assert set(spec(uri).presets) == set(PRESETS)
    families = {spec(u).family for u in URIS}
    assert {"matmul", "activation", "softmax", "normalization", "pooling", "reduction", "conv", "scan", "loss",
            "attention", "gemm_chain", "conv2d_chain", "conv3d_chain"} <= families


# -- (d): determinism, inputs with domains, dtypes, lookup errors, filters --------------------------------------
def test_same_uri_gives_same_program_and_parameters():
    for uri in ("level2/gemm_group_norm_hardtanh", "level1/conv_depthwise_separable_2d", "level2/gqa_gemm_relu"):
        a, b = get_workload(uri, "tiny"), get_workload(uri, "tiny")
        assert a.program.leir == b.program.leir
        assert a.params.keys() == b.params.keys() and a.params
        for name in a.params:
            np.testing.assert_array_equal(a.params[name], b.params[name])
        for name, value in a.make_inputs(3).items():
            np.testing.assert_array_equal(value, b.make_inputs(3)[name])
    # different URIs with the same module family and sizes draw different parameters
    x, y = get_workload("level2/gemm_relu_divide", "tiny"), get_workload("level2/gemm_add_relu", "tiny")
    assert not np.array_equal(x.params[next(iter(x.params))], y.params[next(iter(y.params))])


def test_inputs_with_a_domain():
    ce = tiny("level1/cross_entropy_loss")
    labels = [s for s in ce.program.signature.inputs if s.dtype == "int64"]
    assert len(labels) == 1
    classes = ce.program.signature.inputs[0].shape[1]
    for seed in range(3):
        drawn = ce.make_inputs(seed)[labels[0].name]
        assert drawn.min() >= 0 and drawn.max() <= classes - 1
    masked = tiny("level1/cumsum_masked")
    assert any(s.dtype == "bool" for s in masked.program.signature.inputs)
    for uri in ("level2/log_log", "level2/sqrt_sqrt", "level1/kl_div_loss"):
        wl = tiny(uri)
        for spec_ in wl.program.signature.inputs:
            if wl.origin[spec_.name][0] == "input":
                assert wl.make_inputs(0)[spec_.name].min() > 0, uri


def test_dtypes():
    wl = get_workload("level1/softmax", "tiny", dtype="float64")
    assert "f64" in wl.program.leir and "f32" not in wl.program.leir
    assert verify(wl.program, wl).equivalent
    half = get_workload("level2/gemm_relu_divide", "tiny", dtype="float16")
    assert all(s.dtype == "float16" for s in half.program.signature.tensors)


def test_unknown_uri_lists_close_matches():
    with pytest.raises(UnknownWorkloadError, match="close matches: .*level1/softmax") as info:
        get_workload("level1/sofmax")
    assert isinstance(info.value, StepTPError)
    with pytest.raises(StepTPError, match="level2/gemm_relu_divide"):
        get_workload("gemm_relu_divid")
    with pytest.raises(StepTPError, match="unknown preset 'huge'"):
        get_workload("level1/softmax", preset="huge")


def test_list_workloads_filter():
    convs = list_workloads("level1/*conv*")
    assert convs == sorted(convs) and len(convs) >= 15
    assert all(u.startswith("level1/") and "conv" in u for u in convs)
    assert "level1/conv_transposed_2d" in convs
    assert list_workloads("level2/m?a") == ["level2/mha", "level2/mqa"]
    assert list_workloads("level9/*") == []
    assert list_workloads("softmax") == [u for u in URIS if "softmax" in u]


# -- (e): the CLI ------------------------------------------------------------------------------------------------
def test_cli_list_and_show():
    listed = runner.invoke(app, ["workloads", "list", "level1/*pool*"])
    assert listed.exit_code == 0, listed.stdout
    assert "level1/max_pool_2d" in listed.stdout and "pooling" in listed.stdout
    assert "level1/relu" not in listed.stdout
    everything = runner.invoke(app, ["workloads", "list"])
    assert everything.exit_code == 0 and f"{len(URIS)} workload(s)" in everything.stdout
    shown = runner.invoke(app, ["workloads", "show", "level2/gemm_relu_divide", "--preset", "tiny"])
    assert shown.exit_code == 0, shown.stdout
    assert tiny("level2/gemm_relu_divide").program.leir in shown.stdout
    assert "signature" in shown.stdout and "linear.weight" in shown.stdout
    assert "nests: 4" in shown.stdout and "loop iterations" in shown.stdout and "LEIR chars" in shown.stdout


def test_cli_list_for_scripts():
    """`--plain` and `--json` give whole URIs whatever the terminal width (the table truncates at 80
    columns), and refuse to be combined."""
    import json

    plain = runner.invoke(app, ["workloads", "list", "level1/*conv*", "--plain"])
    assert plain.exit_code == 0 and plain.stdout.splitlines() == list_workloads("level1/*conv*")
    listed = runner.invoke(app, ["workloads", "list", "level2/m?a", "--json"])
    assert listed.exit_code == 0
    assert json.loads(listed.stdout) == [{"uri": uri, "level": spec(uri).level, "family": spec(uri).family}
                                         for uri in ("level2/mha", "level2/mqa")]
    both = runner.invoke(app, ["workloads", "list", "--json", "--plain"])
    assert both.exit_code == 2 and "exclude each other" in both.stdout


def test_cli_unknown_uri_is_a_clean_error():
    result = runner.invoke(app, ["workloads", "show", "level2/gemm_relu_divid"])
    assert result.exit_code == 2
    assert "unknown workload" in result.stdout and "level2/gemm_relu_divide" in result.stdout
    assert "Traceback" not in result.stdout
