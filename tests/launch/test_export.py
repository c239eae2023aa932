"""HF export: the exported directory loads offline with Auto* classes and computes our logits."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may touch the network

from launch.checkpoint import Checkpointer
from launch.checkpoint.dcp_state import ModelAndOptimizers
from launch.config import to_dict
from launch.export import main
from launch.hf_export import export_hf
from launch.plan import load_config
from launch.runtime.process_group import DistEnv
from models.gpt import GPT
from models.hf_mapping import ExportError
from models.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]


def save_checkpoint(root: Path, step: int, model: GPT, meta: dict) -> Path:
    """A checkpoint as the trainer writes it (a single process), holding `model`."""
    env = DistEnv(0, 1, 0, torch.device("cpu"), "none")
    return Checkpointer(root, env, sharded=[ModelAndOptimizers(model, [])], per_rank={}).save(step, meta)


GPT2 = str(ROOT / "assets/tokenizers/gpt2")
TEXTS = [
    "Hello world, this is a test of the exported model.",
    "The quick brown fox jumps over the lazy dog again and again.",
]
OVERRIDES = ["model.n_layer=2", "model.d_model=64", "model.n_head=4", "model.max_seq_len=64", "data.seq_len=64"]


def random_gpt(seed: int = 0) -> GPT:
    """A small GPT whose every export detail matters: norm gains far from 1 (a swapped or dropped
    norm shows), sharp attention (RoPE or causal-mask mistakes show), distinct q/k/v blocks."""
    torch.manual_seed(seed)
    model = GPT(get_preset("tiny", n_layer=2, d_model=64, n_head=4, max_seq_len=64)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
            elif name.endswith("qkv.weight"):
                p.mul_(8.0)
    return model


def token_batch(tokenizer) -> torch.Tensor:
    ids = [tokenizer(t).input_ids for t in TEXTS]
    n = min(len(i) for i in ids)
    return torch.tensor([i[:n] for i in ids])


def assert_same_logits(model: GPT, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    idx = token_batch(tokenizer)
    with torch.no_grad():
        ours = model(idx)
        for impl in ("eager", "sdpa"):
            hf = AutoModelForCausalLM.from_pretrained(out, attn_implementation=impl).eval()
            assert type(hf).__name__ == "ArceeForCausalLM"
            assert hf.dtype == torch.float32
            theirs = hf(input_ids=idx).logits
            assert theirs.shape == ours.shape
            assert (theirs - ours).abs().max().item() < 1e-4, impl


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = random_gpt()
    out = tmp_path_factory.mktemp("export") / "hf"
    export_hf(model.state_dict(), model.cfg, GPT2, out)
    return model, out


def test_exported_model_matches_logits(exported):
    model, out = exported
    assert_same_logits(model, out)
    assert not list(out.parent.glob(".hf.*"))  # no temp directory left behind


def test_exported_model_generates_our_greedy_tokens(exported):
    """generate() runs the KV-cache path (RoPE at offset positions), which a full forward does not."""
    from transformers import AutoModelForCausalLM

    model, out = exported
    idx = torch.tensor([[15496, 995, 11, 428, 318]])
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = hf.generate(idx, max_new_tokens=8, do_sample=False)
        ours = idx
        for _ in range(8):
            ours = torch.cat([ours, model(ours)[:, -1:].argmax(-1)], dim=1)
    assert theirs.tolist() == ours.tolist()


def test_exported_files_and_config(exported):
    model, out = exported
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= names
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["ArceeForCausalLM"] and config["hidden_act"] == "relu2"
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == 50304
    assert config["rope_parameters"]["rope_theta"] == 10000.0 and config["rms_norm_eps"] == 1e-6
    assert config["eos_token_id"] == config["bos_token_id"] == 50256
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "lm_head.weight" not in keys  # tied: stored once
    assert len(keys) == 2 + 8 * model.cfg.n_layer  # embedding, final norm; q k v o up down + 2 norms


def test_exported_files_all_get_the_umasks_mode(exported):
    """safetensors writes the weights through a temporary file (0600) renamed into place."""
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in exported[1].iterdir()}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes


@pytest.mark.slow  # a fresh interpreter importing torch and transformers: ~10 s
def test_export_does_not_import_deepspeed(tmp_path):
    """save_pretrained unwraps the model through accelerate, which imported DeepSpeed (when installed)
    to test for its wrapper: ~1 s, and "Setting accelerator to CPU" on a machine without a GPU. In
    a process of its own: this one may have imported DeepSpeed already."""
    from tests.helpers import env

    code = (
        "import sys\n"
        "from tests.launch.test_export import GPT2, export_hf, random_gpt\n"
        "model = random_gpt()\n"
        f"export_hf(model.state_dict(), model.cfg, GPT2, {str(tmp_path / 'hf')!r})\n"
        "print('deepspeed' in sys.modules)\n"
    )
    environ = {k: v for k, v in env().items() if k != "DS_ACCELERATOR"}  # as a user runs it
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr  # DeepSpeed's logger writes to stdout
    assert proc.stdout.split()[-1:] == ["False"] and "Setting accelerator" not in said, said


def test_the_readmes_export_directory_is_ignored_by_git():
    """README's example writes exports/tiny-hf: model weights, nothing to commit."""
    assert "exports/" in (ROOT / ".gitignore").read_text().split()


def test_exported_tokenizer(exported):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported[1])
    assert tokenizer("Hello world").input_ids == [15496, 995]
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 50256
    assert tokenizer.decode([15496, 995]) == "Hello world"


def test_export_bf16_and_shape_errors(tmp_path):
    model = random_gpt()
    out = export_hf(model.state_dict(), model.cfg, GPT2, tmp_path / "bf16", dtype=torch.bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    sd = dict(model.state_dict())
    sd["blocks.1.mlp.up.weight"] = sd["blocks.1.mlp.up.weight"][:10]
    with pytest.raises(ExportError, match="blocks.1.mlp.up.weight"):
        export_hf(sd, model.cfg, GPT2, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_sentencepiece_refused_clearly(tmp_path):
    model = random_gpt()
    with pytest.raises(ExportError, match="SentencePiece export is not supported"):
        export_hf(model.state_dict(), model.cfg, str(ROOT / "assets/tokenizers/mistral_v1"), tmp_path / "sp")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # a single-process DCP save
def test_cli_exports_checkpoint_root(tmp_path):
    """A checkpoint written by the trainer's save_checkpoint; the CLI is given the root."""
    model = random_gpt(seed=1)
    cfg = load_config(str(ROOT / "configs/tiny.yaml"), OVERRIDES)
    meta = {"config": to_dict(cfg), "model": vars(model.cfg)}
    root = tmp_path / "run" / "checkpoints"
    save_checkpoint(root, 150, model, meta)
    out = tmp_path / "exports" / "tiny-hf"
    assert main(["--checkpoint", str(root), "--out", str(out)]) == 0
    assert_same_logits(model, out)


def test_cli_refuses_non_empty_out_and_missing_checkpoint(tmp_path, capsys):
    model = random_gpt()
    meta = {"config": to_dict(load_config(str(ROOT / "configs/tiny.yaml"), OVERRIDES)), "model": vars(model.cfg)}
    step = save_checkpoint(tmp_path / "ckpt", 1, model, meta)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    assert main(["--checkpoint", str(step), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not empty" in err and err.count("\n") == 1
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "precious"

    assert main(["--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "fresh")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no checkpoint") and err.count("\n") == 1
    assert not (tmp_path / "fresh").exists()

    assert main(["--checkpoint", str(step), "--out", str(out), "--overwrite"]) == 0
    assert (out / "config.json").is_file() and not (out / "keep.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp/backup debris
