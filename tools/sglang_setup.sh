#!/usr/bin/env bash
# Build a CPU-only venv that imports SGLang 0.5.23's real scheduler and runs tests/sglang_driver.py
# (no model, no GPU). Usage: tools/sglang_setup.sh [VENV_DIR]   (default: ~/.cache/sglang-scheduler/venv)
#
# Everything comes from the package index. About 2.5 GB on disk and 3-8 minutes. The sglang wheel goes in with
# --no-deps: its declared dependencies pull CUDA wheels (flashinfer, cutlass-dsl, nvshmem, deep-gemm, a CUDA
# torch 2.14.1, ...) that the scheduling path never imports; the list below is what the import of
# sglang.srt.managers.scheduler needs on CPU (found by importing it and adding each missing module).
# torchvision is not installed: its PyPI wheel is CUDA-linked and fails to load next to the CPU torch; the
# driver stubs it (see docs/sglang-harness.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-$HOME/.cache/sglang-scheduler/venv}
python=${PYTHON:-python3.11}
wheels=$(dirname "$venv")/wheels
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
pip="$venv/bin/pip"

# torch: the CPU build. 2.13.0+cpu is what the vLLM harness venv uses; sglang 0.5.23 pins 2.14.1 but the
# scheduler runs on 2.13 (the pin is for its CUDA kernels). The CPU build comes from a configured find-links /
# extra index when one has it, else from the PyTorch CPU index when reachable, else plain PyPI torch (a CUDA
# build, several GB larger, still runs on CPU).
if "$pip" install "torch==2.13.0+cpu"; then
  :
elif curl -fsS -m 20 -o /dev/null https://download.pytorch.org/whl/cpu/; then
  "$pip" install "torch==2.13.0+cpu" --index-url https://download.pytorch.org/whl/cpu
else
  "$pip" install "torch==2.13.0"
fi

"$pip" download sglang==0.5.23 --no-deps -d "$wheels"
"$pip" install --no-deps "$wheels"/sglang-0.5.23-*.whl
# triton: sglang/srt/utils/common.py imports it at module level (CPU import works; no kernel runs).
"$pip" install --no-deps "triton==3.9.0"
"$pip" install --no-deps "compressed-tensors==0.18.0"
"$pip" install numpy packaging pydantic msgspec psutil requests tqdm orjson pybase64 regex pyzmq setproctitle \
  python-multipart fastapi uvicorn aiohttp xxhash zstandard "transformers==5.19.0" einops pillow IPython \
  "apache-tvm-ffi==0.1.11" dill "sentencepiece==0.2.1" tiktoken interegular partial_json_parser loguru gguf \
  "openai==2.8.0" "openai-harmony==0.0.4"

# smoke test: the 3-request trace of the vLLM harness, one JSON line per step
cat > "$(dirname "$venv")/trace_small.json" <<'EOF'
[
 {"id": "a", "arrival_step": 0, "prompt_tokens": 100, "output_tokens": 5, "priority": 0},
 {"id": "b", "arrival_step": 0, "prompt_tokens": 300, "output_tokens": 3, "priority": 1},
 {"id": "c", "arrival_step": 2, "prompt_tokens": 40, "output_tokens": 4, "priority": 0, "abort_step": 4}
]
EOF
"$venv/bin/python" "$here/../tests/sglang_driver.py" "$(dirname "$venv")/trace_small.json" \
  --pool-tokens 512 --page-size 16 --max-running-requests 4 --chunked-prefill-size 128
echo "ready: $venv/bin/python tests/sglang_driver.py TRACE.json [flags] --out LOG.jsonl"
