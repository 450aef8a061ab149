"""Issue 23, the input limits: deep nesting, YAML alias bombs and oversized files are refused with exit 2
(the file and what is allowed) before any work starts; RecursionError never escapes (it was exit 101)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from checker import loading
from checker.cli import main
from checker.exitcodes import ExitCode


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


DEEP = 3000


@pytest.mark.parametrize("name,text", [
    ("deep.yaml", "name: p\nkv: " + "[" * DEEP + "]" * DEEP + "\n"),
    ("deep_block.yaml", "".join("  " * i + "a:\n" for i in range(300)) + "  " * 300 + "b: 1\n"),
    ("deep.json", "[" * DEEP + "]" * DEEP),
    ("deep_moderate.json", '{"kv": ' + "[" * 400 + "]" * 400 + "}"),  # json parses it, the line map recursed
], ids=lambda value: value if isinstance(value, str) and len(value) < 40 else "")
def test_deep_nesting_is_an_input_error(tmp_path, capsys, name, text):
    path = _file(tmp_path, name, text)
    code, err = _run(capsys, "validate", path, "--kind", "policy")
    assert code == ExitCode.INPUT_ERROR
    assert f"{path}:" in err and f"nesting at most {loading.MAX_DEPTH} levels deep" in err, err


def test_billion_laughs_is_refused_fast(tmp_path, capsys):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    path = _file(tmp_path, "laughs.yaml", "\n".join(lines) + "\n")
    started = time.monotonic()
    code, err = _run(capsys, "validate", path)
    assert code == ExitCode.INPUT_ERROR
    assert time.monotonic() - started < 5
    assert f"at most {loading.MAX_NODES:,} values" in err and path in err, err


def test_a_recursive_alias_is_refused(tmp_path, capsys):
    path = _file(tmp_path, "loop.yaml", "name: p\nkv: &k\n  num_blocks: *k\n")
    code, err = _run(capsys, "validate", path, "--kind", "policy")
    assert code == ExitCode.INPUT_ERROR
    assert "an alias that does not contain itself" in err and f"{path}:2:" in err, err


def test_a_file_over_the_size_limit_is_refused_before_reading(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "MAX_FILE_BYTES", 100)
    path = _file(tmp_path, "big.yaml", "name: p\n" + "# padding\n" * 20)
    code, err = _run(capsys, "validate", path)
    assert code == ExitCode.INPUT_ERROR
    assert f"{path}: (file)=" in err and "at most 100 bytes" in err, err


def test_a_yaml_file_over_the_yaml_limit_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "MAX_YAML_BYTES", 100)
    path = _file(tmp_path, "big.yaml", "name: p\n" + "# padding\n" * 20)
    code, err = _run(capsys, "validate", path)
    assert code == ExitCode.INPUT_ERROR
    assert "a YAML document of at most 100 bytes" in err, err


def test_deep_json_lines_trace(tmp_path, capsys):
    from tests.helpers import POLICIES

    path = _file(tmp_path, "t.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
                 + '{"x": ' + "[" * DEEP + "]" * DEEP + "}\n")
    code, err = _run(capsys, "simulate", str(POLICIES / "vllm_v1.yaml"), "--trace", path)
    assert code == ExitCode.INPUT_ERROR
    assert f"{path}:2:" in err and "nesting at most" in err, err


def test_deep_toml_config(tmp_path, capsys):
    path = _file(tmp_path, "batchcheck.toml", "x = " + "[" * DEEP + "]" * DEEP + "\n")
    code, err = _run(capsys, "ci", "--config", path)
    assert code == ExitCode.INPUT_ERROR
    assert f"{path}" in err and "nesting at most" in err, err


def test_moderately_deep_toml_config(tmp_path, capsys):
    path = _file(tmp_path, "batchcheck.toml", "[[verify]]\ninvariants = " + "[" * 200 + "]" * 200 + "\n")
    code, err = _run(capsys, "ci", "--config", path)
    assert code == ExitCode.INPUT_ERROR
    assert "nesting at most" in err, err


def test_deep_pbtxt(tmp_path, capsys):
    path = _file(tmp_path, "config.pbtxt", "a " + "{ b " * DEEP + "}" * DEEP + "\n")
    code, err = _run(capsys, "import", "triton", path, "--max-model-len", "8192")
    assert code == ExitCode.INPUT_ERROR
    assert f"{path}:1:" in err and "nesting at most" in err, err
