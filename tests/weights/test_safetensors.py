"""Exact weights from a local checkpoint's safetensors headers (issue 34, part 1).

The checkpoints are written here with json + struct as the safetensors format specifies (huggingface/safetensors
README, "Format": an 8-byte little-endian header length, a JSON header of ``{name: {dtype, shape, data_offsets}}``,
then the data). The tiny Llama below has hidden 64, 4 heads of 16 (2 KV heads), an MLP of 128, 2 layers and a
vocabulary of 256, untied; every number is computed by hand in the comments.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kvpools_core import ConfigError, Serving, estimate_weights

ELEMENT = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4}

CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def llama_tensors(dtype: str = "BF16") -> dict[str, tuple[str, list[int]]]:
    tensors: dict[str, tuple[str, list[int]]] = {
        "model.embed_tokens.weight": (dtype, [256, 64]),
        "model.norm.weight": (dtype, [64]),
        "lm_head.weight": (dtype, [256, 64]),
    }
    for layer in range(2):
        p = f"model.layers.{layer}"
        tensors |= {
            f"{p}.self_attn.q_proj.weight": (dtype, [64, 64]),
            f"{p}.self_attn.k_proj.weight": (dtype, [32, 64]),
            f"{p}.self_attn.v_proj.weight": (dtype, [32, 64]),
            f"{p}.self_attn.o_proj.weight": (dtype, [64, 64]),
            f"{p}.mlp.gate_proj.weight": (dtype, [128, 64]),
            f"{p}.mlp.up_proj.weight": (dtype, [128, 64]),
            f"{p}.mlp.down_proj.weight": (dtype, [64, 128]),
            f"{p}.input_layernorm.weight": (dtype, [64]),
            f"{p}.post_attention_layernorm.weight": (dtype, [64]),
        }
    return tensors


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file with zeroed data: the header the format specifies, then the bytes it points at."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = ELEMENT[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def checkpoint(
    directory: Path, tensors: dict[str, tuple[str, list[int]]], config: dict[str, object] | None = None, shards: int = 1
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or CONFIG))
    if shards == 1:
        write_safetensors(directory / "model.safetensors", tensors)
        return directory
    names = list(tensors)
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = names[shard::shards]
        write_safetensors(directory / file, {name: tensors[name] for name in part})
        weight_map |= dict.fromkeys(part, file)
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


# Parameters: a layer 64·64 + 2·32·64 + 64·64 (attention 12 288) + 3·128·64 (MLP 24 576) + 2·64 norms = 36 992;
# two layers 73 984, embedding and head 2·256·64 = 32 768, final norm 64: 106 816, 213 632 B in bf16.
# At TP 2 a rank holds q 32·64, k and v one KV head 16·64 each, o 64·32 (6 144), gate/up 64·64 each and down 64·64
# (12 288), both norms (128): 18 560 a layer, 37 120 for two; the vocabulary 256 (a multiple of 64, even over 2)
# gives 128 rows of 64 to the embedding and the head (16 384), and the final norm 64: 53 568 parameters, 107 136 B.
PARAMETERS, BYTES, TP2_BYTES = 106_816, 213_632, 107_136


@pytest.mark.parametrize("shards", [1, 3])
def test_headers_give_the_bytes_a_rank_holds(tmp_path: Path, shards: int) -> None:
    directory = checkpoint(tmp_path / "tiny", llama_tensors(), shards=shards)
    whole = estimate_weights(directory)
    assert (whole.method, whole.parameters, whole.bytes_total, whole.bytes_per_rank) == (
        "safetensors",
        PARAMETERS,
        BYTES,
        BYTES,
    )
    tp2 = estimate_weights(directory, Serving(tp_size=2))
    assert tp2.bytes_per_rank == TP2_BYTES
    # The config-only estimate of the same layout agrees: the headers hold exactly the tensors it lays out.
    assert estimate_weights(tmp_path / "tiny" / "config.json", Serving(tp_size=2)).bytes_per_rank == TP2_BYTES
    assert any("exact, from the safetensors headers" in note for note in tp2.notes)


def test_a_config_without_a_checkpoint_stays_an_estimate(tmp_path: Path) -> None:
    directory = tmp_path / "bare"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(CONFIG))
    assert estimate_weights(directory).method == "estimate"


def test_what_the_config_does_not_say_comes_from_the_headers(tmp_path: Path) -> None:
    """Layer 0's attention stored fp8 with a float32 per-tensor scale (the config names no quantisation), and a
    tensor the Llama layout does not have. Whole: layer 0's four attention weights take 12 288 B in fp8 instead of
    24 576 B, plus four 4-byte scales (16 B); the extra ``rotary_emb.inv_freq`` F32 [8] is 32 B:
    213 632 - 12 288 + 16 + 32 = 201 392 B. At TP 2 the fp8 weights take half (6 144 B rather than 12 288 B), each
    scale is split in its module's proportion (rounded up: 2 + 2 + 2 + 2 = 8 B; k/v keep one of two KV heads)
    and the unmatched tensor is whole: 107 136 - 6 144 + 8 + 32 = 101 032 B."""
    tensors = llama_tensors()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        module = f"model.layers.0.self_attn.{name}"
        tensors[f"{module}.weight"] = ("F8_E4M3", tensors[f"{module}.weight"][1])
        tensors[f"{module}.weight_scale"] = ("F32", [1])
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = ("F32", [8])
    directory = checkpoint(tmp_path / "mixed", tensors)
    whole = estimate_weights(directory)
    assert whole.bytes_total == 201_392
    assert whole.bytes_per_rank == 201_392
    assert estimate_weights(directory, Serving(tp_size=2)).bytes_per_rank == 101_032
    assert any("1 checkpoint tensor(s) (32 B) are not in the architecture's layout" in n for n in whole.notes)


def test_a_float32_checkpoint_loads_in_the_served_dtype(tmp_path: Path) -> None:
    """Float32 tensors of a bfloat16 config load as bfloat16 (the engine casts unquantised weights to the model
    dtype): the same bytes as the bf16 checkpoint, half the file's."""
    directory = checkpoint(tmp_path / "f32", llama_tensors("F32"))
    assert estimate_weights(directory).bytes_total == BYTES


def test_pipeline_stage_and_experts_by_name(tmp_path: Path) -> None:
    """PP 2, stage 1 keeps layer 1, the final norm and the head: 36 992 + 64 + 16 384 = 53 440 parameters,
    106 880 B."""
    directory = checkpoint(tmp_path / "tiny", llama_tensors())
    stage = Serving(pp_size=2, pp_rank=1)
    assert estimate_weights(directory, stage).bytes_per_rank == 106_880


def test_a_broken_header_is_refused_naming_the_file(tmp_path: Path) -> None:
    directory = tmp_path / "broken"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(CONFIG))
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(ConfigError, match=r"model\.safetensors: not a readable safetensors file .*weights.memory"):
        estimate_weights(directory)


def test_the_plan_says_which_weights_it_used(tmp_path: Path) -> None:
    from kvpools_core import plan

    directory = checkpoint(tmp_path / "tiny", llama_tensors())
    result = plan(str(directory), gpu="h100")
    assert result.budget.weights_bytes == BYTES
    assert result.budget.steps[-1].startswith("weights: exact, from the checkpoint's safetensors headers")
    bare = plan(str(directory / "config.json"), gpu="h100")
    assert bare.budget.steps[-1].startswith("weights: estimated from config.json")
