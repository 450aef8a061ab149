"""Benchmark: which terms and how many pieces the calibrated profiles need. For each shipped
measurement table, the held-out median / p95 relative error of the fit with all terms, with each
term dropped, and with one piece only; plus the time the fit takes.

    python bench/calibrate_terms.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from checker.calibrate.fit import TERMS, FitOptions, fit  # noqa: E402
from checker.calibrate.measurements import read_measurements  # noqa: E402

TABLES = sorted((ROOT / "spec" / "profiles" / "measurements").glob("*.csv"))


def row(label: str, table, path: Path, opt: FitOptions) -> None:
    started = time.perf_counter()
    result = fit(table, path, ROOT / "spec" / "profiles" / "bench.json", opt=opt)
    seconds = time.perf_counter() - started
    e = result.errors(True)
    print(f"| {label} | {len(result.profile.pieces)} | {100 * e['median']:.1f} % | {100 * e['p95']:.1f} % "
          f"| {100 * e['max']:.1f} % | {seconds:.2f} s |")


def main() -> None:
    for path in TABLES:
        table = read_measurements(path)
        print(f"\n{path.name}: {len(table.rows)} shapes, {table.model.name} on {table.device}\n")
        print("| fit | pieces | held-out median | held-out p95 | held-out max | fit time |")
        print("|---|---|---|---|---|---|")
        row("all terms", table, path, FitOptions())
        row("all terms, one piece", table, path, FitOptions(max_pieces=1))
        for term in list(TERMS)[1:]:
            row(f"without {term}", table, path, FitOptions(terms=tuple(t for t in TERMS if t != term)))


if __name__ == "__main__":
    main()
