"""`validate --json` and `calibrate {measure,import-vidur,fit} --json`: real output validates against
docs/schemas/validate.schema.json and docs/schemas/calibrate-*.schema.json (the same check as
tests/cli/test_json_schemas.py), exit codes as without --json, and a bad file is still exit 2 with its located
problems on stdout (and the error lines on stderr)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

import jsonschema
import pytest

from checker.cli import main
from checker.profile import load_profile
from tests.cli.test_calibrate_cli import good_rows, table
from tests.helpers import POLICIES, ROOT, SHARED_DATA

SCHEMAS = ROOT / "docs" / "schemas"
VIDUR_A100 = SHARED_DATA / "gpu_profiles" / "a100_llama-2-70b_tp2"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def run(capsys, *argv: str) -> tuple[int, dict, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def check(name: str, doc: dict) -> None:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)


def test_validate_json_of_valid_files(capsys):
    files = [str(POLICIES / "vllm_v1.yaml"), str(ROOT / "spec/workloads/chat_mixed.yaml"),
             str(ROOT / "spec/profiles/cpu-small-llama.json"), "chat_mixed"]  # a shipped example's bare name
    code, doc, err = run(capsys, "validate", *files, "--json")
    check("validate", doc)
    assert (code, err, doc["exit_code"], doc["valid"], doc["invalid"]) == (0, "", 0, 4, 0)
    assert [(f["kind"], f["valid"], f["problems"]) for f in doc["files"]] == [
        ("policy", True, []), ("workload", True, []), ("profile", True, []), ("workload", True, [])]
    assert doc["files"][3]["path"] == str(ROOT / "spec/workloads/chat_mixed.yaml")


def test_validate_json_of_bad_files_exits_2_with_each_located_problem(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nkv: {block_size: 16, num_blocks: .nan}\nbatch: {max_num_seqs: -1}\n")
    unknown = tmp_path / "what.yaml"
    unknown.write_text("hello: 1\n")
    good, missing = str(POLICIES / "vllm_v1.yaml"), str(tmp_path / "nope.yaml")
    code, doc, err = run(capsys, "validate", str(bad), good, missing, str(unknown), "--json")
    check("validate", doc)
    assert (code, doc["exit_code"], doc["valid"], doc["invalid"]) == (2, 2, 1, 3)
    assert [(f["path"], f["kind"], f["valid"]) for f in doc["files"]] == [
        (str(bad), "policy", False), (good, "policy", True), (missing, None, False), (str(unknown), None, False)]
    problems = {p["field"]: p for p in doc["files"][0]["problems"]}
    assert problems["batch.max_num_seqs"] == {
        "file": str(bad), "line": 3, "field": "batch.max_num_seqs", "value": -1, "expected": "a number >= 1",
        "message": f"{bad}:3: batch.max_num_seqs=-1 (expected a number >= 1)"}
    assert (problems["kv.num_blocks"]["line"], problems["kv.num_blocks"]["value"]) == (2, "nan")  # NaN is no JSON
    assert (problems["max_model_len"]["value"], problems["max_model_len"]["expected"]) == ("<missing>",
                                                                                        "this field to be given")
    assert doc["files"][2]["problems"] == [{
        "file": missing, "line": None, "field": "", "value": missing, "expected": "an existing file",
        "message": f"{missing}: (document)='{missing}' (expected an existing file)"}]
    # the same error lines as without --json, each problem the message of its entry
    messages = [p["message"] for f in doc["files"] for p in f["problems"]]
    assert err == "batchcheck: error: " + "\nbatchcheck: error: ".join(
        "\n".join(p["message"] for p in f["problems"]) for f in doc["files"] if not f["valid"]) + \
        "\nbatchcheck: 3 of 4 files are not valid\n"
    assert len(messages) == 5 and set(problems) == {"max_model_len", "batch.max_num_seqs", "kv.num_blocks"}
    code, text, text_err = main(["validate", str(bad), good, missing, str(unknown)]), *capsys.readouterr()
    assert (code, text, text_err) == (2, f"{good}: valid policy\n", err)


def test_validate_json_with_a_kind_reports_that_kind(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("hello: 1\n")
    code, doc, _ = run(capsys, "validate", str(bad), "--kind", "workload", "--json")
    check("validate", doc)
    assert (code, doc["files"][0]["kind"]) == (2, "workload")
    assert {p["field"] for p in doc["files"][0]["problems"]} == {"hello", "duration_s", "classes"}


def test_the_validate_schema_rejects_output_that_drifted():
    doc = {"files": [{"path": "p.yaml", "kind": "policy", "valid": False, "problems": []}], "valid": 0,
           "invalid": 1, "exit_code": 2}  # a bad file without its problem
    with pytest.raises(jsonschema.ValidationError):
        check("validate", doc)


def test_calibrate_fit_json(capsys, tmp_path):
    csv_path = tmp_path / "m.csv"
    csv_path.write_text(table(good_rows()))
    out = tmp_path / "toy.json"
    code, doc, err = run(capsys, "calibrate", "fit", str(csv_path), "--out", str(out), "--json",
                         "--policy", str(POLICIES / "vllm_v1.yaml"))
    check("calibrate-fit", doc)
    assert (code, err, doc["exit_code"], doc["meets_targets"]) == (0, "", 0, True)
    assert (doc["training"]["shapes"], doc["held_out"]["shapes"]) == (20, 7)
    assert doc["written"] == [str(out), str(tmp_path / "toy.residuals.png")] == [doc["profile"], doc["residual_plot"]]
    profile = load_profile(out)
    assert doc["pieces"] == [p.model_dump() for p in profile.pieces] and doc["fit_error"] == profile.fit_error
    assert doc["measured_range"] == {"max_batched_tokens": 256, "max_prefill_tokens": 256, "max_decode_seqs": 32,
                                     "max_context": 856}
    [entry] = doc["extrapolation"]
    assert entry["policy"] == str(POLICIES / "vllm_v1.yaml") and len(entry["notes"]) == 3
    assert all(note.startswith("extrapolation: vllm_v1: ") for note in entry["notes"])


def test_calibrate_fit_json_missing_the_targets_exits_1(capsys, tmp_path):
    noisy = [",".join(parts[:6] + [f"{float(parts[6]) * (1.6 if i % 2 else 1.0):.3f}"] + parts[7:])
             for i, parts in enumerate(r.split(",") for r in good_rows())]
    csv_path = tmp_path / "m.csv"
    csv_path.write_text(table(noisy))
    code, doc, _ = run(capsys, "calibrate", "fit", str(csv_path), "--out", str(tmp_path / "p.json"), "--no-plot",
                       "--json")
    check("calibrate-fit", doc)
    assert (code, doc["exit_code"], doc["meets_targets"], doc["residual_plot"]) == (1, 1, False, None)
    assert doc["held_out"]["median"] > 0.05 or doc["held_out"]["p95"] > 0.10
    code, doc, _ = run(capsys, "calibrate", "fit", str(csv_path), "--out", str(tmp_path / "q.json"), "--no-plot",
                       "--held-out", "0", "--json")  # nothing held out: no held-out error, the targets unmet
    check("calibrate-fit", doc)
    assert (code, doc["held_out"], doc["training"]["shapes"], doc["extrapolation"]) == (1, None, 27, [])


def test_calibrate_fit_json_of_a_bad_table_is_exit_2_on_stderr_only(capsys, tmp_path):
    csv_path = tmp_path / "m.csv"
    csv_path.write_text(table(["decode,0,0,1,1,1,-5,1.0,cpu,toy,2,64,4,2,4,1"]))
    code = main(["calibrate", "fit", str(csv_path), "--out", str(tmp_path / "p.json"), "--json"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and err.startswith(f"batchcheck: error: {csv_path}:2: ")


@pytest.mark.shared_data
@pytest.mark.skipif(not VIDUR_A100.is_dir(), reason=f"Vidur's A100 profiles are not at {VIDUR_A100} (../shared/data)")
def test_calibrate_import_vidur_json(capsys, tmp_path):
    out = tmp_path / "a100.csv"
    code, doc, _ = run(capsys, "calibrate", "import-vidur", str(VIDUR_A100), "--out", str(out), "--prefill-stride",
                       "8", "--json")
    check("calibrate-import-vidur", doc)
    assert (code, doc["exit_code"], doc["out"], doc["directory"], doc["notes"]) == (0, 0, str(out), str(VIDUR_A100), [])
    assert doc["rows"] == sum(doc["kinds"].values()) == len(out.read_text().splitlines()) - 1
    assert (doc["model"]["name"], doc["model"]["layers"], doc["device"]) == ("llama-2-70b", 80,
                                                                             "vidur-a100_llama-2-70b_tp2")
    for name in ("mlp.csv", "attention.csv"):  # no cpu_overheads.csv: a note, in the JSON as in the text
        shutil.copy(VIDUR_A100 / name, tmp_path / name)
    code, doc, _ = run(capsys, "calibrate", "import-vidur", str(tmp_path), "--out", str(tmp_path / "b.csv"),
                       "--layers", "80", "--prefill-stride", "8", "--json")
    check("calibrate-import-vidur", doc)
    assert code == 0 and doc["notes"] == ["no cpu_overheads.csv: the engine's CPU time per step is not included (0)"]


def test_calibrate_measure_json_without_torch_is_exit_2_on_stderr_only(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` sees when torch is not installed
    code = main(["calibrate", "measure", "--out", str(tmp_path / "m.csv"), "--json"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and err.startswith("batchcheck: error: calibrate measure needs PyTorch")


@pytest.mark.skipif(not HAS_TORCH, reason="calibrate measure needs PyTorch (pip install -e '.[calibrate]'), not "
                                          "installed here")
def test_calibrate_measure_json(capsys, tmp_path):
    out = tmp_path / "m.csv"
    code, doc, _ = run(capsys, "calibrate", "measure", "--out", str(out), "--device", "cpu", "--repeats", "1",
                       "--passes", "1", "--warmup", "0", "--prefill-chunks", "8", "--prefill-contexts", "0",
                       "--decode-batches", "1", "--decode-contexts", "8", "--mixed-chunks", "8",
                       "--mixed-decode-batches", "1", "--mixed-contexts", "8", "--json")
    check("calibrate-measure", doc)
    assert (code, doc["exit_code"], doc["out"], doc["model"]["name"]) == (0, 0, str(out), "tiny-llama")
    assert doc["rows"] == sum(doc["kinds"].values()) == len(out.read_text().splitlines()) - 1


def test_every_schema_here_is_tested_here():
    assert {p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json")} >= {
        "validate", "calibrate-measure", "calibrate-import-vidur", "calibrate-fit"}
