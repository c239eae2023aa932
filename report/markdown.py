"""report.md: the preamble, the top (report/headline.py), then the details: every group's final loss
beside the paper's, LR sensitivity, curves, downstream accuracy, hyperparameters, the loop features'
own records and the runs that did not finish. Every number comes from the `Report` (report/analysis.py)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from orscale.muon_spec import MuonOptions
from orscale.registry import find_optimizer
from orscale.variants import VARIANTS
from report import headline
from report.analysis import Report
from report.fmt import fmt_point, num, opt_name, order, provenance, short_commit, sig, table
from report.runs import PAPER, REFS
from report.stats import compare

# (key, label, applies to: "" every optimizer, "muon" the Muon family, "trust" its trust ratios)
_HYPER = """\
optim.weight_decay | weight decay |
optim.betas | AdamW betas (Muon family: its AdamW part, embeddings and norms) |
optim.eps | AdamW eps |
optim.exempt_norms_and_embeddings | no decay on norms/embeddings |
optim.muon.momentum | momentum | muon
optim.muon.nesterov | Nesterov | muon
optim.muon.ns_steps | Newton–Schulz steps | muon
optim.muon.ns_coefficients | NS coefficients | muon
optim.muon.ns_dtype | NS dtype | muon
optim.muon.r_min | r_min | trust
optim.muon.r_max | r_max | trust
optim.muon.trust_eps | trust-ratio ε | trust
optim.warmup_steps | warmup steps (linear) |
optim.min_lr_ratio | cosine schedule floor (× peak LR) |
optim.grad_clip | grad clip (global norm; 0 = off) |
train.tokens_per_step | tokens per step |
data.seq_len | context |
train.dtype | compute dtype |
"""
HYPER = [tuple(x.strip() for x in line.split("|")) for line in _HYPER.splitlines()]
BASELINE = REFS[0]  # the downstream tables' "Δ vs AdamW": the report's first reference optimizer


def render(rep: Report, pngs: dict[str, str]) -> str:
    n_fin = sum(r.finished for r in rep.runs)
    out = [
        f"# Sweep report: `{rep.root}`",
        "",
        f"{len(rep.runs)} run directories: {n_fin} finished, {len(rep.runs) - n_fin} unfinished (listed at the end, "
        "never as numbers). Losses are the final validation cross-entropy (nats/token) of each run's last "
        "evaluation at `train.max_steps`. A row is one setting (model, steps × tokens per step, context and every "
        "other option but optimizer, LR and seed); **best LR** = lowest final loss on the LR-selection seed "
        "(with an LR search), else lowest mean over seeds; a diverged seed (null/NaN) disqualifies its LR. "
        "Provenance: each run directory, `@commit` from its run.log and `cfg:` = first 8 hex digits of "
        "`sha256sum config.yaml`.",
        "",
    ]
    out += headline.render(rep, pngs) + _paper_table(rep) + _lr_sensitivity(rep, pngs)
    out += ["## Curves", "", f"![val loss vs tokens]({pngs['curves']})", ""]
    out += [f"![Muon-family diagnostics per matrix class]({pngs['diag']})", ""]
    out += _downstream(rep, pngs) + _hyperparameters(rep) + _other_records(rep) + _unfinished(rep)
    return "\n".join(out)


def _paper_table(rep: Report) -> list[str]:
    out = ["## Final validation loss at the best learning rate", ""]
    body = []
    for row in rep.rows:
        for name in order(row.groups):
            g = row.groups[name]
            s = g.score
            paper = PAPER.get(row.paper_scale or "", {}).get(name)
            loss = f"{num(s.mean)} ± {num(s.std)}" if len(s.runs) > 1 else num(s.mean)
            pending = f"*pending: {g.status}* (so far {loss})" if s.runs else "*pending*"
            tokens = ", ".join(f"{t:,}" for t in sorted({r.final_tokens or 0 for r in s.runs}))
            val_tokens = ", ".join(f"{t:,}" if t else "?" for t in sorted({r.val_tokens for r in s.runs}, key=str))
            cells = [row.short, row.label, f"{row.steps} × {row.tokens_per_step:,}", opt_name(name)]
            cells += [fmt_point(s.point) + (f" ⚠ at the {g.edge} tried" if g.edge else "")]
            cells += [loss if g.status == "done" else pending, str(len(s.runs)), tokens, val_tokens]
            paper_cell = f"{paper:.4f} (paper, {row.paper_scale})" if paper is not None else "—"
            body.append([*cells, paper_cell, provenance(s.runs, rep.root)])
    header = ["scale", "model (preset[overrides])", "steps × tokens/step", "optimizer"]
    header += ["best LR (matrices / AdamW group)", "val loss (mean ± std)"]
    header += ["seeds", "tokens seen", "val tokens", "paper's number (docs/algorithm.md, not ours)"]
    out += table([*header, "runs (commit, config)"], body) if body else ["No finished runs."]
    commits = sorted({c for r in rep.runs if r.finished for c in r.commits})
    if len(commits) > 1:
        out += ["", f"**Note:** the finished runs come from {len(commits)} different commits "]
        out[-1] += f"({', '.join(map(short_commit, commits))}); compare cells across commits with care."
    if any(c.endswith("-dirty") for c in commits):
        out += [
            "",
            "**Note:** `-dirty` runs were started from a work tree with uncommitted changes: the "
            "commit alone does not reproduce them.",
        ]
    return out + [
        "",
        "The *paper's number* column is the published one-seed result (docs/algorithm.md), shown only where the row "
        "has the paper's preset, steps, tokens per step and context (configs/<scale>.yaml); it is never used "
        "in any statistic here. Seeds: those scored (with an LR search, the evaluation seeds only).",
        "",
    ]


def _lr_sensitivity(rep: Report, pngs: dict[str, str]) -> list[str]:
    out = [
        "## Learning-rate sensitivity",
        "",
        "Final val loss per point tried: on the LR-selection seed (with an LR search: the only seed run at every "
        "point), else the mean over seeds; (runs at that point). **Bold** = best. A point is the matrices' peak "
        "LR, or `LR / AdamW-group LR` where the AdamW group (embedding, tied head, norm gains) ran at its own.",
        "",
    ]
    for row in rep.rows:
        groups = row.groups.values()
        if all(len(g.points) < 2 for g in groups) and any(g.fixed for g in groups):
            continue  # a budget run at another scale's best point (lr_from): nothing to compare
        body = []
        for name in order(row.groups):
            g = row.groups[name]
            cells = []
            for p in sorted(g.points):
                text = f"{fmt_point(p)}: {num(g.selection_loss(p))} ({int(g.cells.loc[p, 'n'])})"
                cells.append(f"**{text}**" if p == g.best else text)
            note = f"best at the {g.edge} tried — extend the search" if g.edge else "interior optimum"
            note = "one point only" if len(g.points) == 1 else note
            body.append([opt_name(name), "; ".join(cells), note if g.status == "done" else f"{note}; {g.status}"])
        out += [f"### {row.title}", ""] + table(["optimizer", "points tried (loss, runs)", "note"], body) + [""]
    return out + [f"![loss vs LR]({pngs['lr']})", ""]


def _downstream(rep: Report, pngs: dict[str, str]) -> list[str]:
    out = ["## Downstream evaluation", ""]
    if not rep.downstream:
        return out + [
            "No downstream accuracies in the logs (no `eval/<task>/*` records at the final step, no "
            "`downstream.json` or `downstream/step_<max_steps>.json` from `python -m launch.evaluation`).",
            "",
        ]
    out += [
        "Each task's primary metric at the end of training, per scale × optimizer at the best LR, over the "
        "scored seeds: mean ± std, 95% t-interval over seeds (one seed: the task's Wilson interval over "
        "examples), the Wilson interval of that mean over the task's n examples (every seed scores the same "
        "examples, so the seeds' interval alone leaves out the examples' sampling error), Δ vs AdamW paired "
        "by seed (on the same examples). *Near chance*: either interval holds the chance level, so the model "
        "has not shown that it learned the task and differences there mean little.",
        "",
    ]
    from evals.intervals import wilson_interval  # evals imports torch: only when there are accuracies

    for task, items in sorted(rep.downstream.items()):
        out += [f"### {task} ({items[0]['metric']})", ""]
        ref = {e["row"].name: e for e in items if e["optim"] == BASELINE}
        body = []
        for e in items:
            vals, n, chance = list(e["values"].values()), e["n"], e["chance"]
            lo, hi = e["ci"]
            ex = wilson_interval(float(np.mean(vals)) * n, n) if vals and n else (math.nan, math.nan)
            near = isinstance(chance, (int, float)) and (lo <= chance <= hi or ex[0] <= chance <= ex[1])
            a = ref.get(e["row"].name)
            c = compare(e["values"], a["values"]) if a is not None and e["optim"] != BASELINE else None
            delta = "—" if c is None else f"{c.diff:+.4f}"
            delta += f" [{c.ci[0]:+.4f}, {c.ci[1]:+.4f}] p={c.p:.2g}" if c is not None and c.p is not None else ""
            acc = f"{np.mean(vals):.4f}" + (f" ± {np.std(vals, ddof=1):.4f}" if len(vals) > 1 else "") if vals else "—"
            cells = [e["row"].short, opt_name(e["optim"]), f"{e['loss']:.4f}", acc]
            cells += [f"[{lo:.4f}, {hi:.4f}]" if math.isfinite(lo) else "—"]
            cells += [f"[{ex[0]:.3f}, {ex[1]:.3f}]" if math.isfinite(ex[0]) else "—", str(len(vals))]
            cells += [str(n) if n is not None else "?", f"{chance:.3f}" if isinstance(chance, (int, float)) else "?"]
            body.append([*cells, delta, "near chance" if near else ""])
        header = ["scale", "optimizer", "val loss", "accuracy", "95% over seeds", "95% over examples", "seeds"]
        out += table([*header, "examples", "chance", "Δ vs AdamW", "note"], body) + [""]
    if "downstream" in pngs:
        out += [f"![accuracy against validation loss]({pngs['downstream']})", ""]
    return out


def _applies(name: str, kind: str) -> bool:
    """Whether a setting of `kind` (HYPER) applies to optimizer `name`: the Muon family's settings
    (`optim.muon`) to the optimizers that read them (a name the table does not register, such as a
    report-only protocol, counts as one), its trust ratio's to the variants that have one."""
    base = name.split("#")[0]
    spec = find_optimizer(base)
    muon = spec is None or MuonOptions in spec.options
    # "none": no r, no clipping
    trust = spec is None or (base in VARIANTS and VARIANTS[base].denominator != "none")
    return not kind or (muon and (kind == "muon" or trust))


def _value(v: Any) -> str:
    return "(" + ", ".join(map(str, v)) + ")" if isinstance(v, list) else str(v)


def _hyperparameters(rep: Report) -> list[str]:
    runs: dict[str, list] = {}
    for row in rep.rows:
        for name, g in row.groups.items():
            runs.setdefault(name, []).extend(g.table["run"])
    if not runs:
        return []
    names = order(runs)
    body = []
    for key, label, kind in HYPER:
        cells = []
        for n in names:
            vals = [v for v in sorted({_value(r.cfg(key)) for r in runs[n]}, key=lambda s: (len(s), s)) if v != "None"]
            cells.append(", ".join(vals or ["— (not in config.yaml)"]) if _applies(n, kind) else "n/a")
        body.append([label, f"`{key}`", *cells])
    out = [
        "## Hyperparameters",
        "",
        "Read from every finished run's config.yaml (distinct values joined); peak LRs are in the tables "
        "above. Schedule: linear warmup, then cosine to the floor (orscale/schedule.py).",
        "",
    ]
    return out + table(["setting", "key", *[opt_name(n) for n in names]], body) + [""]


def _other_records(rep: Report) -> list[str]:
    """A table per kind of record a loop feature writes of its own: each run's last one."""
    out = []
    for kind, by_run in rep.records.items():
        keys = list(dict.fromkeys(k for numbers in by_run.values() for k in numbers))
        body = [[f"`{run}`", *(sig(numbers.get(k), 4) for k in keys)] for run, numbers in by_run.items()]
        out += [f"## Records of kind `{kind}`", "", "Each run's last record of this kind (metrics.jsonl).", ""]
        out += table(["run directory", *keys], body) + [""]
    return out


def _unfinished(rep: Report) -> list[str]:
    bad = [r for r in rep.runs if not r.finished or r.bad_lines]
    out = ["## Unfinished runs", ""]
    if not bad:
        return out + ["None.", ""]
    body = []
    for r in bad:
        lr = str(r.cfg("optim.lr", "?")) + (f" / {r.cfg('optim.adamw_lr')}" if r.cfg("optim.adamw_lr") else "")
        state = (r.problem or "finished") + (f"; {r.bad_lines} unreadable line(s)" if r.bad_lines else "")
        where, seed = f"`{r.path.relative_to(rep.root)}`", str(r.cfg("train.seed", "?"))
        body.append([where, str(r.cfg("optim.name", "?")), lr, seed, state])
    return out + table(["run directory", "optimizer", "LR", "seed", "state"], body) + [""]
