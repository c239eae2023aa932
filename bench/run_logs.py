"""Pack a sweep's finished runs' logs into one archive, or unpack one into a runs directory.

    python -m bench.run_logs pack runs/cpu_ladder docs/results/cpu_ladder/run_logs.tar.xz
    python -m bench.run_logs unpack docs/results/cpu_ladder/run_logs.tar.xz runs/cpu_ladder

The archive holds what `report` and `launch.sweep` read of a finished run (config.yaml, run.log,
metrics.jsonl, sweep.out, downstream/*.json) and the sweep's sweep_plan.json; no checkpoints and no
unfinished run (a run directory without its checkpoint could not resume). So a report ships with
the logs that rebuild it, and a sweep stopped on one machine continues on another: unpack, then run
the same `python -m launch.sweep` command, which skips every finished cell. Unpacking never replaces
a file already there.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

from records.read import find_run_dirs, read_run

RUN_FILES = ("config.yaml", "run.log", "metrics.jsonl", "sweep.out")


def finished_files(root: Path) -> list[Path]:
    """Every file to pack, relative to root: the finished runs' logs, then the sweep's plan."""
    files: list[Path] = []
    for run_dir in find_run_dirs(root):
        if not read_run(run_dir).finished:
            continue
        files += [run_dir / name for name in RUN_FILES if (run_dir / name).is_file()]
        files += sorted((run_dir / "downstream").glob("*.json"))
    plan = root / "sweep_plan.json"
    return [f.relative_to(root) for f in files + ([plan] if plan.is_file() else [])]


def pack(root: Path, archive: Path) -> int:
    files = finished_files(root)
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:xz") as tar:
        for rel in files:
            tar.add(root / rel, arcname=str(rel), recursive=False)
    tmp.replace(archive)  # complete or absent
    return sum(1 for f in files if f.name == "metrics.jsonl")


def unpack(archive: Path, root: Path) -> tuple[int, int]:
    """(files written, files kept because they were already there)."""
    written = kept = 0
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            if (root / member.name).exists():
                kept += 1
                continue
            tar.extract(member, root, filter="data")  # "data": no absolute paths, links or ../
            written += 1
    return written, kept


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run_logs", description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack", help="runs directory -> archive")
    a.add_argument("root", type=Path)
    a.add_argument("archive", type=Path)
    b = sub.add_parser("unpack", help="archive -> runs directory")
    b.add_argument("archive", type=Path)
    b.add_argument("root", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "pack":
        if not args.root.is_dir():
            print(f"error: runs directory '{args.root}' does not exist", file=sys.stderr)
            return 2
        print(f"{pack(args.root, args.archive)} finished runs -> {args.archive}")
    else:
        if not args.archive.is_file():
            print(f"error: archive '{args.archive}' does not exist", file=sys.stderr)
            return 2
        written, kept = unpack(args.archive, args.root)
        print(f"{written} files written under {args.root}, {kept} already there kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
