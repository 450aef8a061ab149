#!/usr/bin/env python3
"""The liveness explorer on a plain (non-speculative) instance: vLLM v1 on a 16-block pool, prompts {16,48,96},
outputs {1,2,4}, 4 requests in flight (bench/liveness_states.py's N=4 instance). Prints states, edges, choices and
the exploration's CPU seconds; run from the tree to measure (docs/benchmarks.md, "live17").

    PYTHONPATH=. python bench/liveness_plain_instance.py
"""
import time
from checker.api import apply_overrides, load_policy
from checker.liveness.explore import LivenessEnv, explore
policy = apply_overrides(load_policy("spec/policies/vllm_v1.yaml"), ["kv.num_blocks=16"])
t = time.process_time()
sg = explore(policy, LivenessEnv(4, (16, 48, 96), (1, 2, 4)))
print(sg.states, sg.edges, sg.choices_run, round(time.process_time() - t, 2))
