"""The paper's GPT as a Hugging Face `transformers` model (ArceeForCausalLM): the pure mapping.

Arcee is the stock transformers architecture that matches the paper's GPT exactly: pre-norm
Llama-style decoder, RMSNorm, rotate-half RoPE, non-gated ReLU² MLP, no biases. So an exported
directory loads with `AutoModelForCausalLM` offline, without remote code. This module maps configs
and parameter names only; reading checkpoints, tokenizers and writing directories is
`launch/hf_export.py`'s job (`python -m launch.export`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from models.gpt import GPTConfig


class ExportError(ValueError):
    """A user error in an export (bad checkpoint, occupied output, unsupported tokenizer): one line."""


def _require_transformers_5() -> None:
    import transformers

    # 5.x moved the RoPE base into `rope_parameters` (4.x: `rope_theta`); only 5.x is tested here.
    if int(transformers.__version__.split(".")[0]) < 5:
        raise ExportError(
            f"HF export needs transformers>=5 (found {transformers.__version__}); pip install -U transformers"
        )


def to_arcee_config(cfg: GPTConfig, eos_id: int, bos_id: int, dtype: torch.dtype = torch.float32):
    """The ArceeConfig that computes exactly what `models.gpt.GPT` computes."""
    _require_transformers_5()
    from transformers import ArceeConfig

    return ArceeConfig(
        vocab_size=cfg.vocab_size,  # padded (50304): ids past the tokenizer's 50257 are never produced
        hidden_size=cfg.d_model,
        intermediate_size=4 * cfg.d_model,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_head,  # plain multi-head attention, no GQA
        head_dim=cfg.head_dim,
        hidden_act="relu2",
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_base)},  # 5.x home of rope_theta
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=cfg.center_mlp,  # a centred down-projection exports with its mean folded into a bias
        initializer_range=cfg.init_std,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        dtype=dtype,
    )


def to_arcee_state_dict(
    state_dict: Mapping[str, torch.Tensor], cfg: GPTConfig, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Our parameter names -> Arcee's, splitting the fused qkv. Every shape is checked so a state
    dict that does not fit `cfg` fails with a message naming the tensor, not deep inside torch."""
    sd, d = dict(state_dict), cfg.d_model

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in sd:
            raise ExportError(f"the state dict has no '{name}' (is it a GPT state dict for {cfg}?)")
        t = sd.pop(name)
        if tuple(t.shape) != shape:
            raise ExportError(f"'{name}' has shape {tuple(t.shape)}, expected {shape} for {cfg}")
        return t.detach().to("cpu", dtype)

    out = {"model.embed_tokens.weight": take("tok_emb.weight", (cfg.vocab_size, d))}
    for i in range(cfg.n_layer):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        # qkv rows are [q; k; v], each d x d with heads contiguous: exactly q/k/v_proj's layout.
        # clone(): slices share storage, which safetensors refuses to write.
        q, k, v = (t.clone() for t in take(src + "attn.qkv.weight", (3 * d, d)).split(d))
        if cfg.center_mlp:  # y = W(x − μ) + b = Wx + (b − Wμ); the up-projection gets a zero bias
            take(src + "mlp.down.weight", (d, 4 * d))  # shape checks; the fold uses the raw fp values
            sd[src + "mlp.down.weight"] = state_dict[src + "mlp.down.weight"]
            b, mu = (take(src + f"mlp.down.{k}", shape).double() for k, shape in (("bias", (d,)), ("mu", (4 * d,))))
            folded = (
                state_dict[src + "mlp.down.bias"].double()
                - state_dict[src + "mlp.down.weight"].double() @ state_dict[src + "mlp.down.mu"].double()
            )
            out[dst + "mlp.down_proj.bias"] = folded.to(dtype)
            out[dst + "mlp.up_proj.bias"] = torch.zeros(4 * d, dtype=dtype, device="cpu")
        out.update(
            {
                dst + "self_attn.q_proj.weight": q,
                dst + "self_attn.k_proj.weight": k,
                dst + "self_attn.v_proj.weight": v,
                dst + "self_attn.o_proj.weight": take(src + "attn.out.weight", (d, d)),
                dst + "mlp.up_proj.weight": take(src + "mlp.up.weight", (4 * d, d)),
                dst + "mlp.down_proj.weight": take(src + "mlp.down.weight", (d, 4 * d)),
                dst + "input_layernorm.weight": take(src + "attn_norm.weight", (d,)),
                dst + "post_attention_layernorm.weight": take(src + "mlp_norm.weight", (d,)),
            }
        )
    out["model.norm.weight"] = take("final_norm.weight", (d,))
    leftover = sorted(k for k in sd if k not in ("rope_cos", "rope_sin"))  # derived buffers, not weights
    if leftover:
        raise ExportError(
            f"unexpected tensors in the state dict: {', '.join(leftover[:5])}"
            f"{' ...' if len(leftover) > 5 else ''} (n_layer={cfg.n_layer}?)"
        )
    return out


def arcee_model(state_dict: Mapping[str, torch.Tensor], cfg: GPTConfig, eos_id: int, bos_id: int, dtype: torch.dtype):
    """An `ArceeForCausalLM` holding exactly `state_dict`'s weights (tied head).

    Built on meta: nothing is randomly initialised (1.1B would take a while), `assign` adopts our
    tensors, and strict=True proves the name mapping covers every parameter exactly once.
    """
    from transformers import ArceeForCausalLM

    weights = to_arcee_state_dict(state_dict, cfg, dtype)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"]  # tied; strict load expects the key
    with torch.device("meta"):
        model = ArceeForCausalLM(to_arcee_config(cfg, eos_id=eos_id, bos_id=bos_id, dtype=dtype))
    try:
        model.load_state_dict(weights, strict=True, assign=True)
    except RuntimeError as err:  # cannot happen if to_arcee_state_dict is right; keep it one line
        raise ExportError(f"weights do not fit ArceeForCausalLM: {' '.join(str(err).split())[:300]}") from None
    model.tie_weights()  # assign=True gave lm_head its own Parameter; re-tie so it is saved once
    return model
