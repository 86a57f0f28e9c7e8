"""hf_transformers: Hugging Face transformers on the same GGUF, float32, on the CPU.

    touchstone parity --backend "exec:python3 -m touchstone_engine.examples.hf_transformers" \\
        --weights full_precision --case narrative --manifest goldens/manifest.json

Opt-in (docs/python-engines.md): needs torch, transformers and gguf (transformers
reads GGUF through it), about 0.5 GB of wheels without torch's CUDA
dependencies. `python3 -m touchstone_engine.examples.hf_transformers --check`
exits 77 (SKIP) with the reason when they cannot be imported.

The model is loaded with AutoModelForCausalLM.from_pretrained(dir, gguf_file=name,
dtype=float32): transformers dequantizes every tensor to float32 and undoes
llama.cpp's Q/K row permutation, then computes with its own modeling code
(rotate_half RoPE, float32 softmax and matmuls): an independent implementation
of the same model, compared with the reference's goldens. The KV cache is a
DynamicCache; rewind crops it.
"""

import os
import sys

from touchstone_engine import (TS_CAP_ALL_POSITION_LOGITS, TS_ERR_IO, TS_ERR_UNSUPPORTED,
                               Capabilities, Engine, EngineError, Session, serve)

SKIP = 77


def missing_packages():
    """The reason the example cannot run here, or None."""
    missing = []
    for name in ("numpy", "torch", "transformers", "gguf"):
        try:
            __import__(name)
        except Exception as e:  # ImportError, or a broken install (missing CUDA libraries)
            missing.append(f"{name} ({type(e).__name__}: {e})")
    if missing:
        return ("cannot import " + "; ".join(missing) +
                " (pip install 'touchstone-engine[hf]': torch, transformers, gguf)")
    return None


class HFSession(Session):
    def __init__(self, model, max_context):
        import torch
        from transformers import DynamicCache
        self.torch = torch
        self.model = model
        self.cache = DynamicCache()
        self.pos = 0
        self.max_ctx = max_context or model.n_ctx

    def position(self):
        return self.pos

    def max_context(self):
        return self.max_ctx

    def prefill(self, tokens, all_positions):
        torch = self.torch
        n = len(tokens)
        ids = torch.tensor([tokens], dtype=torch.long)
        cache_position = torch.arange(self.pos, self.pos + n, dtype=torch.long)
        with torch.inference_mode():
            out = self.model.hf(input_ids=ids, past_key_values=self.cache, use_cache=True,
                                cache_position=cache_position,
                                position_ids=cache_position.unsqueeze(0))
        self.cache = out.past_key_values
        self.pos += n
        logits = out.logits[0].float()
        return (logits if all_positions else logits[-1]).contiguous().numpy()

    def rewind(self, position):
        self.cache.crop(position)
        self.pos = position


class HFModel:
    def __init__(self, path):
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM
        if not os.path.isfile(path):
            raise EngineError(TS_ERR_IO, f"{path}: no such file")
        folder, name = os.path.split(os.path.abspath(path))
        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
        dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
        try:
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
        except (ValueError, KeyError) as e:  # an architecture transformers' GGUF loader lacks
            raise EngineError(TS_ERR_UNSUPPORTED, f"{path}: transformers cannot load it: {e}")
        self.hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                       **{dtype_arg: torch.float32})
        self.hf.eval()
        self.n_vocab = int(config.vocab_size)
        self.n_ctx = int(getattr(config, "max_position_embeddings", 0) or 4096)


class HFTransformers(Engine):
    name = "hf_transformers"
    version = "0.1.0"
    architectures = "llama"
    model_features = ""
    session_class = HFSession

    def device_name(self):
        import torch
        import transformers
        return (f"CPU: torch {torch.__version__}, transformers {transformers.__version__}, "
                f"float32, {torch.get_num_threads()} threads")

    def capabilities(self):
        return Capabilities(flags=TS_CAP_ALL_POSITION_LOGITS,
                            determinism_note="torch CPU kernels; not checked for bitwise "
                            "determinism")

    def load_model(self, path):
        return HFModel(path)

    def open_session(self, model, options):
        if not options.full_precision:
            raise EngineError(TS_ERR_UNSUPPORTED, "hf_transformers computes with float32 "
                              "weights only (--weights full_precision)")
        if options.n_threads > 0:
            import torch
            torch.set_num_threads(options.n_threads)
        return HFSession(model, options.max_context)


def main():
    if "--check" in sys.argv[1:]:
        why = missing_packages()
        if why:
            print(f"SKIP: {why}")
            sys.exit(SKIP)
        print("hf_transformers: torch, transformers and gguf import")
        return
    why = missing_packages()
    if why:
        raise SystemExit(f"hf_transformers: {why}")
    serve(HFTransformers)


if __name__ == "__main__":
    main()
