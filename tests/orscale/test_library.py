"""orscale.OrScaleLM where users put it: a user's own FSDP2 and DDP loops on 2 gloo ranks, the Hugging
Face Trainer (trains the embeddings, resumes bit for bit), accelerate (save_state / load_state), and
docs/library.md's examples, run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from orscale import OrScaleLM
from tests.orscale import library_worker as worker
from tests.orscale.optim_helpers import hf_gpt2
from tests.pool import rank_pool

pytestmark = pytest.mark.usefixtures("one_thread")

DOCS = Path(__file__).resolve().parents[2] / "docs/library.md"


def docs_examples() -> dict[str, str]:
    """docs/library.md's python blocks by the heading above them."""
    text = DOCS.read_text()
    out = {}
    for match in re.finditer(r"^## (.+?)$(.*?)(?=^## |\Z)", text, flags=re.M | re.S):
        blocks = re.findall(r"```python\n(.*?)```", match.group(2), flags=re.S)
        if blocks:
            out[match.group(1).strip()] = blocks[0]
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_and_ddp_user_loops_equal_one_process() -> None:
    """Each rank on half the batch: FSDP2 (found from the DTensors: Newton–Schulz on owner ranks) and
    DDP (the wrapped model passed in) equal the one-process OrScaleLM on the whole batch to fp32
    rounding, every parameter trained; each matrix orthogonalised on one rank only. (AdamW's
    parameters get a looser bound: the attention key bias has a zero gradient in exact arithmetic,
    and AdamW turns the reductions' rounding noise in it into full-size steps.)"""
    results = rank_pool(2).run(worker.user_loops)
    for r in results:
        assert r["moved"]
        assert (r["fsdp_class"], r["swapped_class"], r["ddp_class"]) == (
            "ShardedMuonFamily",
            "ShardedMuonFamily",
            "ReplicatedMuonFamily",
        )
        for run in ("fsdp_err", "swapped_err", "ddp_err"):
            assert r[run]["muon"] < 5e-5 and r[run]["adamw"] < 1e-3, (run, r[run])
    for key in ("fsdp_ns_calls", "ddp_ns_calls"):
        assert sorted(r[key] for r in results) == [4, 4], key  # 8 matrices, each on its owner alone


@pytest.mark.slow
@pytest.mark.distributed
def test_docs_fsdp2_example_runs_as_written() -> None:
    printed = rank_pool(2).run(worker.docs_example, docs_examples()["An FSDP2 loop"])
    assert printed == ["rank 0: ShardedMuonFamily\n", "rank 1: ShardedMuonFamily\n"]


@pytest.fixture
def fresh_accelerate(tmp_path, monkeypatch):
    """A working directory of its own, and accelerate's process-wide state reset afterwards (the
    Trainer and Accelerator create it), so that nothing leaks into the next test."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def _trainer_run(out: Path, seed: int, resume: str | None = None) -> dict[str, torch.Tensor]:
    from transformers import Trainer, TrainingArguments

    model = hf_gpt2(seed=seed)
    gen = torch.Generator().manual_seed(3)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 96, (24, 16), generator=gen)]
    args = TrainingArguments(
        str(out),
        max_steps=6,
        per_device_train_batch_size=4,
        save_steps=3,
        warmup_steps=2,
        lr_scheduler_type="cosine",
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
        seed=0,
    )
    opt = OrScaleLM(model, lr=0.02, adamw_lr=0.005, ns_dtype="fp32")
    Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, None)).train(resume_from_checkpoint=resume)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.slow
def test_hf_trainer_trains_every_parameter_and_resumes_bit_equal(fresh_accelerate) -> None:
    """Trainer(optimizers=(OrScaleLM(model), None)): its scheduler drives both LRs, every parameter
    (the embeddings too) moves, and 3 + 3 steps resumed from checkpoint-3 into another model end
    where 6 straight steps do, bit for bit."""
    start = {n: p.detach().clone() for n, p in hf_gpt2(seed=0).named_parameters()}
    straight = _trainer_run(fresh_accelerate / "a", seed=0)
    assert all(not torch.equal(straight[n], w) for n, w in start.items())
    resumed = _trainer_run(fresh_accelerate / "b", seed=1, resume=str(fresh_accelerate / "a/checkpoint-3"))
    for name, w in straight.items():
        assert torch.equal(resumed[name], w), name


@pytest.mark.slow
def test_hf_trainer_builds_it_from_optimizer_cls_and_kwargs(fresh_accelerate) -> None:
    """Trainer(optimizer_cls_and_kwargs=(OrScaleLM, {"model": model, ...})): the Trainer hands the model
    itself over, routed as OrScaleLM(model), and every parameter moves; without "model", the Trainer's
    plain-tensor groups are refused in one line that names the form."""
    from transformers import Trainer, TrainingArguments

    model = hf_gpt2()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 96, (8, 16))]
    args = TrainingArguments(
        str(fresh_accelerate),
        max_steps=2,
        per_device_train_batch_size=4,
        save_strategy="no",
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    kwargs = {"model": model, "lr": 0.02, "adamw_lr": 0.005, "ns_dtype": "fp32"}
    trainer = Trainer(model=model, args=args, train_dataset=data, optimizer_cls_and_kwargs=(OrScaleLM, kwargs))
    trainer.train()
    opt = trainer.optimizer.optimizer  # accelerate's wrapper around it
    assert isinstance(opt, OrScaleLM)
    assert [g["param_names"] for g in opt.param_groups] == [g["param_names"] for g in OrScaleLM(model).param_groups]
    assert all(not torch.equal(p, start[n]) for n, p in model.named_parameters())
    without = Trainer(model=model, args=args, train_dataset=data, optimizer_cls_and_kwargs=(OrScaleLM, {"lr": 0.02}))
    with pytest.raises(ValueError, match=r"pass model=model .*optimizer_cls_and_kwargs=\(OrScaleLM, \{'model': model"):
        without.create_optimizer()


@pytest.mark.slow
def test_accelerate_save_state_and_load_state_resume_bit_equal(fresh_accelerate) -> None:
    from accelerate import Accelerator

    def prepared(seed: int):
        accelerator = Accelerator(cpu=True)
        model = hf_gpt2(seed=seed)
        opt = OrScaleLM(model, lr=0.02, adamw_lr=0.005, ns_dtype="fp32")
        model, opt = accelerator.prepare(model, opt)
        return accelerator, model, opt

    def steps(accelerator, model, opt, seeds) -> None:
        for t in seeds:
            batch = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(t))
            accelerator.backward(model(batch, labels=batch).loss)
            opt.step()
            opt.zero_grad()

    accelerator, model, opt = prepared(0)
    steps(accelerator, model, opt, [0, 1])
    accelerator.save_state(str(fresh_accelerate / "state"))
    steps(accelerator, model, opt, [2, 3])
    accelerator2, model2, opt2 = prepared(1)
    accelerator2.load_state(str(fresh_accelerate / "state"))
    steps(accelerator2, model2, opt2, [2, 3])
    for (n, p), (_, q) in zip(model.named_parameters(), model2.named_parameters(), strict=True):
        assert torch.equal(p, q), n


@pytest.mark.parametrize(
    "heading",
    [
        "A plain loop",
        pytest.param("The Hugging Face Trainer", marks=pytest.mark.slow),
        pytest.param("accelerate", marks=pytest.mark.slow),
    ],
)
def test_docs_examples_run_as_written(heading: str, fresh_accelerate) -> None:
    """Each example as the reader copies it (the Trainer's and accelerate's import their stacks: slow)."""
    exec(compile(docs_examples()[heading], f"docs/library.md: {heading}", "exec"), {"__name__": "__main__"})
