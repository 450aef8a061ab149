"""Bug reports from counterexamples: markdown and a PNG timeline, from the engine's replay.

``batchcheck report COUNTEREXAMPLE.json [--out DIR]`` (checker/commands/report.py) and
``batchcheck simulate ... --plot FILE.png`` (the same timeline for a whole run). docs/report.md.
"""
