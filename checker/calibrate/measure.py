"""Time real forward passes of a decoder-only transformer (Llama-shaped, random weights, no downloads)
for a grid of batch compositions, and write them as a measurement table.

One iteration runs what a serving engine runs for a batch: the token embedding, per layer RMSNorm, QKV
projection, rotary embedding, the new keys and values written into a KV cache, attention (each prefill
chunk causally against its context, the decode batch against its contexts, grouped-query heads), the
output projection, RMSNorm and a SwiGLU MLP, then the final norm and the LM head for the one token per
sequence that samples. Prefill chunks and decodes share the dense operators, as in vLLM's mixed batches.

Timing: warm-up passes, then repeats; the median is the time, the interquartile range the spread. On
a CUDA device each pass is timed with CUDA events, on the CPU with ``time.perf_counter``. torch is an
optional extra: ``pip install -e '.[calibrate]'``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from checker.calibrate.measurements import Measurement, MeasurementTable
from checker.errors import UsageError
from checker.profile import ModelShape

INSTALL_HINT = ("calibrate measure needs PyTorch: pip install -e '.[calibrate]' (or pip install torch==2.13.0); "
                "the fit and import-vidur verbs work without it")
ROPE_BASE = 10000.0
RMS_EPS = 1e-5


@dataclass(frozen=True)
class ModelConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    def shape(self, dtype_bytes: int) -> ModelShape:
        return ModelShape(name=self.name, layers=self.layers, hidden=self.hidden, heads=self.heads,
                          kv_heads=self.kv_heads, dtype_bytes=dtype_bytes, tensor_parallel=1)


MODELS = {m.name: m for m in (
    ModelConfig("tiny-llama", layers=4, hidden=256, heads=8, kv_heads=2, intermediate=688, vocab=2048),
    ModelConfig("small-llama", layers=8, hidden=512, heads=8, kv_heads=4, intermediate=1376, vocab=8192),
    ModelConfig("llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256),
)}


@dataclass(frozen=True)
class Shape:
    """One batch composition: at most one prefill chunk (tokens, context before it) plus a decode
    batch (sequences, cached context of each)."""

    kind: str
    chunk: int = 0
    chunk_context: int = 0
    decodes: int = 0
    decode_context: int = 0

    def measurement(self, time_us: float, spread_us: float) -> Measurement:
        return Measurement(self.kind, self.chunk, self.chunk * (self.chunk_context + self.chunk), self.decodes,
                           self.decodes * (self.decode_context + 1),
                           max(self.chunk_context + self.chunk, self.decode_context + 1 if self.decodes else 0),
                           time_us, spread_us)


@dataclass(frozen=True)
class MeasureGrid:
    prefill_chunks: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    prefill_contexts: tuple[int, ...] = (0, 256, 768)
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_contexts: tuple[int, ...] = (64, 512, 1024)
    mixed_chunks: tuple[int, ...] = (64, 256)
    mixed_decode_batches: tuple[int, ...] = (4, 16, 32)
    mixed_contexts: tuple[int, ...] = (256, 768)

    def shapes(self) -> list[Shape]:
        out = [Shape("prefill", c, k) for c in self.prefill_chunks for k in self.prefill_contexts]
        out += [Shape("decode", 0, 0, b, k) for b in self.decode_batches for k in self.decode_contexts]
        out += [Shape("mixed", c, k, b, k) for c in self.mixed_chunks for b in self.mixed_decode_batches
                for k in self.mixed_contexts]
        return out


def _torch():
    try:
        import torch
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    return torch


class _Decoder:
    """A Llama-shaped decoder with random weights on one device."""

    def __init__(self, cfg: ModelConfig, device: str, dtype, seed: int):
        torch = _torch()
        self.torch, self.cfg, self.device, self.dtype = torch, cfg, device, dtype
        g = torch.Generator(device="cpu").manual_seed(seed)
        head_dim = cfg.hidden // cfg.heads
        self.head_dim = head_dim

        def weight(*shape):
            w = torch.randn(*shape, generator=g) / math.sqrt(shape[-1])
            return w.to(device=device, dtype=dtype)

        self.embed = weight(cfg.vocab, cfg.hidden)
        self.layers = [dict(
            qkv=weight((cfg.heads + 2 * cfg.kv_heads) * head_dim, cfg.hidden),
            out=weight(cfg.hidden, cfg.heads * head_dim),
            gate_up=weight(2 * cfg.intermediate, cfg.hidden),
            down=weight(cfg.hidden, cfg.intermediate),
            norm1=torch.ones(cfg.hidden, device=device, dtype=dtype),
            norm2=torch.ones(cfg.hidden, device=device, dtype=dtype),
        ) for _ in range(cfg.layers)]
        self.final_norm = torch.ones(cfg.hidden, device=device, dtype=dtype)
        self.lm_head = weight(cfg.vocab, cfg.hidden)
        inv = 1.0 / (ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.inv_freq = inv.to(device)

    def _rms(self, x, w):
        t = self.torch
        return x * t.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w

    def _rope(self, x, positions):
        t = self.torch
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        cos, sin = t.cos(freqs).to(x.dtype)[:, None, :], t.sin(freqs).to(x.dtype)[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return t.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def inputs(self, shape: Shape):
        """Token ids, positions and KV caches (random contents) for one batch composition."""
        t, cfg = self.torch, self.cfg
        n = shape.chunk + shape.decodes
        ids = t.randint(0, cfg.vocab, (n,), device=self.device)
        positions = t.cat((t.arange(shape.chunk_context, shape.chunk_context + shape.chunk),
                           t.full((shape.decodes,), shape.decode_context))).to(self.device)

        def cache(seqs, length):
            return [(t.randn(seqs, cfg.kv_heads, length, self.head_dim, device=self.device, dtype=self.dtype),
                     t.randn(seqs, cfg.kv_heads, length, self.head_dim, device=self.device, dtype=self.dtype))
                    for _ in range(cfg.layers)]

        prefill_cache = cache(1, shape.chunk_context + shape.chunk) if shape.chunk else None
        decode_cache = cache(shape.decodes, shape.decode_context + 1) if shape.decodes else None
        mask = None
        if shape.chunk and shape.chunk_context:
            rows = t.arange(shape.chunk, device=self.device)[:, None] + shape.chunk_context
            mask = t.arange(shape.chunk_context + shape.chunk, device=self.device)[None, :] <= rows
        return ids, positions, prefill_cache, decode_cache, mask

    def forward(self, shape: Shape, ids, positions, prefill_cache, decode_cache, mask):
        t, cfg, hd = self.torch, self.cfg, self.head_dim
        f = t.nn.functional
        c, b = shape.chunk, shape.decodes
        x = self.embed[ids]
        for i, layer in enumerate(self.layers):
            h = self._rms(x, layer["norm1"])
            qkv = h @ layer["qkv"].T
            q = qkv[:, :cfg.heads * hd].view(-1, cfg.heads, hd)
            k = qkv[:, cfg.heads * hd:(cfg.heads + cfg.kv_heads) * hd].view(-1, cfg.kv_heads, hd)
            v = qkv[:, (cfg.heads + cfg.kv_heads) * hd:].view(-1, cfg.kv_heads, hd)
            q, k = self._rope(q, positions), self._rope(k, positions)
            outs = []
            if c:
                kc, vc = prefill_cache[i]
                kc[0, :, shape.chunk_context:] = k[:c].transpose(0, 1)
                vc[0, :, shape.chunk_context:] = v[:c].transpose(0, 1)
                qp = q[:c].transpose(0, 1)[None]
                o = f.scaled_dot_product_attention(qp, kc, vc, attn_mask=mask, is_causal=mask is None,
                                                   enable_gqa=True)
                outs.append(o[0].transpose(0, 1).reshape(c, -1))
            if b:
                kc, vc = decode_cache[i]
                kc[:, :, -1] = k[c:]
                vc[:, :, -1] = v[c:]
                o = f.scaled_dot_product_attention(q[c:, :, None, :], kc, vc, enable_gqa=True)
                outs.append(o[:, :, 0, :].reshape(b, -1))
            x = x + t.cat(outs) @ layer["out"].T
            h = self._rms(x, layer["norm2"])
            gate, up = (h @ layer["gate_up"].T).chunk(2, dim=-1)
            x = x + (f.silu(gate) * up) @ layer["down"].T
        sampled = t.cat((x[c - 1:c], x[c:])) if c else x
        return self._rms(sampled, self.final_norm) @ self.lm_head.T


def pick_device(requested: str) -> str:
    torch = _torch()
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible to torch (use --device cpu or auto)")
    return requested


def measure(cfg: ModelConfig, grid: MeasureGrid, device: str = "auto", warmup: int = 1, repeats: int = 3,
            passes: int = 3, seed: int = 0, threads: int | None = 1, cpu_clock: str = "wall",
            progress: Callable[[str], None] | None = None) -> tuple[MeasurementTable, float]:
    """Time every shape of the grid: ``passes`` sweeps over the whole grid (so that a burst of load
    from other processes spreads over many shapes instead of spoiling one), each with ``warmup``
    untimed and ``repeats`` timed passes per shape. Return the table and the wall time it took (s)."""
    torch = _torch()
    started = time.perf_counter()
    device = pick_device(device)
    if threads is not None:
        torch.set_num_threads(threads)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(seed)
    model = _Decoder(cfg, device, dtype, seed)
    shapes = grid.shapes()
    times: list[list[float]] = [[] for _ in shapes]
    with torch.inference_mode():
        for sweep in range(1, passes + 1):
            for index, shape in enumerate(shapes):
                args = model.inputs(shape)
                run = [_time_once(torch, device, lambda: model.forward(shape, *args), cpu_clock)
                       for _ in range(warmup + repeats)]
                times[index] += run[warmup:]
                del args
                if progress is not None:
                    progress(f"pass {sweep}/{passes}, shape {index + 1}/{len(shapes)} ({shape.kind})")
    rows = []
    for shape, kept in zip(shapes, times):
        q1, median, q3 = np.percentile(np.array(kept), [25, 50, 75])
        rows.append(shape.measurement(float(median), float(q3 - q1)))
    name = torch.cuda.get_device_name() if device == "cuda" else \
        f"cpu ({torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''}, torch {torch.__version__})"
    dtype_bytes = torch.tensor([], dtype=dtype).element_size()
    return MeasurementTable(name, cfg.shape(dtype_bytes), tuple(rows)), time.perf_counter() - started


def _time_once(torch, device: str, run: Callable[[], object], cpu_clock: str = "wall") -> float:
    """Microseconds of one forward pass."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1000.0
    clock = time.thread_time if cpu_clock == "thread" else time.perf_counter
    began = clock()
    run()
    return (clock() - began) * 1e6
