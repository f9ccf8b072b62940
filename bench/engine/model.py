"""The tiny model the engine serves: a llama-architecture GGUF with random weights.

No weights can be downloaded here, and none are needed: what the project measures is the
engine's work per token (prefill, decode), its prompt cache and its batching, all of which
depend on the model's shape, not on what it learned. The vocabulary and tokenizer are
llama.cpp's own (`ggml-vocab-llama-spm.gguf`, a vocab-only file the sdist ships), so prompts
tokenize as a real llama tokenizer cuts them. Weights are drawn from a seeded generator: the
same shape and seed write the same file. The shape and why: docs/engine.md, "The model".
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

VOCAB_FILE = "ggml-vocab-llama-spm.gguf"
ARCHITECTURE = "llama"
#: A plain role-tagged template: llama-server renders chat requests with it (`--jinja`), so
#: the system prompt comes first and a repeated system prompt is a repeated prefix.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class Shape:
    """The model's dimensions (llama's hyperparameters)."""

    blocks: int = 2
    embedding: int = 64
    heads: int = 4
    kv_heads: int = 4
    feed_forward: int = 4096
    context: int = 32768


SHAPE = Shape()
SEED = 32


def path_in(folder: Path, shape: Shape = SHAPE, seed: int = SEED) -> Path:
    """The model's file: named by its shape and seed, so a changed shape writes a new file."""
    digest = hashlib.sha256(json.dumps([asdict(shape), seed, CHAT_TEMPLATE]).encode())
    return folder / (f"tiny-llama-{shape.blocks}x{shape.embedding}-s{seed}-"
                     f"{digest.hexdigest()[:8]}.gguf")


def ensure(folder: Path, vocab: Path, shape: Shape = SHAPE, seed: int = SEED) -> Path:
    """The model file, written once (to a temporary name, then renamed)."""
    path = path_in(folder, shape, seed)
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    write(partial, vocab, shape, seed)
    os.replace(partial, path)
    return path


def _tensors(shape: Shape, vocab_size: int, seed: int) -> dict[str, object]:
    """Weights N(0, 0.02), norms 1; the output projection is tied to the embedding (llama.cpp
    reuses `token_embd` when `output.weight` is absent), which halves the file."""
    import numpy as np

    rng = np.random.default_rng(seed)
    d, ff = shape.embedding, shape.feed_forward
    d_kv = d // shape.heads * shape.kv_heads

    def normal(*dims: int) -> object:
        return rng.normal(0.0, 0.02, size=dims).astype(np.float32)

    tensors: dict[str, object] = {"token_embd.weight": normal(vocab_size, d)}
    for block in range(shape.blocks):
        prefix = f"blk.{block}."
        tensors.update({
            prefix + "attn_norm.weight": np.ones(d, dtype=np.float32),
            prefix + "attn_q.weight": normal(d, d),
            prefix + "attn_k.weight": normal(d_kv, d),
            prefix + "attn_v.weight": normal(d_kv, d),
            prefix + "attn_output.weight": normal(d, d),
            prefix + "ffn_norm.weight": np.ones(d, dtype=np.float32),
            prefix + "ffn_gate.weight": normal(ff, d),
            prefix + "ffn_up.weight": normal(ff, d),
            prefix + "ffn_down.weight": normal(d, ff),
        })
    tensors["output_norm.weight"] = np.ones(d, dtype=np.float32)
    return tensors


def write(path: Path, vocab: Path, shape: Shape = SHAPE, seed: int = SEED) -> None:
    """Write the GGUF: llama hyperparameters, every `tokenizer.*` key of `vocab` copied as it
    is, the chat template, the seeded weights."""
    import gguf

    reader = gguf.GGUFReader(vocab)
    tokenizer_fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    vocab_size = len(tokenizer_fields["tokenizer.ggml.tokens"].data)

    writer = gguf.GGUFWriter(path, ARCHITECTURE)
    writer.add_name(f"ttft-tiny-llama-{shape.blocks}x{shape.embedding}")
    writer.add_block_count(shape.blocks)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.embedding)
    writer.add_feed_forward_length(shape.feed_forward)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(shape.embedding // shape.heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, field in tokenizer_fields.items():
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), value_type, sub_type)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in _tensors(shape, vocab_size, seed).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
