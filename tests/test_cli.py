"""The `steptp leir` commands on a reference row, a LEIR string with a signature, and bad input."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from steptp_env.cli import app

runner = CliRunner()
SIG = json.dumps([{"name": "A", "shape": [4, 8], "dtype": "float32", "role": "input"},
                  {"name": "C", "shape": [4], "dtype": "float32", "role": "output"}])
TEXT = "L^{4}_{a=0}L^{8}_{c=0}[C^{f32,g}_{a}=max(C^{f32,g}_{a},A^{f32,g}_{a,c});];"


def test_print_parse_lower_run_on_inline_text():
    printed = runner.invoke(app, ["leir", "print", TEXT, "-s", SIG])
    assert printed.exit_code == 0 and printed.stdout.strip() == TEXT
    parsed = runner.invoke(app, ["leir", "parse", TEXT, "-s", SIG])
    assert parsed.exit_code == 0 and "max over c" in parsed.stdout
    lowered = runner.invoke(app, ["leir", "lower", TEXT, "-s", SIG])
    # the reduction's identity is stored by its own block, before the c loop
    assert lowered.exit_code == 0 and "T.sblock" in lowered.stdout and "C_n0_init" in lowered.stdout
    cuda = runner.invoke(app, ["leir", "lower", TEXT, "-s", SIG, "--target", "cuda"])
    assert cuda.exit_code == 0 and "blockIdx.x" in cuda.stdout
    ran = runner.invoke(app, ["leir", "run", TEXT, "-s", SIG, "--repeat", "2"])
    assert ran.exit_code == 0 and "median" in ran.stdout and "(4,)" in ran.stdout


def test_reference_row_file(tmp_path, ref_programs):
    row = next(r for r in ref_programs if r["model_name"] == "softmax")
    path = tmp_path / "row.json"
    path.write_text(json.dumps(row))
    result = runner.invoke(app, ["leir", "print", str(path)])
    assert result.exit_code == 0 and result.stdout.strip() == row["leir"]


def test_bad_input_gives_a_clear_error_and_exit_code_2():
    broken = runner.invoke(app, ["leir", "parse", TEXT.replace("f32,g}_{a,c}", "f33,g}_{a,c}"), "-s", SIG])
    assert broken.exit_code == 2 and "unknown dtype code 'f33'" in broken.stdout
    wrong_rank = runner.invoke(app, ["leir", "parse", TEXT.replace("A^{f32,g}_{a,c}", "A^{f32,g}_{a}"), "-s", SIG])
    assert wrong_rank.exit_code == 2 and "rank-mismatch" in wrong_rank.stdout
    no_sig = runner.invoke(app, ["leir", "parse", TEXT])
    assert no_sig.exit_code != 0


def test_cache_commands(tmp_path):
    from steptp_env.measure import ResultStore

    path = tmp_path / "s.sqlite"
    with ResultStore(path) as store:
        store.put("k1", {"leir": "x", "target": "llvm", "protocol": {}, "median_s": 1e-3, "error": None}, "level1/a")
        store.put("k2", {"leir": "y", "target": "llvm", "protocol": {}, "median_s": None, "error": "boom"}, "level1/a")
    stats = runner.invoke(app, ["cache", "stats", "--store", str(path)])
    assert stats.exit_code == 0 and "2 records (1 ok, 1 failed)" in stats.stdout and "level1/a" in stats.stdout
    exported = runner.invoke(app, ["cache", "export", str(tmp_path / "o.jsonl"), "--store", str(path)])
    assert exported.exit_code == 0 and len((tmp_path / "o.jsonl").read_text().splitlines()) == 2
    lean = runner.invoke(app, ["cache", "export", str(tmp_path / "o.jsonl.gz"), "--store", str(path), "--no-features"])
    assert lean.exit_code == 0 and "wrote 2 records" in lean.stdout
    other = str(tmp_path / "t.sqlite")
    imported = runner.invoke(app, ["cache", "import", str(tmp_path / "o.jsonl.gz"), "--store", other])
    assert imported.exit_code == 0 and "imported 2 new records" in imported.stdout
    missing = runner.invoke(app, ["cache", "import", str(tmp_path / "none.jsonl"), "--store", other])
    assert missing.exit_code != 0 and "no export at" in missing.stdout
    pruned = runner.invoke(app, ["cache", "prune", "--store", str(path)])
    assert pruned.exit_code == 0 and "removed 1 records" in pruned.stdout


def test_progress_prints_lines_when_the_output_is_not_a_terminal():
    import io

    from rich.console import Console

    from steptp_env.cli_progress import progress

    log = io.StringIO()
    with progress(Console(file=log, force_terminal=False, width=200), "job", 3, every_s=0) as update:
        update(1, "first")
        update(2)
    lines = [line.rsplit(", ", 1)[0] for line in log.getvalue().splitlines()]  # less the elapsed seconds
    assert lines == ["first: 1/3", "job: 2/3", "job: 2/3"]  # a line per update, and one when the job ends
    quiet = io.StringIO()
    with progress(Console(file=quiet, force_terminal=False, width=200), "job", 3, every_s=3600) as update:
        update(1)
        update(2)
    lines = [line.rsplit(", ", 1)[0] for line in quiet.getvalue().splitlines()]
    assert lines == ["job: 1/3", "job: 2/3"]  # the first and the last only
    learnt = io.StringIO()
    with progress(Console(file=learnt, force_terminal=False, width=200), "job", 0, every_s=0) as update:
        update(1, total=4)
    assert [line.rsplit(", ", 1)[0] for line in learnt.getvalue().splitlines()] == ["job: 1/4", "job: 1/4"]
    bar = io.StringIO()
    with progress(Console(file=bar, force_terminal=True, width=200), "job", 3, every_s=0) as update:
        update(1)
    assert "job: 1/3" not in bar.getvalue()  # a terminal gets the bar
