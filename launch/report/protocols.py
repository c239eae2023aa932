"""The report's protocols, side by side (issue 29): how each optimizer's loss, and each gap between
optimizers, depends on how the learning rates were chosen.

* **tuned** (the headline): each optimizer's two peak LRs, the matrices' and the AdamW group's
  (embedding, tied head, norm gains), chosen on the search seed; scored on the evaluation seeds.
* **shared**: one LR for both groups (`optim.adamw_lr` unset), chosen the same way from the
  same search's adamw_lr = lr line, scored on the same seeds: the protocol of the paper's "strict"
  runs and of this project's first ladder.
* **transfer**: an optimizer at another optimizer's tuned LRs with no re-tuning (OrScale-LM at
  Muon+Moonlight's: the paper's claim that OrScale-LM inherits Moonlight's learning rates).

Every difference is paired by seed (t-interval, df = n − 1); "the protocol's part" of a gap is
gap(shared) − gap(tuned), the per-seed difference of the two paired differences.
"""

from __future__ import annotations

import math
from typing import Any

from launch.report.headline import cell
from launch.report.markdown_util import fmt, opt_name, table
from launch.report.rows import Group, Row
from launch.report.selection import SHARED, TRANSFER
from launch.report.series import usable
from launch.report.stats import Comparison, compare, t_interval

PAIRS = (("orscale_lm", "muon_moonlight"), ("orscale_lm", "adamw"), ("muon_moonlight", "adamw"))


def has_protocols(rows: list[Row]) -> bool:
    return any(r.protocols for r in rows)


def _gap(a: Group | None, b: Group | None) -> Comparison | None:
    return compare(a.score.losses, b.score.losses) if usable(a) and usable(b) else None  # type: ignore[union-attr]


def _diff_of_gaps(tuned: tuple[Group, Group], shared: tuple[Group, Group]) -> tuple[float, float, float] | None:
    """gap(shared) − gap(tuned) per seed: (mean, lo, hi) of the t-interval, or None."""
    if not all(usable(g) for g in (*tuned, *shared)):
        return None
    losses = [g.score.losses for g in (*tuned, *shared)]
    seeds = sorted(set.intersection(*(set(x) for x in losses)))
    per_seed = [(losses[2][s] - losses[3][s]) - (losses[0][s] - losses[1][s]) for s in seeds]
    ti = t_interval(per_seed)
    return None if ti is None else (ti[0], ti[1], ti[2])


def _ci(c: Comparison | None) -> str:
    if c is None:
        return "—"
    note = " (within seed noise)" if c.within_noise else ""
    return f"{fmt(c.diff, sign=True)} [{fmt(c.ci[0], sign=True)}, {fmt(c.ci[1], sign=True)}]{note}"


def analyse(rows: list[Row]) -> list[dict[str, Any]]:
    """Per row with protocols: each optimizer under each protocol, and each pair's gaps."""
    out = []
    for row in rows:
        if not row.protocols:
            continue
        shared, transfer = row.protocols.get(SHARED, {}), row.protocols.get(TRANSFER, {})
        entry: dict[str, Any] = {"row": row, "optims": {}, "gaps": {}, "transfer": {}}
        for name, g in sorted(row.groups.items()):
            sh = shared.get(name)
            entry["optims"][name] = {"tuned": g, "shared": sh, "tuned_vs_shared": _gap(g, sh)}
        for a, b in PAIRS:
            ta, tb, sa, sb = row.groups.get(a), row.groups.get(b), shared.get(a), shared.get(b)
            both = None if None in (ta, tb, sa, sb) else _diff_of_gaps((ta, tb), (sa, sb))  # type: ignore[arg-type]
            entry["gaps"][(a, b)] = {"tuned": _gap(ta, tb), "shared": _gap(sa, sb), "protocol_part": both}
        for label, g in sorted(transfer.items()):
            base = label.removesuffix("_transfer")
            entry["transfer"][label] = {
                "group": g,
                "vs_own_tuned": _gap(g, row.groups.get(base)),
                "vs_source": {ref: _gap(g, row.groups.get(ref)) for ref in ("muon_moonlight", "adamw")},
            }
        out.append(entry)
    return out


def render(ctx: dict, pngs: dict[str, str]) -> list[str]:
    entries = ctx["protocols"]
    if not entries:
        return []
    out = [
        "## Protocols: how much of each result is the way the LRs were chosen",
        "",
        "**tuned** (the headline above): each optimizer's two peak LRs — the matrices' and the AdamW group's "
        "(token embedding = tied head, norm gains) — chosen on the search seed. **shared**: one LR for both groups "
        "(`optim.adamw_lr` unset), chosen on the same seed from the same search's adamw_lr = lr line. **transfer**: "
        "OrScale-LM at Muon+Moonlight's tuned LRs, no re-tuning (the paper's claim that Moonlight's LRs carry over). "
        "All scored on the same evaluation seeds; Δ paired by seed, 95% t-interval.",
        "",
        "### Each optimizer under the tuned and the shared protocol",
        "",
    ]
    body = []
    for e in entries:
        for name, o in e["optims"].items():
            body.append(
                [e["row"].short, opt_name(name), cell(o["tuned"]), cell(o["shared"]), _ci(o["tuned_vs_shared"])]
            )
    out += table(["row", "optimizer", "tuned", "shared", "tuned − shared"], body) + [""]
    out += [
        "### Gaps between optimizers under each protocol",
        "",
        "The protocol's part = gap(shared) − gap(tuned): how much of the shared protocol's gap came from tying "
        "the AdamW group's LR to the matrices'.",
        "",
    ]
    body = []
    for e in entries:
        for (a, b), gp in e["gaps"].items():
            part = gp["protocol_part"]
            part_text = (
                "—"
                if part is None
                else f"{fmt(part[0], sign=True)} [{fmt(part[1], sign=True)}, {fmt(part[2], sign=True)}]"
            )
            body.append(
                [e["row"].short, f"{opt_name(a)} − {opt_name(b)}", _ci(gp["tuned"]), _ci(gp["shared"]), part_text]
            )
    out += table(["row", "gap", "tuned", "shared", "the protocol's part"], body) + [""]
    if any(e["transfer"] for e in entries):
        out += ["### Transfer: OrScale-LM at Muon+Moonlight's tuned LRs", ""]
        body = []
        for e in entries:
            for t in e["transfer"].values():
                body.append(
                    [
                        e["row"].short,
                        cell(t["group"]),
                        _ci(t["vs_own_tuned"]),
                        _ci(t["vs_source"]["muon_moonlight"]),
                        _ci(t["vs_source"]["adamw"]),
                    ]
                )
        header = ["row", "OrScale-LM at Moonlight's LRs", "− OrScale-LM tuned", "− Muon+Moonlight tuned"]
        out += table([*header, "− AdamW tuned"], body) + [""]
    if "lr_grid" in pngs:
        out += [f"![loss over both LRs]({pngs['lr_grid']})", ""]
    return out


def _c(c: Comparison | None) -> dict | None:
    return None if c is None else {"diff": c.diff, "ci": list(c.ci), "p": c.p, "n": c.n}


def _g(g: Group | None) -> dict | None:
    if g is None:
        return None
    s = g.score
    mean = s.mean if usable(g) else None
    return {
        "status": g.status,
        "mean": mean if mean is not None and math.isfinite(mean) else None,
        "lr": s.lr,
        "adamw_lr": s.point[1],
        "seeds": sorted(s.losses),
    }


def summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for e in entries:
        part = lambda p: None if p is None else {"mean": p[0], "ci": [p[1], p[2]]}  # noqa: E731
        out[e["row"].short] = {
            "optims": {
                n: {"tuned": _g(o["tuned"]), "shared": _g(o["shared"]), "tuned_vs_shared": _c(o["tuned_vs_shared"])}
                for n, o in e["optims"].items()
            },
            "gaps": {
                f"{a}|{b}": {
                    "tuned": _c(g["tuned"]),
                    "shared": _c(g["shared"]),
                    "protocol_part": part(g["protocol_part"]),
                }
                for (a, b), g in e["gaps"].items()
            },
            "transfer": {
                label: {
                    "group": _g(t["group"]),
                    "vs_own_tuned": _c(t["vs_own_tuned"]),
                    "vs_source": {k: _c(v) for k, v in t["vs_source"].items()},
                }
                for label, t in e["transfer"].items()
            },
        }
    return out
