#!/usr/bin/env python3
"""A Partita model file as the PyTorch benchmark peer builds it, without
PyTorch: the shape with Partita's defaults filled in (docs/formats.md,
"Model"), the seq / layers overrides the benchmark runs at, and the list of
parameter tensors a model of that shape holds. torch_llama.py builds its
model from this list's shape and checks its tensors against the list, so
the count printed here is the count the PyTorch model trains.

Usage:
  llama_shape.py MODEL.json [--seq N] [--layers N] [--write OUT.json]
      prints "PARAMETERS model=NAME parameters=N layers=L seq=S
      source=spec"; with --write, writes the overridden model file (read
      by exec_bench and torch_llama.py alike, so both run one shape)
"""
import argparse
import json
import sys

# Partita's defaults for the keys a GPT-2 model file leaves out
# (common/model.c).
DEFAULTS = {
    "tied_embeddings": True,
    "norm": "layernorm",
    "mlp": "gelu",
    "positions": "learned",
    "bias": True,
}
DEFAULT_NORM_EPS = 1e-5        # RMSNorm's when the file gives none
LAYERNORM_EPS = 1e-5           # LayerNorm's (fixed)
DEFAULT_ROPE_BASE = 10000.0


class ShapeError(Exception):
    """A model file this benchmark cannot run: the message names the
    file, the field and the reason."""


def complete(raw, path):
    """The model's fields with Partita's defaults filled in."""
    shape = dict(DEFAULTS)
    shape.update(raw)
    for key in ("name", "layers", "hidden", "heads", "seq", "vocab"):
        if key not in raw:
            raise ShapeError(f"{path}: {key}: missing")
    shape.setdefault("ffn_hidden", 4 * shape["hidden"])
    shape.setdefault("kv_heads", shape["heads"])
    shape.setdefault("qkv_bias", shape["bias"])
    if shape["norm"] == "rmsnorm":
        shape.setdefault("norm_eps", DEFAULT_NORM_EPS)
    else:
        shape["norm_eps"] = LAYERNORM_EPS
    if shape["positions"] == "rope":
        shape.setdefault("rope_base", DEFAULT_ROPE_BASE)
    if shape["hidden"] % shape["heads"] != 0:
        raise ShapeError(f"{path}: heads: {shape['heads']} does not divide "
                         f"hidden {shape['hidden']}")
    if shape["heads"] % shape["kv_heads"] != 0:
        raise ShapeError(f"{path}: kv_heads: {shape['kv_heads']} does not "
                         f"divide heads {shape['heads']}")
    if shape["positions"] == "rope" and (shape["hidden"] //
                                         shape["heads"]) % 2 != 0:
        raise ShapeError(f"{path}: heads: rotary positions need an even "
                         f"head size")
    return shape


def load(path, seq=None, layers=None):
    """The model file at path, completed, with seq and layers replaced
    where given (the name then says so, and notes say what changed)."""
    with open(path) as f:
        raw = json.load(f)
    changes = []
    if layers is not None and layers != raw.get("layers"):
        changes.append(f"{layers} of its {raw.get('layers')} layers")
        raw["layers"] = layers
        raw["name"] = f"{raw.get('name')}-{layers}l"
    if seq is not None and seq != raw.get("seq"):
        changes.append(f"seq {seq} (the file's {raw.get('seq')})")
        raw["seq"] = seq
        raw["name"] = f"{raw.get('name')}-s{seq}"
    if changes:
        raw["notes"] = (f"benchmark copy of {path}: " + ", ".join(changes) +
                        "; bench/exec_vs_torch/llama_shape.py wrote it")
    for key in ("layers", "seq"):
        if not isinstance(raw.get(key), int) or raw[key] < 1:
            raise ShapeError(f"{path}: {key}: must be an integer >= 1")
    return raw, complete(raw, path)


def write(raw, path):
    """Writes a model file (raw: load's first result)."""
    with open(path, "w") as f:
        json.dump(raw, f, indent=2)
        f.write("\n")


def parameter_tensors(shape):
    """(name, dimensions) of every trained tensor, a tied head counted
    once (it is the token embedding), in the order of Partita's layout:
    the embeddings, each layer's norms and linear layers, the final norm
    and an untied head."""
    hidden, ffn = shape["hidden"], shape["ffn_hidden"]
    head_size = hidden // shape["heads"]
    qkv_rows = hidden + 2 * shape["kv_heads"] * head_size
    fc_rows = 2 * ffn if shape["mlp"] == "swiglu" else ffn
    bias, qkv_bias = shape["bias"], shape["qkv_bias"]
    tensors = [("token_embedding.weight", (shape["vocab"], hidden))]
    if shape["positions"] == "learned":
        tensors.append(("position_embedding.weight", (shape["seq"], hidden)))

    def norm(prefix):
        tensors.append((f"{prefix}.weight", (hidden,)))
        if shape["norm"] == "layernorm":
            tensors.append((f"{prefix}.bias", (hidden,)))

    def linear(prefix, rows, columns, with_bias):
        tensors.append((f"{prefix}.weight", (rows, columns)))
        if with_bias:
            tensors.append((f"{prefix}.bias", (rows,)))

    for layer in range(shape["layers"]):
        prefix = f"layers.{layer}"
        norm(f"{prefix}.ln1")
        linear(f"{prefix}.attn.qkv", qkv_rows, hidden, qkv_bias)
        linear(f"{prefix}.attn.proj", hidden, hidden, bias)
        norm(f"{prefix}.ln2")
        linear(f"{prefix}.mlp.fc", fc_rows, hidden, bias)
        linear(f"{prefix}.mlp.proj", hidden, ffn, bias)
    norm("final_norm")
    if not shape["tied_embeddings"]:
        tensors.append(("head.weight", (shape["vocab"], hidden)))
    return tensors


def parameter_count(tensors):
    count = 0
    for _, dims in tensors:
        size = 1
        for d in dims:
            size *= d
        count += size
    return count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--seq", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--write", metavar="OUT.json")
    args = parser.parse_args()
    try:
        raw, shape = load(args.model, args.seq, args.layers)
    except (OSError, ValueError, ShapeError) as error:
        print(f"llama_shape.py: {error}", file=sys.stderr)
        return 2
    if args.write:
        write(raw, args.write)
    print(f"PARAMETERS model={shape['name']} "
          f"parameters={parameter_count(parameter_tensors(shape))} "
          f"layers={shape['layers']} seq={shape['seq']} source=spec")
    return 0


if __name__ == "__main__":
    sys.exit(main())
