"""The "model dir" Dynamo's frontend and TRT-LLM sidecar read (`--model-path`): a tokenizer and
the HuggingFace config files, no weights. Built from the tests' own small byte-level BPE
(tests/load/small_tokenizer.py), so no hub access and no corpus from another package.

The vocabulary is the small tokenizer's own (a few hundred ids, as a real model's is its own):
the mockers are started with `--tokenizer DIR` and emit only its ids (docs/mocker.md "Tokens").
Without that, Dynamo's detokenizer gets ids outside the vocabulary, emits no text for them and
merges them into the next chunk (tok/chunk > 1, or no content at all).

What Dynamo reads from it: tokenizer.json (tokenizing prompts, detokenizing the engine's ids),
tokenizer_config.json (bos/eos and the chat template for /v1/chat/completions), config.json
(model type, vocab size, context length, eos ids) and generation_config.json (eos ids).

    python -m tests.interop.model_dir DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.load.small_tokenizer import SPECIAL, make_tokenizer

BOS, EOS = SPECIAL  # "<s>", "</s>"
CONTEXT_LENGTH = 32768  # the mocker's default --context-length
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def _dump(obj: object, path: Path) -> None:
    path.write_text(json.dumps(obj, indent=1))


def build_model_dir(directory: Path) -> Path:
    """Write the model dir into DIRECTORY (deterministic); returns DIRECTORY."""
    from tokenizers import Tokenizer

    make_tokenizer(directory)
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    _dump({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
        "model_max_length": CONTEXT_LENGTH, "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(tok.token_to_id(s)): {"content": s, "special": True, "lstrip": False,
                                      "rstrip": False, "normalized": False,
                                      "single_word": False}
            for s in SPECIAL
        },
    }, directory / "tokenizer_config.json")
    _dump({"bos_token": BOS, "eos_token": EOS}, directory / "special_tokens_map.json")
    # A Llama-shaped config (8 KV heads x head_dim 128, bf16): the sizes only feed KV estimates.
    _dump({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": tok.get_vocab_size(), "max_position_embeddings": CONTEXT_LENGTH,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "bos_token_id": bos,
        "eos_token_id": eos, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    }, directory / "config.json")
    _dump({"bos_token_id": bos, "eos_token_id": eos}, directory / "generation_config.json")
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(build_model_dir(Path(sys.argv[1]).resolve()))
