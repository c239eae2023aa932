"""The later sections of report.md (curves, downstream accuracy, hyperparameters, throughput,
unfinished runs) and the headline's machine-readable form for summary.json."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from evals.intervals import wilson_interval
from launch.report.logs import downstream as read_downstream
from launch.report.markdown_util import opt_name, table
from launch.report.rows import Group
from launch.report.series import usable
from launch.report.stats import compare, t_interval
from launch.run.records import RunRecord, finite

NO_TRUST_RATIO = ("muon", "muon_moonlight")  # orscale.variants: denominator "none" (no r, no clipping)


def _n(x: Any) -> Any:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def curves(ctx: dict, pngs: dict[str, str]) -> list[str]:
    out = ["## Curves", "", f"![val loss vs tokens]({pngs['curves']})", ""]
    if "flops" in pngs:
        out += [f"![val loss vs training FLOPs]({pngs['flops']})", ""]
    out += [
        "Training FLOPs = tokens × (6 × parameters + 12·L·d·T): every matmul (the tied output layer "
        "included) forward and backward, plus attention's QKᵀ and AV at context T, as "
        "`models.gpt.GPT.flops_per_token` counts them.",
        "",
        f"![Muon-family diagnostics per matrix class]({pngs['diag']})",
        "",
    ]
    if "diag_scales" in pngs:
        out += [f"![diagnostics at the end of training against N]({pngs['diag_scales']})", ""]
    return out


def _primary(task: str, s: dict) -> str:
    metric = s.get("primary_metric")
    if isinstance(metric, str) and metric in s:
        return metric
    try:  # the task's OLMES primary metric; evals imports torch, so only when a task is shown
        from evals.task_data import TASKS

        return TASKS[task].primary if task in TASKS else "acc"
    except ImportError:
        return "acc"


def downstream_table(ctx: dict) -> dict[str, list[dict]]:
    """task -> [{row, optim, metric, per-seed values, chance, n, loss}] for the scored runs."""
    out: dict[str, list[dict]] = {}
    for row in ctx["rows"]:
        for name, g in sorted(row.groups.items()):
            if not usable(g):
                continue
            per_seed: dict[str, dict[int, dict]] = {}
            for r in g.score.runs:
                for task, s in read_downstream(r).items():
                    per_seed.setdefault(task, {})[int(r.cfg("train.seed", 0))] = s
            for task, by_seed in per_seed.items():
                first = next(iter(by_seed.values()))
                metric = _primary(task, first)
                out.setdefault(task, []).append(
                    {
                        "row": row,
                        "optim": name,
                        "metric": metric,
                        "values": {s: v[metric] for s, v in by_seed.items() if finite(v.get(metric))},
                        "chance": first.get("chance"),
                        "n": first.get("n"),
                        "ci_one": first.get(f"{metric}_ci"),
                        "loss": g.score.mean,
                        "source": first.get("source"),
                    }
                )
    return out


def downstream(ctx: dict, pngs: dict[str, str]) -> list[str]:
    data = ctx["downstream"] if "downstream" in ctx else downstream_table(ctx)
    out = ["## Downstream evaluation", ""]
    if not data:
        return out + [
            "No downstream accuracies in the logs (no `eval/<task>/*` records at the final step, no "
            "`downstream.json` or `downstream/step_<max_steps>.json` from `python -m launch.evaluate`).",
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
    for task, items in sorted(data.items()):
        out += [f"### {task} ({items[0]['metric']})", ""]
        ref = {(e["row"].name): e for e in items if e["optim"] == "adamw"}
        body = []
        for e in items:
            vals = list(e["values"].values())
            ti = t_interval(vals)
            lo, hi = (ti[1], ti[2]) if ti else (e["ci_one"] or (math.nan, math.nan))
            # Every seed scores the same examples, so the seeds' interval leaves out the examples'
            # sampling error: the Wilson interval of the mean accuracy over n examples holds it.
            n = e["n"]
            ex = wilson_interval(float(np.mean(vals)) * n, n) if vals and n else (math.nan, math.nan)
            chance = e["chance"]
            near = finite(chance) and (lo <= chance <= hi or ex[0] <= chance <= ex[1])
            a = ref.get(e["row"].name)
            c = compare(e["values"], a["values"]) if a is not None and e["optim"] != "adamw" else None
            body.append(
                [
                    e["row"].short,
                    opt_name(e["optim"]),
                    f"{e['loss']:.4f}",
                    (f"{np.mean(vals):.4f} ± {np.std(vals, ddof=1):.4f}" if len(vals) > 1 else f"{vals[0]:.4f}")
                    if vals
                    else "—",
                    f"[{lo:.4f}, {hi:.4f}]" if math.isfinite(lo) else "—",
                    f"[{ex[0]:.3f}, {ex[1]:.3f}]" if math.isfinite(ex[0]) else "—",
                    str(len(vals)),
                    str(e["n"]) if e["n"] is not None else "?",
                    f"{chance:.3f}" if finite(chance) else "?",
                    "—"
                    if c is None
                    else f"{c.diff:+.4f} [{c.ci[0]:+.4f}, {c.ci[1]:+.4f}] p={c.p:.2g}"
                    if c.p is not None
                    else f"{c.diff:+.4f}",
                    "near chance" if near else "",
                ]
            )
        header = ["scale", "optimizer", "val loss", "accuracy", "95% over seeds", "95% over examples"]
        header += ["seeds", "examples", "chance"]
        out += table(header + ["Δ vs AdamW", "note"], body) + [""]
    if "downstream" in pngs:
        out += [f"![accuracy against validation loss]({pngs['downstream']})", ""]
    return out


HYPER = [
    ("optim.weight_decay", "weight decay", None),
    ("optim.betas", "AdamW betas (Muon family: its AdamW part, embeddings and norms)", None),
    ("optim.eps", "AdamW eps", None),
    ("optim.exempt_norms_and_embeddings", "no decay on norms/embeddings", None),
    ("optim.momentum", "momentum", "muon"),
    ("optim.nesterov", "Nesterov", "muon"),
    ("optim.ns_steps", "Newton–Schulz steps", "muon"),
    ("optim.ns_coefficients", "NS coefficients", "muon"),
    ("optim.ns_dtype", "NS dtype", "muon"),
    ("optim.r_min", "r_min", "trust"),
    ("optim.r_max", "r_max", "trust"),
    ("optim.trust_eps", "trust-ratio ε", "trust"),
    ("optim.warmup_steps", "warmup steps (linear)", None),
    ("optim.min_lr_ratio", "cosine schedule floor (× peak LR)", None),
    ("optim.grad_clip", "grad clip (global norm; 0 = off)", None),
    ("train.tokens_per_step", "tokens per step", None),
    ("data.seq_len", "context", None),
    ("train.dtype", "compute dtype", None),
]


def _applies(name: str, kind: str | None) -> bool:
    base = name.split("#")[0]
    muon = base not in ("adamw", "cbp", "lamb", "lars")
    if kind == "muon":
        return muon
    if kind == "trust":
        return muon and base not in NO_TRUST_RATIO
    return True


def _fmt_value(v: Any) -> str:
    if isinstance(v, list):
        return "(" + ", ".join(map(str, v)) + ")"
    return str(v)


def hyperparameters(ctx: dict) -> list[str]:
    runs: dict[str, list[RunRecord]] = {}
    for row in ctx["rows"]:
        for name, g in row.groups.items():
            runs.setdefault(name, []).extend(r for c in g.cells.values() for r in c.runs)
    if not runs:
        return []
    names = sorted(runs, key=lambda n: (n != "adamw", n != "muon_moonlight", n))
    body = []
    for key, label, kind in HYPER:
        cells = []
        for n in names:
            if not _applies(n, kind):
                cells.append("n/a")
                continue
            vals = sorted({_fmt_value(r.cfg(key)) for r in runs[n]}, key=lambda s: (len(s), s))
            vals = [v for v in vals if v != "None"] or ["— (not in config.yaml)"]
            cells.append(", ".join(vals))
        body.append([label, f"`{key}`", *cells])
    out = [
        "## Hyperparameters",
        "",
        "Read from every finished run's config.yaml (distinct values joined); peak LRs are in the tables "
        "above. Schedule: linear warmup, then cosine to the floor (orscale/schedule.py).",
        "",
    ]
    return out + table(["setting", "key", *[opt_name(n) for n in names]], body) + [""]


def throughput(ctx: dict, pngs: dict[str, str]) -> list[str]:
    body = []
    for row in ctx["rows"]:
        for name, g in sorted(row.groups.items()):
            rr = [r for c in g.cells.values() for r in c.runs]
            tps = [x["tokens_per_s"] for r in rr for x in r.train if _n(x.get("tokens_per_s"))]
            mfu = [x["mfu"] for r in rr for x in r.train if _n(x.get("mfu"))]
            mem = [x["peak_mem_gib"] for r in rr for x in r.train if _n(x.get("peak_mem_gib"))]
            wait = [x["data_wait_frac"] for r in rr for x in r.train if _n(x.get("data_wait_frac"))]
            body.append(
                [
                    row.name,
                    opt_name(name),
                    str(len(rr)),
                    f"{np.median(tps):,.0f}" if tps else "—",
                    f"{np.median(mfu):.3f}" if mfu else "n/a",
                    f"{max(mem):.2f}" if mem else "n/a",
                    f"{np.median(wait):.3f}" if wait else "n/a",
                ]
            )
    out = [
        "## Throughput",
        "",
        "**Caveat:** runs of a sweep on a shared machine ran concurrently with each other and with other work; "
        "tokens/s differences between runs reflect the machine's load at the time, not optimizer speed.",
        "",
    ]
    out += table(["row", "optimizer", "runs", "median tokens/s", "median MFU", "peak mem GiB", "data wait"], body)
    return out + [
        "",
        "Medians over ~64 evenly spaced logged steps per run, all LRs and seeds of the row; MFU and "
        "memory are n/a where the logs do not carry them (MFU is null on CPU).",
        "",
        f"![tokens/s per scale and optimizer]({pngs['throughput']})",
        "",
    ]


def unfinished(runs: list[RunRecord], root: Path) -> list[str]:
    bad = [r for r in runs if not r.finished or r.bad_lines]
    out = ["## Unfinished runs", ""]
    if not bad:
        return out + ["None.", ""]
    body = [
        [
            f"`{r.path.relative_to(root)}`",
            str(r.cfg("optim.name", "?")),
            str(r.cfg("optim.lr", "?")) + (f" / {r.cfg('optim.adamw_lr')}" if r.cfg("optim.adamw_lr") else ""),
            str(r.cfg("train.seed", "?")),
            (r.problem or "finished") + (f"; {r.bad_lines} unreadable line(s)" if r.bad_lines else ""),
        ]
        for r in bad
    ]
    return out + table(["run directory", "optimizer", "LR", "seed", "state"], body) + [""]


def _group_json(g: Group) -> dict:
    s = g.score
    return {
        "status": g.status,
        "mean": _n(s.mean) if usable(g) else None,
        "std": _n(s.std) if usable(g) else None,
        "n": len(s.runs),
        "lr": s.lr,
        "adamw_lr": s.point[1],
        "edge": g.edge,
        "losses": {str(k): _n(v) for k, v in s.losses.items()},
    }


def _comp(c: Any, adj: float | None = None) -> dict | None:
    if c is None:
        return None
    return {
        "diff": c.diff,
        "ci": list(c.ci),
        "df": c.df,
        "n": c.n,
        "p": c.p,
        "p_holm": adj,
        "within_noise": c.within_noise,
    }


def _slope(s: Any) -> dict | None:
    return None if s is None else {"slope": s.slope, "ci": list(s.ci) if s.ci else None, "df": s.df}


def headline_json(ctx: dict) -> dict:
    h = ctx["headline"]
    wins = []
    for e in h["wins"]["rows"]:
        row = e["row"]
        win = e["winner"]
        wins.append(
            {
                "scale": row.short,
                "row": row.name,
                "N": row.n_params,
                "tokens": row.tokens,
                "groups": {n: _group_json(g) for n, g in row.groups.items()},
                "deltas": {f"{a}|{b}": _comp(c, adj) for (a, b), (c, adj) in e["deltas"].items()},
                "winner": None if win is None else {"optim": win[0], "runner_up": win[1], "margin": -win[2]},
            }
        )
    speed = []
    for e in h["speedup"]:
        f = e.get("fit")
        fit = None if f is None else {"E": f.E, "B": f.A, "beta": f.alpha, "E_ci": e["E_ci"], "beta_ci": e["beta_ci"]}
        speed.append(
            {"scale": e["scale"], "budgets": e["budgets"], "fit": fit, "reason": e.get("reason"), "rows": e["rows"]}
        )
    t = h["transfer"]
    transfer = {
        "points": t["points"],
        "fits": {n: {**f, "slope": _slope(f["slope"])} for n, f in t["fits"].items()},
    }
    sc = h["scaling"]
    fits = {}
    for n, e in sc["fits"].items():
        f = e.get("fit")
        fits[n] = {"n": e["n"], "N": e["N"], "reason": e.get("reason")}
        if f is not None:
            fits[n].update(E=f.E, A=f.A, alpha=f.alpha, E_ci=e["E_ci"], A_ci=e["A_ci"], alpha_ci=e["alpha_ci"])
    gaps = {f"{a}|{b}": {**g, "trend": _slope(g["trend"])} for (a, b), g in sc["gaps"].items()}
    return {
        "complete": h["complete"],
        "total": h["total"],
        "n_tests": h["wins"]["n_tests"],
        "wins": wins,
        "speedup": speed,
        "lr_transfer": transfer,
        "scaling": {"series": sc["series"], "fits": fits, "gaps": gaps},
    }
