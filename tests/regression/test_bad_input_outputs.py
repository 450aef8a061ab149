"""Issue 23, outputs: an output path under a file (``/dev/null/x``), a directory, an unwritable folder or a full
disk is exit 2 naming the path, and leaves no file behind (``--out /dev/null/x`` raised FileExistsError)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from checker import fileio
from checker.cli import main
from checker.errors import InputError
from tests.helpers import POLICIES, WORKLOADS


@pytest.mark.parametrize("create_dirs", [False, True])
def test_a_path_under_a_file_names_the_path(tmp_path, create_dirs):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for target in ("/dev/null/x", str(blocker / "sub" / "x.json")):
        with pytest.raises(InputError) as exc:
            fileio.write_atomic(target, "data", create_dirs=create_dirs, flag="--out")
        assert f"--out='{target}' (expected " in str(exc.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_directory_as_the_target_is_refused_and_left_alone(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(InputError, match=r"--out='.*out' \(expected a file path, not a directory\)"):
        fileio.write_atomic(target, "data")
    assert list(tmp_path.iterdir()) == [target] and list(target.iterdir()) == []


def test_a_full_disk_leaves_no_partial_or_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "p.yaml"
    target.write_text("old\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio.os, "fsync", full)
    with pytest.raises(InputError, match="No space left on device"):
        fileio.write_atomic(target, "new\n" * 1000)
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"] and target.read_text() == "old\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(InputError, match="Permission denied"):
            fileio.write_atomic(folder / "x", "data")
    finally:
        folder.chmod(0o700)


def _err(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "internal error" not in err, err
    return code, err


def test_import_out_under_dev_null(capsys):
    code, err = _err(capsys, ["import", "vllm", "--max-model-len", "4096", "--num-gpu-blocks-override", "100", "--out", "/dev/null/x"])
    assert code == 2 and "--out='/dev/null/x' (expected " in err, err


def test_import_out_a_directory(tmp_path, capsys):
    code, err = _err(capsys, ["import", "vllm", "--max-model-len", "4096", "--num-gpu-blocks-override", "100", "--out", str(tmp_path)])
    assert code == 2 and f"--out='{tmp_path}' (expected a file path, not a directory)" in err, err
    assert list(tmp_path.iterdir()) == []


def test_simulate_plot_under_dev_null(capsys):
    code, err = _err(capsys, ["simulate", str(POLICIES / "vllm_v1.yaml"), "--workload",
                              str(WORKLOADS / "chat_mixed.yaml"), "--limit", "3", "--plot", "/dev/null/x.png"])
    assert code == 2 and "--plot='/dev/null/x.png' (expected " in err, err


def test_counterexample_folder_under_dev_null():
    from checker.verify import counterexample as cex

    with pytest.raises(InputError, match=r"--out='/dev/null/x/p\.json' \(expected "):
        cex.write_atomic(Path("/dev/null/x/p.json"), "{}")
