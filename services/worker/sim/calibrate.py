"""Reduce the published measurements in data/calibration (tokenyard.data) to the numbers the latency
model reads (data/vidur.json), so every coefficient can be traced back to a row:

    linear ops, per layer (ms) at n tokens = Σ medians of input_layernorm, attn_pre_proj,
        attn_rope, attn_post_proj, post_attention_layernorm, mlp_up_proj, mlp_act,
        mlp_down_proj, add            (one row per token count, tensor parallel 1; the
        embedding is left out: once per model and < 0.1% of a step)
    prefill attention, per layer (ms), one chunk of N new tokens on K cached ones
        = p0 + p1·N + p2·N²/2 + p3·N·K     least squares, relative error, over Vidur's rows
    decode attention, per layer (ms), B sequences with Σctx tokens of context
        = d0 + d2·Σctx                     the same (d1·B fits negative, so it is left out)

Vidur's prefill "KV save" column is left out (the calibration notes take it for a profiling
artefact), so the tables reproduced are the README's "no KV-save" ones.

The MoE profile (h100-qwen3-30b-a3b) has two free efficiencies of its roofline; `--fit-moe`
bisects them, alternately, until a simulated run of vLLM PR #23151's benchmark (closed_loop.py:
concurrency 10, 2048 in / 1024 out) gives its mean TPOT 13.18 ms and mean TTFT 267 ms, and
writes them into data/profiles.json. Two numbers fitted to two numbers: this pins the
profile, it does not validate it.

    python -m tokenyard.services.worker.sim.calibrate           rewrite data/vidur.json
    python -m tokenyard.services.worker.sim.calibrate --check   exit 1 if it differs from a fresh reduction
    python -m tokenyard.services.worker.sim.calibrate --fit-moe refit the MoE efficiencies
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import sys
from pathlib import Path

import numpy as np
from tokenyard.data import CALIBRATION as CALIBRATION_DIR

OUT = Path(__file__).with_name("data") / "vidur.json"

VIDUR = "microsoft/vidur data/profiling/compute/{device}/{model}/mlp.csv (MIT), copied to data/calibration/{file}"
TABLES = {
    "a100/Meta-Llama-3-8B": "a100_meta-llama_Meta-Llama-3-8B_mlp.csv.gz",
    "a100/Llama-2-7b-hf": "a100_meta-llama_Llama-2-7b-hf_mlp.csv.gz",
    "h100/Llama-2-7b-hf": "h100_meta-llama_Llama-2-7b-hf_mlp.csv.gz",
}
OPS = (
    "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
    "mlp_up_proj", "mlp_act", "mlp_down_proj", "add",
)
ATTENTION = "a100_llama3_8b_attention_excerpt.csv"


def linear_table(path: Path) -> tuple[list[int], list[float]]:
    """Token count → Σ per-layer op medians (ms), first row per count, TP 1."""
    by_n: dict[int, float] = {}
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        for row in csv.DictReader(f):
            if row["num_tensor_parallel_workers"] != "1":
                continue
            n = int(row["num_tokens"])
            if n not in by_n:
                by_n[n] = sum(float(row[f"time_stats.{op}.median"]) for op in OPS)
    tokens = sorted(by_n)
    return tokens, [round(by_n[n], 6) for n in tokens]


def _fit(columns: list[list[float]], y: list[float]) -> list[float]:
    a, t = np.array(columns, dtype=float), np.array(y, dtype=float)
    w = 1.0 / t
    coef, *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    return [float(f"{c:.6g}") for c in coef]


def attention_fit(path: Path) -> dict:
    with path.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    pre = [r for r in rows if r["phase"] == "prefill"]
    dec = [r for r in rows if r["phase"] == "decode"]
    p = _fit(
        [[1, int(r["prefill_chunk_size"]), int(r["prefill_chunk_size"]) ** 2 / 2,
          int(r["prefill_chunk_size"]) * int(r["kv_cache_size"])] for r in pre],
        [float(r["attn_median"]) for r in pre],
    )
    d = _fit(
        [[1, int(r["batch_size"]) * int(r["kv_cache_size"])] for r in dec],
        [float(r["attn_median"]) for r in dec],
    )
    return {
        "source": "microsoft/vidur attention.csv for a100/meta-llama/Meta-Llama-3-8B (FlashInfer, block 16, TP 1), "
                  f"rows in data/calibration/{ATTENTION}; least squares on relative error by calibrate.py",
        "prefill_per_layer_ms": {"p0": p[0], "p1_per_token": p[1], "p2_self": p[2], "p3_ctx": p[3], "rows": len(pre)},
        "decode_per_layer_ms": {"d0": d[0], "d2_per_ctx_token": d[1], "rows": len(dec)},
    }


def reduce(cal_dir: Path = CALIBRATION_DIR) -> dict:
    linear = {}
    for key, file in TABLES.items():
        device, model = key.split("/")
        tokens, ms = linear_table(cal_dir / file)
        org = "meta-llama"
        linear[key] = {
            "source": VIDUR.format(device=device, model=f"{org}/{model}", file=file),
            "tokens": tokens,
            "ms_per_layer": ms,
        }
    return {"linear_per_layer_ms": linear, "attention_a100_llama3_8b": attention_fit(cal_dir / ATTENTION)}


MOE_PROFILE = "h100-qwen3-30b-a3b"
MOE_TARGET = {"concurrency": 10, "input_len": 2048, "output_len": 1024, "num_prompts": 20,
              "mean_tpot_ms": 13.18, "mean_ttft_ms": 267.0}
"""vLLM PR #23151: Qwen3-30B-A3B, H100, bf16, TP 1 (README "Other published figures")."""


def moe_benchmark(memory_efficiency: float, compute_efficiency: float):
    from tokenyard.services.worker.sim import closed_loop, latency

    data, vidur = latency._load()
    fit = {"memory_efficiency": memory_efficiency, "compute_efficiency": compute_efficiency}
    prof = latency._build(MOE_PROFILE, data, vidur, fit)
    t = MOE_TARGET
    return closed_loop.run(prof, t["concurrency"], t["input_len"], t["output_len"], t["num_prompts"])


def fit_moe(rounds: int = 4) -> dict[str, float]:
    def bisect(f, target: float) -> float:  # f decreasing on (0, 1]
        lo, hi = 0.01, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
        return (lo + hi) / 2

    m, c = 0.7, 0.7
    for _ in range(rounds):
        m = bisect(lambda x, c=c: moe_benchmark(x, c).mean_tpot_ms, MOE_TARGET["mean_tpot_ms"])
        c = bisect(lambda x, m=m: moe_benchmark(m, x).mean_ttft_ms, MOE_TARGET["mean_ttft_ms"])
    return {"memory_efficiency": round(m, 4), "compute_efficiency": round(c, 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--calibration-dir", type=Path, default=CALIBRATION_DIR)
    ap.add_argument("--fit-moe", action="store_true")
    args = ap.parse_args(argv)
    if args.fit_moe:
        fit = fit_moe()
        path = OUT.with_name("profiles.json")
        text = path.read_text()
        for key, value in fit.items():
            text = re.sub(rf'"{key}": [0-9.]+', f'"{key}": {value}', text, count=1)
        path.write_text(text)
        print(f"{MOE_PROFILE}: {fit} -> {path}")
        return 0
    fresh = reduce(args.calibration_dir)
    if args.check:
        same = json.loads(OUT.read_text()) == fresh
        print("data/vidur.json is up to date" if same else "data/vidur.json differs from the calibration data")
        return 0 if same else 1
    OUT.write_text(json.dumps(fresh, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
