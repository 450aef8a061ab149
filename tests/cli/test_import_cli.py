"""`batchcheck import`: output, the assumed lines on stderr, argument handling and exit codes, asserted
word for word; and the README's round trip (import, validate, simulate)."""

from __future__ import annotations

import pytest
import yaml

from checker.cli import build_parser, main
from checker.importers import SYSTEMS
from tests.helpers import ROOT, WORKLOADS

VLLM = ["--num-gpu-blocks-override", "2501", "--max-model-len", "16384", "--max-num-batched-tokens", "8192",
        "--max-num-seqs", "256"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_import_prints_the_policy_and_lists_assumed_defaults_on_stderr(capsys):
    code, out, err = run(capsys, "import", "vllm", "--", *VLLM)
    assert code == 0, err
    assert out.startswith("# Imported by `batchcheck import vllm`: vLLM 0.33 (V1 scheduler).\n")
    assert yaml.safe_load(out)["kv"]["num_blocks"] == 2500
    assert err.splitlines() == [
        "batchcheck: assumed: --vllm-version=0.33 (the reference version; pass --vllm-version for another one)",
        "batchcheck: assumed: kv.prefix_caching.enabled=true (--enable-prefix-caching not given: on by default in V1)",
        "batchcheck: assumed: queue.order=fcfs (--scheduling-policy not given: vLLM's default is fcfs)",
        "batchcheck: assumed: chunking.enabled=true (--enable-chunked-prefill not given: on by default in V1)",
        "batchcheck: assumed: chunking.long_prefill_token_threshold=0 (--long-prefill-token-threshold not given: "
        "vLLM's default, no cap)",
        "batchcheck: assumed: admission.reserve_full_prompt=true (--scheduler-reserve-full-isl not given: vLLM 0.33 "
        "default true)",
        "batchcheck: assumed: kv.block_size=16 (--block-size not given: vLLM's CUDA default)",
        "batchcheck: assumed: kv.watermark=0.0 (--watermark not given: vLLM 0.33 default)",
        "batchcheck: approximated: --async-scheduling=not given (vLLM turns async scheduling on by default since "
        "0.29; the import models synchronous scheduling unless --async-scheduling is given (the z3 encoding does "
        "not cover async scheduling yet); --no-async-scheduling says the server runs "
        "synchronously)",
    ]
    # each stderr line is also a comment in the YAML
    header = out.split("\nmax_model_len:")[0].replace("\n#   ", " ")
    for line in err.splitlines():
        assert "# " + line.removeprefix("batchcheck: ") in header


def test_round_trip_import_validate_simulate(capsys, tmp_path):
    out = tmp_path / "vllm_prod.yaml"
    code, stdout, _ = run(capsys, "import", "vllm", "--out", str(out), "--", *VLLM, "--scheduling-policy", "priority")
    assert code == 0 and stdout == f"{out}: policy imported from vllm\n"
    code, stdout, _ = run(capsys, "validate", str(out))
    assert code == 0 and stdout == f"{out}: valid policy\n"
    code, stdout, err = run(capsys, "simulate", str(out), "--workload", str(WORKLOADS / "chat_mixed.yaml"),
                            "--limit", "50")
    assert code == 0, err
    assert stdout.startswith("policy vllm_prod  |  requests from ")


@pytest.mark.parametrize("argv", [
    ["import", "--out", "{out}", "vllm", *VLLM],  # own options before SYSTEM
    ["import", "vllm", *VLLM, "--out", "{out}"],  # ... or after it, without --
    ["import", "vllm", "--out={out}", "--", *VLLM],
])
def test_own_options_anywhere_and_the_optional_double_dash(capsys, tmp_path, argv):
    out = tmp_path / "p.yaml"
    code, _, err = run(capsys, *[a.replace("{out}", str(out)) for a in argv])
    assert code == 0, err
    assert yaml.safe_load(out.read_text())["batch"]["max_num_batched_tokens"] == 8192


def test_an_own_option_given_twice_is_a_usage_error(capsys, tmp_path):
    code, _, err = run(capsys, "import", "--out", "a.yaml", "vllm", *VLLM, "--out", "b.yaml")
    assert code == 2
    assert err == "batchcheck: error: --out given twice (before and after vllm)\n"


def test_machine_options_after_system(capsys):
    code, out, err = run(capsys, "import", "sglang", "--context-length", "8192", "--gpu-memory-gib", "80",
                         "--model-weights-gib", "16", "--profile", str(ROOT / "spec/profiles/default_linear.json"))
    assert code == 0, err
    assert "batchcheck: assumed: --chunked-prefill-size=8192 (SGLang's default on a 80 GiB GPU (< 160 GB))\n" in err
    assert yaml.safe_load(out)["kv"]["num_blocks"] == int(54.4 * (1 << 30)) // 131072


@pytest.mark.parametrize("argv,message", [
    (["import", "vllm", "--max-model-len", "4096", "--num-gpu-blocks-override", "500", "--max-num-seqz", "8"],
     "--max-num-seqz='8' (expected an option batchcheck knows for vLLM, listed in docs/importers.md, or "
     "--ignore-unknown; did you mean --max-num-seqs?)"),
    (["import", "vllm", "--vllm-version", "0.9", "--max-model-len", "4096", "--num-gpu-blocks-override", "500",
      "--watermark", "0.01"],
     "--watermark=0.01 (expected an option of vLLM 0.9: it is new in vLLM's 2026 releases)"),
    (["import", "sglang", "--context-length", "8192", "--max-total-tokens", "100000", "--schedule-policy", "hrrn"],
     "--schedule-policy='hrrn' (expected fcfs, or fcfs with --enable-priority-scheduling: hrrn orders by the highest "
     "response ratio (token-based aging), which the policy model cannot express)"),
    (["import", "sglang", "--context-length", "8192", "--max-total-tokens", "100000", "FOO_TIMEOUT=3"],
     "FOO_TIMEOUT='3' (expected an environment variable batchcheck knows for SGLang, listed in docs/importers.md, or "
     "--ignore-unknown)"),
    (["import", "tgi", "--max-total-tokens", "4096", "--max-batch-total-tokens", "40000", "--speculate", "2"],
     "--speculate=2 (expected 0: speculative decoding (draft tokens per step) is not modelled)"),
    (["import", "trtllm", "--max_seq_len", "8192", "--kv_cache_config.max_tokens", "40000", "--max_beam_width", "4"],
     "--max_beam_width=4 (expected 1: beam search is not modelled)"),
    (["import", "tgi", "--max-total-tokens", "4096", "--max-batch-total-tokens", "40000", "--config", "x.yaml"],
     "--config is not read by the tgi importer (expected it only for triton, trtllm, vllm): pass tgi's own "
     "arguments"),
    (["import", "sglang", "--context-length", "8192", "--max-total-tokens", "100000", "--vllm-version", "0.9"],
     "--vllm-version is read by the vllm importer only (system is sglang)"),
    (["import", "vllm", "--max-model-len", "4096", "--gpu-memory-gib", "lots"],
     "--gpu-memory-gib='lots' (expected a finite number of GiB > 0 and <= 1,000,000)"),
    (["import", "vllm", "--max-model-len", "4096"],
     "the KV pool size of vLLM is not given: pass it (see docs/importers.md) or declare the machine with "
     "--gpu-memory-gib, --model-weights-gib, --kv-bytes-per-token (or --profile with a model shape)"),
])
def test_refused_and_unknown_options_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err == f"batchcheck: error: {message}\n"


def test_config_files_are_named_with_their_line(capsys, tmp_path):
    pbtxt = tmp_path / "config.pbtxt"
    pbtxt.write_text("max_batch_size: 8\ndynamic_batching {\n  preferred_batch_size: [ 4, 8 ]\n}\n")
    code, _, err = run(capsys, "import", "triton", str(pbtxt), "--max-model-len", "8192")
    assert code == 2
    assert err == (f"batchcheck: error: {pbtxt}:3: dynamic_batching.preferred_batch_size=[4, 8] (expected no "
                   "preferred sizes other than max_batch_size=8: sending a smaller preferred batch while more "
                   "requests wait is not expressible)\n")
    yaml_cfg = tmp_path / "vllm.yaml"
    yaml_cfg.write_text("max_model_len: 4096\nnum-gpu-blocks-override: 500\nmax_num_seqz: 4\n")
    code, _, err = run(capsys, "import", "vllm", "--config", str(yaml_cfg))
    assert code == 2
    assert err == (f"batchcheck: error: {yaml_cfg}:3: max_num_seqz=4 (expected an option batchcheck knows for vLLM, "
                   "listed in docs/importers.md, or --ignore-unknown; did you mean max-num-seqs?)\n")


def test_out_into_a_missing_directory_exits_2_and_writes_nothing(capsys, tmp_path):
    target = tmp_path / "missing" / "p.yaml"
    code, out, err = run(capsys, "import", "vllm", "--out", str(target), *VLLM)
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == (f"batchcheck: error: --out='{target}' (expected a file in an existing, writable "
                                    "directory (No such file or directory))")
    assert not target.parent.exists()


def test_unknown_system_is_an_argparse_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["import", "ollama", "--foo"])
    assert exc.value.code == 2
    assert "argument SYSTEM: invalid choice: 'ollama'" in capsys.readouterr().err


def test_the_parser_offers_every_importer():
    import_parser = build_parser()._subparsers._group_actions[0].choices["import"]  # type: ignore[union-attr]
    system = next(a for a in import_parser._actions if a.dest == "system")
    assert tuple(system.choices) == SYSTEMS


def test_readme_round_trip_commands_work(capsys, tmp_path, monkeypatch):
    """The README's import example, run as written (from the repository root)."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Importing a real server's configuration")[1].split("```bash\n")[1].split("```")[0]
    commands = [line for line in block.strip().splitlines() if line.startswith("batchcheck ")]
    assert [c.split()[1] for c in commands] == ["import", "validate", "simulate"]
    monkeypatch.chdir(ROOT)  # the example's workload path is relative to the repository root
    out_file = tmp_path / "vllm_prod.yaml"
    import shlex

    for command in commands:
        argv = [str(out_file) if a == "vllm_prod.yaml" else a for a in shlex.split(command)[1:]]
        code, _, err = run(capsys, *argv)
        assert code == 0, (command, err)
    assert out_file.exists()


def test_help_after_system_prints_the_import_help(capsys):
    code, out, _ = run(capsys, "import", "sglang", "--help")
    assert code == 0
    assert out.startswith("usage: batchcheck import [-h]")
    assert out.endswith("The options of sglang that batchcheck reads: docs/importers.md\n")
