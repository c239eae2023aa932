"""Benchmark (prints, does not assert): OrScale-LM's overhead over Muon+Moonlight, and its state
memory against AdamW, at the paper's 125M scale.

    python -m bench.bench_optim [--layers 12] [--reps 1] [--rest-reps 5] [--device cpu]

1. Optimizer step time, orscale_lm ÷ muon_moonlight, on the 125M preset's matrix shapes
   (per layer: qkv 2304×768, out 768×768, up 3072×768, down 768×3072), same Newton–Schulz
   precision for both, fp32 and bf16. Each optimizer is warmed up on a one-layer copy (same
   shapes, so the same kernels), then the two are timed alternately to share machine noise.
   On 2 shared CPU cores one 12-layer fp32 step takes 10–20 s and the noise between two steps
   exceeds OrScale-LM's extra work, so the script also times the step with Newton–Schulz stubbed
   out (best of --rest-reps; NS is identical for both optimizers) and reports
   1 + (extra work)/(Moonlight step) next to the direct ratio.
2. Optimizer state bytes, orscale_lm ÷ adamw, for the whole 125M model: the model is built on
   the meta device (no memory); MuonFamily's state exists eagerly and is counted as allocated;
   AdamW's (lazy) state is counted from its definition: exp_avg + exp_avg_sq in the param dtype
   plus a 0-d fp32 `step` per parameter.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from orscale import (
    MuonFamily,
    OptimConfig,
    build_optimizers,
)

SHAPES_125M = {"attn.qkv": (2304, 768), "attn.out": (768, 768), "mlp.up": (3072, 768), "mlp.down": (768, 3072)}


def make_matrices(layers: int, device: str, seed: int = 0) -> list[tuple[str, nn.Parameter]]:
    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for i in range(layers):
        for kind, shape in SHAPES_125M.items():
            p = nn.Parameter(0.02 * torch.randn(shape, generator=gen, device=device))
            p.grad = torch.randn(shape, generator=gen, device=device) * 1e-3
            out.append((f"blocks.{i}.{kind}.weight", p))
    return out


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(opts: dict[str, MuonFamily], reps: int, device: str) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {n: [] for n in opts}
    for _ in range(reps):
        for name, opt in opts.items():  # alternate, so both see the same machine load
            sync(device)
            t0 = time.perf_counter()
            opt.step()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return times


def build(args: argparse.Namespace, ns_dtype: str) -> dict[str, MuonFamily]:
    opts = {}
    for name in ("muon_moonlight", "orscale_lm"):
        warm = MuonFamily(make_matrices(1, args.device), lr=1e-3, variant=name, ns_dtype=ns_dtype)
        warm.step()  # same shapes as the timed optimizer: warms kernels and allocator
        opts[name] = MuonFamily(make_matrices(args.layers, args.device), lr=1e-3, variant=name, ns_dtype=ns_dtype)
    return opts


def non_ns_overhead(args: argparse.Namespace, track_diagnostics: bool) -> dict[str, float]:
    """Best-of-N step time with Newton–Schulz stubbed out (Q := copy of M̂): everything the two
    optimizers do differently lives here, and it is cheap enough to repeat many times."""
    opts = build(args, "fp32")
    for opt in opts.values():
        opt.track_diagnostics = track_diagnostics
        opt.orthogonalize = lambda w, m_hats: [m.clone() for m in m_hats]  # type: ignore[method-assign]  # the stub is the point here
    return {n: min(t) for n, t in time_steps(opts, args.rest_reps, args.device).items()}


def state_bytes() -> tuple[int, int, int]:
    from models.gpt import GPT
    from models.presets import get_preset

    with torch.device("meta"):
        model = GPT(get_preset("125m"))
    n_params = sum(p.numel() for p in model.parameters())

    def adamw_bytes(params) -> int:
        return sum(2 * p.numel() * p.element_size() + 4 for p in params)

    total = 0
    for opt in build_optimizers(model, OptimConfig(name="orscale_lm")):
        if isinstance(opt, MuonFamily):
            total += sum(
                t.numel() * t.element_size() for st in opt.state.values() for t in st.values() if torch.is_tensor(t)
            )
        else:
            total += adamw_bytes(p for g in opt.param_groups for p in g["params"])
    return total, adamw_bytes(model.parameters()), n_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--reps", type=int, default=1, help="timed full steps per optimizer")
    ap.add_argument("--rest-reps", type=int, default=5, help="timed NS-free steps per optimizer")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    print(
        f"device={args.device} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"layers={args.layers} reps={args.reps} (125M matrix shapes: "
        + ", ".join(f"{k} {m}x{n}" for k, (m, n) in SHAPES_125M.items())
        + ")"
    )
    extra: dict[bool, float] = {}
    for track in (False, True):
        rest = non_ns_overhead(args, track)
        extra[track] = rest["orscale_lm"] - rest["muon_moonlight"]
        print(
            f"step with NS stubbed out, diagnostics {'on ' if track else 'off'} (best of "
            f"{args.rest_reps}): muon_moonlight {rest['muon_moonlight'] * 1e3:.1f} ms, orscale_lm "
            f"{rest['orscale_lm'] * 1e3:.1f} ms -> OrScale-LM's extra work {extra[track] * 1e3:+.1f} ms"
        )
    for ns_dtype in ("fp32", "bf16"):
        t = time_steps(build(args, ns_dtype), args.reps, args.device)
        mm, lm = statistics.median(t["muon_moonlight"]), statistics.median(t["orscale_lm"])
        print(
            f"NS {ns_dtype}: full step muon_moonlight {mm * 1e3:.1f} ms, orscale_lm {lm * 1e3:.1f} ms;"
            f" ratio orscale_lm/muon_moonlight measured {lm / mm:.4f} (noisy on a shared CPU);"
            f" from the NS-free difference: {1 + extra[True] / mm:.4f} (diagnostics on),"
            f" {1 + extra[False] / mm:.4f} (off)"
        )
    lm_b, adamw_b, n = state_bytes()
    print(
        f"state bytes, 125M preset ({n / 1e6:.1f}M params, fp32): orscale_lm {lm_b / 2**20:.1f} MiB"
        f" (+AdamW on embedding/norms), adamw {adamw_b / 2**20:.1f} MiB,"
        f" ratio orscale_lm/adamw = {lm_b / adamw_b:.4f}"
    )


if __name__ == "__main__":
    main()
