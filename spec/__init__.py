"""batchcheck's shipped examples (policies, workloads, profiles, SLO and audit files), installed with the
package as ``batchcheck_examples`` so that their names work without a checkout (checker/examples.py)."""
