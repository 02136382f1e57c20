"""The real-engine tests' model: a small Llama-shaped model with seeded random weights, written
without torch, transformers or the hub (numpy and a hand-written safetensors file).

Why random weights: the tests measure a real engine's scheduling and compute (vLLM's attention
and matmuls on the CPU), not what it writes; a trained model would need a download. The
vocabulary is the given tokenizer's (a HuggingFace tokenizer.json dir, copied in), so prompts
built with it are exact in the engine too. Same seed, same bytes.

    python -m tests.realengine.model TOKENIZER_DIR OUT_DIR
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

LAYERS = 4
HIDDEN = 512
HEADS = 8
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 1408
MAX_POSITION = 8192
SEED = 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def bf16(values: np.ndarray) -> bytes:
    """float32 -> bfloat16 bytes: the top 16 bits of each float32 (truncation)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


def shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model, HuggingFace Llama names (untied embeddings)."""
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, HIDDEN)}
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": (kv, HIDDEN),
            p + "self_attn.v_proj.weight": (kv, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_attention_layernorm.weight": (HIDDEN,),
        }
    out["model.norm.weight"] = (HIDDEN,)
    out["lm_head.weight"] = (vocab, HIDDEN)
    return out


def write_safetensors(path: Path, vocab: int, seed: int = SEED) -> int:
    """The weights (norms 1, the rest N(0, 0.02) from `seed`) as one bf16 safetensors file;
    returns the number of parameters."""
    rng = np.random.default_rng(seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, shape in shapes(vocab).items():
        if name.endswith("norm.weight"):
            data = bf16(np.ones(shape, np.float32))
        else:
            data = bf16(rng.standard_normal(shape, np.float32) * np.float32(0.02))
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)
    return offset // 2


def config(vocab: int, bos: int | None, eos: int | None) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab, "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_POSITION, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": bos, "eos_token_id": eos,
    }


def write_model(tokenizer_dir: Path, out: Path) -> Path:
    """The model dir at OUT (config.json, model.safetensors, the tokenizer's files); returns OUT.
    Skips the work when OUT already holds it."""
    from tokenizers import Tokenizer

    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        return out
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, tmp / name)
    cfg = config(vocab, tok.token_to_id("<s>"), tok.token_to_id("</s>"))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    write_safetensors(tmp / "model.safetensors", vocab)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


if __name__ == "__main__":
    print(write_model(Path(sys.argv[1]), Path(sys.argv[2])))
