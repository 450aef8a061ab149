"""The command line's verbs that live in their own module, one module per verb (checker/cli.py registers
them: each has ``register(verbs)``). The CLI layer: above the facade checker/api.py, which it calls; nothing
below imports it."""
