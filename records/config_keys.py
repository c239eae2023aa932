"""The config keys that moved when each component got a section of its own (docs/running.md, "Config
keys that moved"): a format-1 key (every family's, schedule's, source's and backend's setting flat in
its section) and the keys that now hold it. A config written with them (a YAML file, an override, a
run directory's config.yaml) is read as it ran: `upgrade` moves each to its new keys, one line each.
This table is history and never grows: a component added since is born with its own section."""

from __future__ import annotations

import copy
from typing import Any

_MUON = "ns_steps ns_coefficients ns_dtype ns_kernel nesterov r_min r_max trust_eps diagnostics compile_passes"
_CBP = "zeta rho s_min s_max equalize precondition"
_FSDP = "meta_init reshard_after_forward param_dtype"
_HUB = {
    "subset": "subset",
    "revision": "revision",
    "split": "split",
    "hub_retries": "retries",
    "hub_retry_wait_s": "retry_wait_s",
    "hub_retry_max_wait_s": "retry_max_wait_s",
    "hub_timeout_s": "timeout_s",
}

# format-1 key -> the keys that hold it now (a key that stays where it was is listed too: `optim.betas`
# is still the AdamW group's, and CBP's, LAMB's and Lion's own betas were that one key before).
MOVED: dict[str, tuple[str, ...]] = {
    **{f"optim.{k}": (f"optim.muon.{k}",) for k in _MUON.split()},
    "optim.momentum": ("optim.muon.momentum", "optim.lars.momentum"),
    **{f"optim.cbp_{k}": (f"optim.cbp.{k}",) for k in _CBP.split()},
    "optim.betas": ("optim.betas", "optim.cbp.betas", "optim.lamb.betas", "optim.lion.betas"),
    "optim.eps": ("optim.eps", "optim.lamb.eps", "optim.lars.eps"),
    "optim.lars_trust_coefficient": ("optim.lars.trust_coefficient",),
    **{f"optim.{k}": (f"optim.wsd.{k}",) for k in ("decay_fraction", "decay_steps", "decay_shape")},
    **{f"data.{old}": (f"data.hub.{new}",) for old, new in _HUB.items()},
    **{f"parallel.{k}": (f"parallel.fsdp.{k}",) for k in _FSDP.split()},
}


def upgrade(tree: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, tuple[str, ...]]]]:
    """`tree` (a config's sections, as YAML writes them) with every format-1 key moved to the keys that
    hold it now, where those are not set already (a null, "unset", is left to the new key's default); and
    (old key, new keys) for each key moved. A key set both ways keeps its new value. `tree` itself is
    left as it was."""
    out = copy.deepcopy(tree)
    moved = []
    for old, new in MOVED.items():
        section, key = old.split(".")
        parent = out.get(section)
        if not isinstance(parent, dict) or key not in parent:
            continue
        if parent[key] is None:  # null was "unset": the new key's default says the same
            if old not in new:
                parent.pop(key)
            continue
        value = parent[key] if old in new else parent.pop(key)
        for target in new:
            if target == old:
                continue
            node = out
            *path, leaf = target.split(".")
            for part in path:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    break
            else:
                node.setdefault(leaf, copy.deepcopy(value))
        moved.append((old, new))
    return out, moved
