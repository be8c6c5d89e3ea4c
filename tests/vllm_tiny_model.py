"""A tiny random-weight Llama and a byte-level BPE tokenizer, built locally in a few seconds,
so the real vLLM engine runs in CI with no model download:

* tokenizer: `tokenizers` byte-level BPE (up to 512 tokens, every byte representable)
  trained on a seeded synthetic corpus, special token `<|endoftext|>` (id 0, padding only),
  saved through transformers' PreTrainedTokenizerFast with a chat template;
* model: transformers `LlamaConfig` hidden 64, head_dim 32 (vLLM's CPU attention needs
  head_dim ≥ 32), 2 layers, 4 heads, 2 KV heads, random weights from a fixed seed, saved as
  safetensors in float16 (bf16 with enforce_eager and a ≤ 4-token first prompt dies with
  SIGILL on some CPUs).

Neither declares an end-of-sequence token: random weights would sample one at random and
end a stream early, so here a stream ends only at max_tokens, a stop string or an abort,
and every test can assert exact lengths.

    python -m tests.vllm_tiny_model DIR     # build into DIR (reused if already complete)
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

EOS = "<|endoftext|>"
VOCAB_SIZE = 512
MAX_POSITIONS = 4096
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_WORDS = (
    "the a fleet router worker token block cache prefix queue request stream priority engine "
    "model prefill decode batch latency budget admission tenant chunk hash chain event heart "
    "beat schedule vllm nats tokenyard hello world story long short fast slow green blue"
).split()


def _corpus(lines: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 16))) for _ in range(lines)]


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token=EOS, pad_token=EOS,
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def build_model(out: Path, vocab_size: int, pad_id: int, dtype: str = "float16") -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=MAX_POSITIONS,
        bos_token_id=None, eos_token_id=None, pad_token_id=pad_id, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    model.save_pretrained(str(out), safe_serialization=True)
    # transformers 5 writes `dtype`; older readers look for `torch_dtype`.
    cfg_file = out / "config.json"
    data = json.loads(cfg_file.read_text())
    data["torch_dtype"] = dtype
    cfg_file.write_text(json.dumps(data, indent=2))


def build(out: str | Path) -> Path:
    """Build the tiny model into `out` (skipped when a complete build is there)."""
    out = Path(out)
    done = out / ".complete"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    build_model(out, tok.get_vocab_size(), tok.token_to_id(EOS))
    done.write_text("ok\n")
    return out


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tokenyard-tiny-llama"))
