"""hf_transformers: Hugging Face transformers on the same GGUF, float32, on the CPU.

    ci/torch     # the pinned venv: torch, transformers, gguf, accelerate, numpy
    PYTHONPATH=python touchstone parity --weights full_precision --case narrative \\
        --backend "exec:$HOME/.cache/touchstone/venv-torch/bin/python3 -m touchstone_engine.examples.hf_transformers"

Opt-in (docs/python-engines.md): PyPI's torch pulls its CUDA wheels, ~2.9 GB of
downloads. `python3 -m touchstone_engine.examples.hf_transformers --check` exits
77 (SKIP) with the reason when the packages cannot be imported.

The model is loaded with AutoModelForCausalLM.from_pretrained(dir, gguf_file=name,
dtype=float32, attn_implementation="eager"): transformers dequantizes every tensor
to float32 and undoes llama.cpp's Q/K row permutation, then computes with its own
modeling code (rotate_half RoPE with float32 angles, float32 softmax and matmuls):
an independent implementation of the same model, compared with the reference's
goldens. The KV cache is a DynamicCache; rewind crops it.
TOUCHSTONE_HF_ROPE=float64 (diagnostic) computes the RoPE angles and their cos/sin
in float64 as the reference does (docs/validation.md says why).

Serving (ABI v6): step_batch runs every entry's new tokens as ONE forward call of
batch size B, the way batched HF inference pads sequences of unequal length, on
the left (HFTransformers.step_batch has the layout); fork copies a session's
first n_prefix KV entries into a new DynamicCache. Capabilities: all-position
logits and TS_CAP_BATCHED_SESSIONS (one pass), never TS_CAP_BATCH_INVARIANT: the
products of many rows sum in another order than a single row's, so a
sequence's logits drift with its company
(docs/validation.md#hf-transformers-with-left-padded-batches).
"""

import inspect
import os
import sys

from touchstone_engine import (TS_CAP_ALL_POSITION_LOGITS, TS_CAP_BATCHED_SESSIONS,
                               TS_ERR_INVALID_ARGUMENT, TS_ERR_IO, TS_ERR_UNSUPPORTED,
                               Capabilities, Engine, EngineError, Session, serve)

SKIP = 77


def missing_packages():
    """The reason the example cannot run here, or None."""
    missing = []
    for name in ("numpy", "torch", "transformers", "gguf", "accelerate"):
        try:
            __import__(name)
        except Exception as e:  # ImportError, or a broken install (missing CUDA libraries)
            missing.append(f"{name} ({type(e).__name__}: {e})")
    if missing:
        return ("cannot import " + "; ".join(missing) +
                " (ci/torch makes a venv with them; or pip install './python[hf]')")
    return None


def refuse_unmapped(path):
    """TS_ERR_UNSUPPORTED for a GGUF that declares what transformers' GGUF loader
    drops for its architecture, so that it would compute another model. The harness
    refuses undeclared features (HFTransformers.model_features); sliding-window
    attention is declared for gemma3, whose loader maps it, not for llama, whose
    loader ignores llama.attention.sliding_window."""
    from touchstone_engine.examples.gguf_reader import GGUFError, GGUFFile
    try:
        md = GGUFFile(path).metadata
    except (OSError, GGUFError) as e:
        raise EngineError(TS_ERR_IO, f"{path}: {e}")
    if md.get("general.architecture") == "llama" and "llama.attention.sliding_window" in md:
        raise EngineError(TS_ERR_UNSUPPORTED, f"{path}: 'llama.attention.sliding_window': "
                          "transformers' GGUF loader ignores it for llama")


def rope_in_float64(hf, config):
    """Diagnostic (TOUCHSTONE_HF_ROPE=float64): every default-type rotary embedding
    computes its angles position * base^(-2i/d), and their cos and sin, in float64
    (as the reference does) and rounds cos and sin to float32; transformers computes
    inv_freq, the angles and cos/sin in float32. Nothing else changes."""
    import types

    import torch
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" or "rope_theta" not in rope:
        raise EngineError(TS_ERR_UNSUPPORTED, "TOUCHSTONE_HF_ROPE=float64: only plain "
                          f"(default) RoPE with one rope_theta, not {rope}")
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv_freq = 1.0 / (float(rope["rope_theta"]) **
                      (torch.arange(0, dim, 2, dtype=torch.float64) / dim))

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.attention_scaling).to(x.dtype),
                (emb.sin() * self.attention_scaling).to(x.dtype))

    patched = 0
    for module in hf.modules():
        if type(module).__name__.endswith("RotaryEmbedding") and hasattr(module, "inv_freq"):
            module.forward = types.MethodType(forward, module)
            patched += 1
    if not patched:
        raise EngineError(TS_ERR_UNSUPPORTED, "TOUCHSTONE_HF_ROPE=float64: no rotary "
                          f"embedding module in {type(hf).__name__}")


def cache_kv(cache):
    """A DynamicCache's [(keys, values)] per layer, [batch, n_kv_heads, length, head_dim]."""
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


class HFSession(Session):
    def __init__(self, model, max_context):
        import torch
        from transformers import DynamicCache
        self.torch = torch
        self.model = model
        # No config: every layer keeps all its keys and values (a DynamicCache built
        # from a sliding-window config drops old ones and then cannot be cropped back);
        # the attention mask applies the window.
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
        positions = torch.arange(self.pos, self.pos + n, dtype=torch.long)
        kwargs = {self.model.cache_arg: self.cache, "use_cache": True,
                  "position_ids": positions.unsqueeze(0)}
        if self.model.takes_logits_to_keep and not all_positions:
            kwargs["logits_to_keep"] = 1  # the lm_head on the last position only
        if self.model.takes_cache_position:  # transformers < 5.x
            kwargs["cache_position"] = positions
        with torch.inference_mode():
            out = self.model.hf(input_ids=ids, **kwargs)
        self.pos += n  # the cache was updated in place
        logits = out.logits[0].float()
        return (logits if all_positions else logits[-1]).contiguous().numpy()

    def rewind(self, position):
        # crop(-k) removes the last k tokens in every transformers version that has
        # DynamicCache.crop (5.x refuses a positive argument; 4.x read it as a length).
        if position < self.pos:
            self.cache.crop(position - self.pos)
        self.pos = position

    def kv(self):
        """[(keys, values)] per layer, each [1, n_kv_heads, pos, head_dim]; [] when empty."""
        return cache_kv(self.cache) if self.pos else []

    def append_kv(self, kv_new, n):
        """Appends n positions' keys and values (one (k, v) per layer) to the cache,
        as the model's own cache.update does in a forward pass (torch.cat: copies)."""
        for layer, (k, v) in enumerate(kv_new):
            self.cache.update(k, v, layer)
        self.pos += n

    def fork(self, n_prefix):
        """A new session whose DynamicCache holds copies of this one's first n_prefix
        positions; this one is untouched."""
        s = HFSession(self.model, self.max_ctx)
        if n_prefix > 0:
            s.append_kv([(k[:, :, :n_prefix], v[:, :, :n_prefix]) for k, v in self.kv()], n_prefix)
        return s


class HFModel:
    def __init__(self, path):
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM
        if not os.path.isfile(path):
            raise EngineError(TS_ERR_IO, f"{path}: no such file")
        rope = os.environ.get("TOUCHSTONE_HF_ROPE", "float32")
        if rope not in ("float32", "float64"):
            raise EngineError(TS_ERR_INVALID_ARGUMENT,
                              f"TOUCHSTONE_HF_ROPE={rope!r}: expected float32 or float64")
        folder, name = os.path.split(os.path.abspath(path))
        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
        dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
        refuse_unmapped(path)
        try:
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
        except (ValueError, KeyError) as e:  # an architecture transformers' GGUF loader lacks
            raise EngineError(TS_ERR_UNSUPPORTED, f"{path}: transformers cannot load it: {e}")
        # eager attention: the plain softmax(QK^T)V that ci/validate_reference.py uses
        self.hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                       attn_implementation="eager",
                                                       **{dtype_arg: torch.float32})
        self.hf.eval()
        if rope == "float64":
            rope_in_float64(self.hf, config)
        params = inspect.signature(self.hf.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"  # 5.x renamed it
        self.takes_cache_position = "cache_position" in params
        self.takes_logits_to_keep = "logits_to_keep" in params
        self.n_vocab = int(config.vocab_size)
        self.n_ctx = int(getattr(config, "max_position_embeddings", 0) or 4096)
        # Per layer type ("full_attention", "sliding_attention": Gemma 3) the window a
        # layer's queries see (0 = the whole causal past); a model without layer_types
        # (Llama: its GGUF loader drops any window, refuse_unmapped) has one full mask.
        types = getattr(self.hf.config, "layer_types", None)
        window = int(getattr(self.hf.config, "sliding_window", None) or 0)
        self.mask_windows = ({t: (window if t == "sliding_attention" else 0) for t in set(types)}
                             if types else None)


class HFTransformers(Engine):
    name = "hf_transformers"
    version = "0.1.0"
    architectures = "llama,gemma3"
    # What Gemma 3's modeling code computes and transformers' GGUF loader maps (for
    # gemma3 only: refuse_unmapped). Not rope_freqs, linear RoPE scaling, QKV bias...
    model_features = ("neox_rope,key_length_head_dim,sliding_window,per_layer_rope_base,"
                      "qk_norm,post_norms,geglu,embedding_scale")
    session_class = HFSession

    def device_name(self):
        import torch
        import transformers
        return (f"CPU: torch {torch.__version__}, transformers {transformers.__version__}, "
                f"float32, {torch.get_num_threads()} threads")

    def capabilities(self):
        # step_batch is one forward pass (TS_CAP_BATCHED_SESSIONS); not batch
        # invariant: a product of B x N rows sums in another order than one row.
        return Capabilities(flags=TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BATCHED_SESSIONS,
                            determinism_note="torch CPU kernels; not checked for bitwise "
                            "determinism; a batch's products sum in another order")

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

    def step_batch(self, entries):
        """Every entry's new tokens in ONE forward call of batch size B = len(entries),
        left-padded, each session's KV cache left-padded into one batched DynamicCache:

            column      0 ....... P-1 | P ........ P+N-1      (P = max past, N = max new)
            entry b:    pad.. past_b  | pad.. new_b           (input_ids: the last N columns)

        Entry b's p_b cached positions fill the last p_b of the P cache columns (zeros
        before them), its n_b new tokens the last n_b of the N input columns (token 0
        before them), so every entry's last token is in the last column and the
        logits are taken as generate() does: logits_to_keep = 1, or the longest
        all-position entry's n_b. position_ids are each token's own position
        p_b + i (pads: 0). The attention mask is the 4D additive mask (0 / the
        float32 minimum) that eager attention adds to the scores, built from the
        real positions: key j is seen by query i of the same entry when neither is
        a pad, pos(j) <= pos(i) and, in a sliding layer, pos(i) - pos(j) < window;
        a pad query sees only itself (no all-masked row). From a 2D padding mask
        transformers builds the same mask for Llama, but counts a sliding window in
        columns, which the pads between an entry's past and its new tokens widen:
        so the mask is passed built, one per layer type for Gemma 3. After the
        call, each entry's new keys and values (its last n_b columns) are appended
        to its own cache; pads and the batched cache are dropped. The cached
        positions are copied into the batch, not recomputed, so a session's cache
        holds the same values whatever batch it was in."""
        import torch
        m = entries[0].session.model
        B = len(entries)
        past = [e.session.pos for e in entries]
        new = [len(e.tokens) for e in entries]
        P, N = max(past), max(new)
        T = P + N
        ids = torch.zeros((B, N), dtype=torch.long)
        kpos = torch.zeros((B, T), dtype=torch.long)  # each column's position in its sequence
        kreal = torch.zeros((B, T), dtype=torch.bool)  # not a pad
        for b, (e, p, n) in enumerate(zip(entries, past, new)):
            ids[b, N - n:] = torch.tensor(e.tokens, dtype=torch.long)
            kpos[b, P - p:P] = torch.arange(p)
            kpos[b, T - n:] = torch.arange(p, p + n)
            kreal[b, P - p:P] = True
            kreal[b, T - n:] = True
        qpos, qreal = kpos[:, P:], kreal[:, P:]
        causal = kreal[:, None, :] & qreal[:, :, None] & (kpos[:, None, :] <= qpos[:, :, None])
        pad_self = torch.zeros((B, N, T), dtype=torch.bool)
        pad_self[:, torch.arange(N), P + torch.arange(N)] = ~qreal
        lowest = torch.finfo(torch.float32).min

        def additive(window):
            seen = causal
            if window > 0:
                seen = seen & (qpos[:, :, None] - kpos[:, None, :] < window)
            return torch.where(seen | pad_self, 0.0, lowest).to(torch.float32)[:, None]

        if m.mask_windows is None:
            mask = additive(0)
        else:
            mask = {t: additive(w) for t, w in m.mask_windows.items()}

        cache = self._batched_cache(entries, past, P)
        keep = max([n for e, n in zip(entries, new) if e.all_positions] or [1])
        kwargs = {m.cache_arg: cache, "use_cache": True, "attention_mask": mask,
                  "position_ids": qpos}
        if m.takes_logits_to_keep:
            kwargs["logits_to_keep"] = keep
        if m.takes_cache_position:  # transformers < 5.x: the columns, not the positions
            kwargs["cache_position"] = torch.arange(P, T, dtype=torch.long)
        with torch.inference_mode():
            out = m.hf(input_ids=ids, **kwargs)
            logits = out.logits[:, -keep:].float()
            batched = cache_kv(cache)
            results = []
            for b, (e, n) in enumerate(zip(entries, new)):
                e.session.append_kv([(k[b:b + 1, :, T - n:], v[b:b + 1, :, T - n:])
                                     for k, v in batched], n)
                rows = logits[b, keep - n:] if e.all_positions else logits[b, -1]
                results.append(rows.contiguous().numpy())
        return results

    @staticmethod
    def _batched_cache(entries, past, P):
        """A DynamicCache of batch B whose row b holds entry b's cached keys and values
        in its last past[b] of P columns, zeros before them (masked)."""
        import torch
        from transformers import DynamicCache
        cache = DynamicCache()
        if P == 0:
            return cache
        kvs = [e.session.kv() for e in entries]
        ref = next(kv for kv in kvs if kv)
        for layer in range(len(ref)):
            k0, v0 = ref[layer]
            keys = k0.new_zeros((len(entries), k0.shape[1], P, k0.shape[3]))
            values = v0.new_zeros((len(entries), v0.shape[1], P, v0.shape[3]))
            for b, (kv, p) in enumerate(zip(kvs, past)):
                if p:
                    keys[b, :, P - p:] = kv[layer][0][0]
                    values[b, :, P - p:] = kv[layer][1][0]
            cache.update(keys, values, layer)
        return cache

    def fork(self, session, n_prefix):
        return session.fork(n_prefix)


def main():
    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' per-tensor GGUF progress bar
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
