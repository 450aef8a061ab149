"""Issue 23, numeric flags: every numeric flag is checked like a file field (a finite number in a stated range)
when the command line is parsed, so NaN, infinity, zero, negatives and 2**63 never reach the arithmetic
(they crashed with ValueError, OverflowError, MemoryError or Hypothesis' InvalidArgument, or were accepted:
``simulate --limit -5`` dropped the last five requests, ``verify --step-ms 0`` ran)."""

from __future__ import annotations

import pytest

from checker.cli import main

HUGE = "9223372036854775808"
P = "p.yaml"  # argparse refuses the flag before any file is read

CASES = [
    ("verify", P, "--timeout", "nan"), ("verify", P, "--timeout", "inf"), ("verify", P, "--timeout", "0"),
    ("verify", P, "--step-ms", "nan"), ("verify", P, "--step-ms", "inf"), ("verify", P, "--step-ms", "0"),
    ("verify", P, "--step-ms", "-10"), ("verify", P, "--requests", HUGE), ("verify", P, "--requests", "0"),
    ("verify", P, "--depth", "0"), ("verify", P, "--depth", HUGE), ("verify", P, "--prompt-range=-5:3"),
    ("verify", P, "--output-range", f"1:{HUGE}"), ("verify", P, "--prompt-range", "9:3"),
    ("simulate", P, "--workload", "w.yaml", "--limit", "-5"), ("simulate", P, "--workload", "w.yaml", "--limit", "0"),
    ("simulate", P, "--trace", "t.csv", "--window", "0:inf"), ("simulate", P, "--trace", "t.csv", "--window", "nan:1"),
    ("simulate", P, "--trace", "t.csv", "--window", "5:1"),
    ("simulate", P, "--trace", "t.csv", "--rate-scale", "nan"), ("simulate", P, "--trace", "t.csv", "--rate-scale", "inf"),
    ("simulate", P, "--trace", "t.csv", "--class-by-prompt", f"1,{HUGE}0"),
    ("fuzz", P, "--seed", "-1"), ("fuzz", P, "--seed", HUGE), ("fuzz", P, "--max-examples", "0"),
    ("fuzz", P, "--time-budget", "nan"), ("fuzz", P, "--time-budget", "-1"), ("fuzz", P, "--max-requests", "0"),
    ("fuzz", P, "--seed-windows", "0"),
    ("diff", P, P, "--seed", "-1"), ("diff", P, P, "--timeout", "inf"),
    ("diff", P, P, "--min-delta", "inf"), ("diff", P, P, "--requests", HUGE), ("diff", P, P, "--fuzz-budget", "nan"),
    ("diff", P, P, "--max-examples", "0"), ("diff", P, P, "--depth", "-1"),
    ("audit", "--policy", P, "--workload", "w.yaml", "--queue-slo-ms", "-1"),
    ("audit", "--policy", P, "--workload", "w.yaml", "--ttft-slo-ms", HUGE),
    ("check-log", P, "log.jsonl", "--arrivals", "a.json", "--follow", "--follow-idle-s", "nan"),
    ("check-log", P, "log.jsonl", "--arrivals", "a.json", "--follow", "--follow-idle-s", "0"),
    ("import", "--gpu-memory-gib", "nan", "vllm"), ("import", "--model-weights-gib", "-1", "vllm"),
    ("import", "--kv-bytes-per-token", "0", "vllm"), ("import", "--overhead-gib", "inf", "vllm"),
    ("ci", "--jobs", HUGE),
    ("calibrate", "fit", "m.csv", "--out", "p.json", "--seed", "-1"),
    ("calibrate", "fit", "m.csv", "--out", "p.json", "--held-out", "nan"),
    ("calibrate", "fit", "m.csv", "--out", "p.json", "--max-pieces", HUGE),
    ("calibrate", "measure", "--out", "m.csv", "--warmup", "-1"),
    ("calibrate", "measure", "--out", "m.csv", "--repeats", HUGE),
]


@pytest.mark.parametrize("argv", CASES, ids=lambda argv: " ".join(a for a in argv if a not in (P, "w.yaml", "t.csv")))
def test_a_numeric_flag_out_of_range_is_a_usage_error_naming_the_range(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    flag = next(a for a in reversed(argv) if a.startswith("--")).split("=")[0]
    assert f"argument {flag}: " in err and "(expected " in err, err


@pytest.mark.parametrize("flag,value", [("--gpu-memory-gib", "nan"), ("--model-weights-gib", "-1"),
                                        ("--kv-bytes-per-token", "0"), ("--overhead-gib", "inf")])
def test_import_options_after_the_system_are_checked_alike(capsys, flag, value):
    code = main(["import", "vllm", flag, value])
    err = capsys.readouterr().err
    assert code == 2
    assert f"batchcheck: error: {flag}={value!r} (expected a " in err and " and <= " in err, err


@pytest.mark.parametrize("text", ["0.5", "1.5", "60"])
def test_good_values_still_parse(text):
    from checker.cli import build_parser

    args = build_parser().parse_args(["verify", P, "--timeout", text, "--step-ms", text])
    assert args.timeout == float(text)


def test_the_window_and_rate_scale_are_checked_in_the_library_too():
    from checker.errors import InputError
    from checker.traces import TraceOptions

    for options in (TraceOptions(window_s=(0.0, float("inf"))), TraceOptions(window_s=(float("nan"), 1.0)),
                    TraceOptions(rate_scale=float("nan"))):
        with pytest.raises(InputError, match="expected"):
            options.check()


def test_diff_threshold_nan_is_refused_by_the_library_range(capsys):
    """--threshold keeps its library check (0 to 100, the message tests/cli pins); NaN is outside it too."""
    from tests.helpers import POLICIES

    v1 = str(POLICIES / "vllm_v1.yaml")
    assert main(["diff", v1, v1, "--threshold", "nan"]) == 2
    assert "--threshold=nan (expected a relative increase between 0 and 100" in capsys.readouterr().err
