"""The paper's GPT decoder (docs/algorithm.md, "The paper's language-model setup"). Single-device
code only: parallelism is applied from outside.

Pre-norm blocks, RMSNorm (eps 1e-6), RoPE (base 1e4, rotate-half convention of HF Llama-family
models so export needs no permutation), causal multi-head attention via SDPA, non-gated ReLU² MLP
with hidden 4d, no biases, no dropout, tied embeddings. Option `center_mlp`: the MLP's
down-projection centres its (non-negative ReLU²) input, CBP's M2 (`models/centered_linear.py`).

Initialisation is a function of the seed and each parameter's *name* only (`init_value`): every
tensor draws from its own generator, seeded by hash(seed, name). So the initial weights do not
depend on how the model is built or sharded: one process, DDP, FSDP2 on the meta device (each rank
fills only its shard of the same tensor) and ZeRO start from the same numbers at any world size.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.centered_linear import CenteredLinear
from models.fused_loss import chunked_token_losses, fused_linear_cross_entropy


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    d_model: int
    n_head: int
    max_seq_len: int
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 128
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    center_mlp: bool = False  # CBP's M2 in the MLP down-projection (adds its bias and input mean)

    def __post_init__(self) -> None:
        for key in ("n_layer", "d_model", "n_head", "max_seq_len", "vocab_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.d_model % self.n_head:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head})")
        if (self.d_model // self.n_head) % 2:
            raise ValueError(f"head dim d_model/n_head = {self.d_model // self.n_head} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


def rope_tables(seq_len: int, head_dim: int, base: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [seq_len, head_dim], halves duplicated (HF Llama layout), fp32."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    pos = torch.arange(seq_len, dtype=torch.float32, device=device)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, hd]. Rotate-half: pairs (i, i + hd/2), as in HF Llama."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 (as HF Llama does) so bf16 runs match the exported model.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    # The SDPA kernels this layer may run, first choice first (empty: torch's own order). Entered
    # inside forward, so a compiled graph traces the choice and is cached under it, not under
    # whatever kernel a context around the call happened to pick when the graph was first made.
    sdpa_backends: tuple[SDPBackend, ...] = ()

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)  # one matrix for the optimizer
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.sdpa_backends:
            with sdpa_kernel(list(self.sdpa_backends), set_priority=True):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.down = (
            CenteredLinear(4 * cfg.d_model, cfg.d_model)
            if cfg.center_mlp
            else nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x)).square())


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


def tensor_seed(seed: int, name: str) -> int:
    """The generator seed of tensor `name` in a model initialised with `seed`."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") >> 1


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, seed: int | None = None) -> None:
        """`seed`: the initialisation seed (None: drawn from torch's global generator, so
        `torch.manual_seed` still decides it). Nothing is initialised when built on meta."""
        super().__init__()
        self.cfg = cfg
        self.rope_cos: torch.Tensor  # buffers, declared for the type checker
        self.rope_sin: torch.Tensor
        # Build on meta, then materialise: construction consumes no RNG, so `init_weights` alone
        # decides the weights, whether the model is built directly or on meta and sharded first.
        target = torch.get_default_device()
        with torch.device("meta"):
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
            self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
            # RoPE tables are derived, not learned: non-persistent, so checkpoints hold weights only.
            self.register_buffer("rope_cos", torch.empty(cfg.max_seq_len, cfg.head_dim), persistent=False)
            self.register_buffer("rope_sin", torch.empty(cfg.max_seq_len, cfg.head_dim), persistent=False)
        if target.type != "meta":
            self.to_empty(device=target)
            self.init_weights(seed)

    def init_value(self, name: str, seed: int, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """The initial value (fp32, CPU, whole) of parameter or buffer `name` (this model's own
        names): N(0, 0.02); residual output projections N(0, 0.02/√(2L)); norm gains 1; biases
        and input means 0. Drawn from a generator of its own, so it depends on (seed, name) only.
        `shape`: the tensor's shape, for a caller whose module tree wraps this model's (activation
        checkpointing renames the parameters); looked up by `name` when not given."""
        if shape is None:
            tensors = {**dict(self.named_parameters()), **dict(self.named_buffers())}
            shape = tuple(tensors[name].shape)
        # device="cpu" on every factory: the model may be built under an ambient `torch.device(...)`
        # context (CUDA, meta), and the generator, hence the numbers, must be the CPU one everywhere.
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("norm.weight"):
            return torch.ones(shape, device="cpu")
        if leaf in ("bias", "mu") or name in ("rope_cos", "rope_sin"):
            return torch.zeros(shape, device="cpu")
        residual = name.endswith(("attn.out.weight", "mlp.down.weight"))
        std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layer) if residual else self.cfg.init_std
        gen = torch.Generator(device="cpu").manual_seed(tensor_seed(seed, name))
        return torch.empty(shape, device="cpu").normal_(0.0, std, generator=gen)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Every parameter from `init_value`, then the derived buffers. Callable again after
        `to_empty()`; sharded parameters are filled shard by shard from outside (launch/)."""
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), device="cpu").item())  # the CPU generator, as documented
        for name, p in self.named_parameters():
            p.copy_(self.init_value(name, seed))
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """RoPE tables and the centred layers' input means (no randomness)."""
        cos, sin = rope_tables(self.cfg.max_seq_len, self.cfg.head_dim, self.cfg.rope_base, device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        for module in self.modules():
            if isinstance(module, CenteredLinear):
                module.mu.zero_()
                module._sum.zero_()
                module._rows.zero_()

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, *, per_token: bool = False
    ) -> torch.Tensor:
        """idx [B, T] token ids -> logits [B, T, vocab]; with `targets` [B, T], the mean
        cross-entropy over targets != -100 instead (through forward, so DDP/FSDP hooks see the
        call), computed chunk by chunk without the full logits (`models/fused_loss.py`).
        `per_token`: the [B, T] fp32 losses without gradients instead; use `token_losses`."""
        T = idx.shape[1]
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds model.max_seq_len {self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.tok_emb(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        if targets is None:
            return F.linear(self.final_norm(x), self.tok_emb.weight)  # tied LM head
        if per_token:
            h = self.final_norm(x)
            return chunked_token_losses(h.flatten(0, 1), self.tok_emb.weight, targets.reshape(-1)).view_as(targets)
        return self.head_loss(x, targets)

    def head_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of the last block's output x [B, T, d] against `targets` [B, T]:
        final norm, tied head and the fused chunked loss. A method of its own so that it can be
        compiled when only the blocks are (`parallel.compile=blocks`, docs/gpu.md)."""
        h = self.final_norm(x)
        return fused_linear_cross_entropy(h.flatten(0, 1), self.tok_emb.weight, targets.reshape(-1))

    @torch.no_grad()
    def token_losses(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-token cross-entropy [B, T] fp32, no gradients, logits never all materialised; 0 where
        the target is -100. A continuation's log-likelihood is minus the sum of its tokens' losses.
        Goes through `forward` (via __call__) so FSDP's unshard hooks run."""
        return self(idx, targets, per_token=True)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters (the tied embedding/head counted once); `non_embedding`: without it."""
        total = sum(p.numel() for p in self.parameters())
        return total - self.tok_emb.weight.numel() if non_embedding else total

    def flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """Training FLOPs per token: 6N + attention. `causal=False` counts attention's QKᵀ and AV over
        the whole T×T square (12·L·d·T, the PaLM/nanoGPT MFU convention); `causal=True` counts the
        lower triangle a causal kernel (flash attention) executes, half of it."""
        c = self.cfg
        attention = 12 * c.n_layer * c.d_model * seq_len
        return 6 * self.num_params() + (attention / 2 if causal else attention)
