#!/usr/bin/env python3
"""A Hugging Face checkpoint folder made from a GGUF file by Hugging Face transformers' own
GGUF conversion: the test fixture for weft's decoders from safetensors.

No Hugging Face checkpoint of the two models is reachable here (the hub is out of reach and no
PyPI package ships one), so the folder is made from the GGUF file weft runs, the way
`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` converts it:
- `config.json`: `AutoConfig.from_pretrained(dir, gguf_file=...)`, saved by transformers;
- `tokenizer.json`, `tokenizer_config.json` (and the chat template): `TokenizersBackend
  .from_pretrained(dir, gguf_file=...)`, saved by transformers;
- `model.safetensors`: transformers' `load_gguf_checkpoint(..., return_tensors=True)`, which
  dequantizes every tensor with gguf-py, undoes llama.cpp's conversion (the Q/K row permutation
  of Llama, the +1 of Gemma's norms) and renames it with gguf-py's tensor map; written with the
  `safetensors` package in the dtype asked for.

transformers 5.23 wraps the arrays in torch tensors and instantiates the model to learn its
parameter names; torch is not installed here, so the tensors stay NumPy arrays (a stand-in
`torch.from_numpy`) and the names come from a stand-in model listing the architecture's
parameters (gguf-py maps each; a name it does not know leaves its tensor out, and weft then
refuses the folder).

usage: V/bin/python scripts/hf_checkpoint_from_gguf.py MODEL.gguf OUTDIR f32|f16
"""
import json
import os
import sys
import types

import numpy as np


def parameter_names(model_type, n_layers, tied):
    """The parameter names of transformers' LlamaForCausalLM / Gemma3ForCausalLM."""
    per_layer = {
        "llama": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                  "post_attention_layernorm"],
        "gemma3_text": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                        "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
                        "mlp.down_proj", "input_layernorm", "post_attention_layernorm",
                        "pre_feedforward_layernorm", "post_feedforward_layernorm"],
    }[model_type]
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    names += [f"model.layers.{i}.{p}.weight" for i in range(n_layers) for p in per_layer]
    if not tied:
        names.append("lm_head.weight")
    return names


class StandInModel:
    """What `get_gguf_hf_weights_map` asks of a model: its config and parameter names."""

    def __init__(self, config):
        self.config = config

    def state_dict(self):
        tied = getattr(self.config, "tie_word_embeddings", True)
        return dict.fromkeys(parameter_names(self.config.model_type, self.config.num_hidden_layers, tied))

    def named_children(self):
        return []


def without_torch():
    """transformers' GGUF modules with NumPy arrays where they would make torch tensors: its
    metadata reader replaced by the one of `bpe_tokenize_reference.py` (the reader module imports
    torch for the tensors), and its tensor conversion handing back arrays."""
    import gguf
    import transformers  # noqa: F401  (imported before the reader module is replaced)
    from bpe_tokenize_reference import read_gguf_metadata

    # transformers opens the file four times (config, tokenizer, tensors), and gguf-py's reader
    # spends half a minute on Gemma's 262k-token vocabulary each time: parse it once.
    reader, cache = gguf.GGUFReader, {}

    def cached_reader(path, *args):
        key = (os.path.abspath(path), args)
        if key not in cache:
            cache[key] = reader(path, *args)
        return cache[key]

    gguf.GGUFReader = cached_reader

    fake = types.ModuleType("transformers.integrations.gguf.reader")
    fake.read_gguf_metadata = read_gguf_metadata
    sys.modules["transformers.integrations.gguf.reader"] = fake
    import transformers.modeling_gguf_pytorch_utils as m

    m.is_torch_available = lambda: True
    m.torch = types.SimpleNamespace(from_numpy=lambda a: a)
    return m


def main(gguf_path, outdir, dtype):
    from safetensors.numpy import save_file

    m = without_torch()
    from transformers import AutoConfig, TokenizersBackend

    folder, name = os.path.split(os.path.abspath(gguf_path))
    os.makedirs(outdir, exist_ok=True)

    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.save_pretrained(outdir)
    TokenizersBackend.from_pretrained(folder, gguf_file=name).save_pretrained(outdir)

    parsed = m.load_gguf_checkpoint(gguf_path, return_tensors=True, model_to_load=StandInModel(config))
    want = {"f32": np.float32, "f16": np.float16}[dtype]
    tensors = {k: np.ascontiguousarray(v.astype(want)) for k, v in parsed["tensors"].items()}
    missing = set(StandInModel(config).state_dict()) - set(tensors)
    if missing:
        sys.exit(f"transformers' conversion gave no tensor for {sorted(missing)[:5]}")
    out = os.path.join(outdir, "model.safetensors")
    save_file(tensors, out + ".tmp", metadata={"format": "pt"})
    os.replace(out + ".tmp", out)
    print(json.dumps({"tensors": len(tensors), "config": config.to_dict()["model_type"]}))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
