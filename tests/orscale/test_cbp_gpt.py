"""The CBP family on the paper's GPT through train.py: it trains, checkpoints and resumes
bit-exactly (moments, energies q, step counts, M2's input means), and a centred model exports."""

from __future__ import annotations

import pytest
import torch

from launch.loop import main as train_main
from tests.helpers import SMALL, TINY, train_losses

COMMON = ["train.eval_every=0", "optim.warmup_steps=2"]


@pytest.mark.parametrize(
    "optim",
    [["optim.name=cbp", "model.center_mlp=true"], ["optim.name=lamb", "optim.lr=0.05"]],
    ids=["cbp+center", "lamb"],
)
def test_trains_and_resumes_bit_exactly(tmp_path, optim):
    base = ["--config", TINY, *SMALL, *COMMON, *optim]
    assert train_main([*base, f"run.dir={tmp_path / 'straight'}", "train.max_steps=6"]) == 0
    assert train_main([*base, f"run.dir={tmp_path / 'resumed'}", "train.max_steps=3"]) == 0
    assert train_main([*base, f"run.dir={tmp_path / 'resumed'}", "train.max_steps=6"]) == 0
    straight = train_losses(tmp_path / "straight")
    assert train_losses(tmp_path / "resumed") == straight
    assert straight[6] < straight[1]


def test_a_centred_model_exports_with_its_mean_folded_into_a_bias(tmp_path):
    from transformers import AutoModelForCausalLM

    from launch.hf_export import export_hf
    from models import GPT, get_preset

    cfg = get_preset("tiny", n_layer=2, d_model=64, n_head=4, max_seq_len=64, center_mlp=True)
    model = GPT(cfg, seed=5).eval()
    with torch.no_grad():  # a mean and a bias far from their initial zeros
        for block in model.blocks:
            block.mlp.down.mu.uniform_(0, 1)
            block.mlp.down.bias.normal_(0, 0.1)
    out = export_hf(model.state_dict(), cfg, "assets/tokenizers/gpt2", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    idx = torch.randint(0, 50000, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(hf(input_ids=idx).logits, model(idx), atol=1e-5)
