"""``stockade sim``: deterministic simulation of the protocol under faults.

    stockade sim --seeds 1000                 1000 seeds from a random first seed
    stockade sim --minutes 2 --jobs 2         as many seeds as fit in 2 minutes, on 2 processes
    stockade sim --seed 912                   replay one seed: its drawn options, then its trace on a violation
    stockade sim --seeds 500 --mutant strict-greater   a control: must report a violation

Prints examples run, steps, simulated lease-hours and violations; on a
violation, the command that replays it and a minimal narrated trace. --json
prints one JSON object instead (with --seed: the seed's figures and its drawn
options). A campaign prints a progress line on stderr every --progress-s
seconds (default 10; 0: none). Exit status: 0 no violation, 1 a violation,
2 bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stockade.cli._common import help_text
from stockade.testing.history import dump_jsonl
from stockade.testing.mutants import MUTANTS, simulated
from stockade.testing.sim import Campaign, RunResult, narrate, replay_command, run_campaign, run_seed

__all__ = ["run"]

SEED_MAX = 2**63 - 1
JOBS_MAX = 64
PROGRESS_S_DEFAULT = 10.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stockade sim", description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--seed", type=int, help="run exactly this seed (a replay)")
    what.add_argument("--seeds", type=int, help="run this many seeds, from --first-seed")
    parser.add_argument("--minutes", type=float, help="wall-clock budget in minutes")
    parser.add_argument("--seconds", type=float, help="wall-clock budget in seconds")
    parser.add_argument("--first-seed", type=int, default=None, help="first seed of a campaign (default: random)")
    parser.add_argument("--mutant", choices=sorted(simulated()),
                        help="run a deliberately broken variant (a control)")
    parser.add_argument("--list-mutants", action="store_true", help="list the mutants and exit")
    parser.add_argument("--jobs", type=int, default=1, help=f"worker processes (1..{JOBS_MAX})")
    parser.add_argument("--keep-going", action="store_true", help="do not stop at the first violation")
    parser.add_argument("--no-linearizability", action="store_true", help="skip the linearizability check")
    parser.add_argument("--save", type=Path, help="directory for a failing seed's history.jsonl and audit.jsonl")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--progress-s", type=float, default=PROGRESS_S_DEFAULT,
                        help=f"a progress line on stderr this often during a campaign (default "
                             f"{PROGRESS_S_DEFAULT:g}; 0: none)")
    return parser


def run(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list_mutants:
        width = max(map(len, MUTANTS))
        for name, mutant in MUTANTS.items():
            print(f"{name:<{width}}  {mutant.description}")
            print(f"{'':<{width}}  seam: {mutant.seam.value}; usually caught by {mutant.caught_by}")
        return 0
    if not 1 <= args.jobs <= JOBS_MAX:
        parser.error(f"--jobs must be in 1..{JOBS_MAX}")
    if not 0 <= args.progress_s <= 3600:
        parser.error("--progress-s must be in 0..3600")
    if args.seed is not None:
        if not 0 <= args.seed <= SEED_MAX:
            parser.error(f"--seed must be in 0..{SEED_MAX}")
        return _replay(args)
    seconds = args.seconds if args.seconds is not None else (args.minutes * 60 if args.minutes is not None else None)
    if args.seeds is None and seconds is None:
        args.seeds = 100
    if args.seeds is not None and args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if seconds is not None and seconds <= 0:
        parser.error("--minutes/--seconds must be positive")
    first = args.first_seed if args.first_seed is not None else random.SystemRandom().randrange(2**32)
    count = args.seeds
    campaign = _campaign(first, count, seconds, args)
    _report(campaign, first, args)
    return 1 if campaign.failures else 0


#: The worlds a seed runs (`stockade.testing.sim.run_seed`), as a report names them.
_WORLDS = {"plain": "plain", "rwlock": "read/write lock"}


def _replay(args: argparse.Namespace) -> int:
    result = run_seed(args.seed, mutant=args.mutant, linearizability=not args.no_linearizability)
    lease_hours = result.lease_ns / 3600e9
    options = dataclasses.asdict(result.options)
    if args.json:
        print(json.dumps({
            "seed": result.seed, "mutant": result.mutant, "steps": result.steps, "operations": result.operations,
            "simulated_s": round(result.simulated_ns / 1e9, 6), "simulated_lease_hours": round(lease_hours, 6),
            "violations": len(result.violations), "undecided_scopes": len(result.undecided), "options": options,
            "world": result.world, "steps_by_world": result.steps_by_world,
        }, sort_keys=True, default=str))
    else:
        print(f"seed {result.seed}" + (f" (mutant {result.mutant})" if result.mutant else "")
              + f": steps {result.steps}, operations {result.operations}, simulated {result.simulated_ns / 1e9:.3f} s, "
                f"lease-hours {lease_hours:.5f}, violations {len(result.violations)}")
        print("worlds: " + ", ".join(f"{_WORLDS[name]} {steps} steps" for name, steps in result.steps_by_world.items())
              + f"; options of the {_WORLDS[result.world]} world")
        print("options: " + ", ".join(f"{name}={value}" for name, value in options.items()))
    if result.violations:
        _print_failure(result, args.save, stream=sys.stderr if args.json else sys.stdout)
        return 1
    return 0


def _seeds(first: int, count: int | None, job: int, jobs: int) -> Iterator[int]:
    seed = first + job
    while count is None or seed < first + count:
        yield seed % (SEED_MAX + 1)
        seed += jobs


def _with_progress(seeds: Iterator[int], every_s: float, budget_s: float | None, job: int, jobs: int) -> Iterator[int]:
    """``seeds``, with a line on stderr every ``every_s`` seconds of wall clock (checked between seeds)."""
    started = time.monotonic()
    next_at = started + every_s
    done = 0
    for seed in seeds:
        now = time.monotonic()
        if now >= next_at:
            next_at = now + every_s
            of = f" of {budget_s:g} s" if budget_s is not None else ""
            who = f" (job 1 of {jobs}; the others run alongside)" if jobs > 1 else ""
            print(f"stockade sim: {now - started:.0f} s{of}, {done:,} seeds done{who}, up to seed {seed}",
                  file=sys.stderr, flush=True)
        yield seed
        done += 1


def _worker(payload: tuple[int, int | None, float | None, int, int, str | None, bool, bool, float]) -> Campaign:
    first, count, seconds, job, jobs, mutant, keep_going, linearizability, progress_s = payload
    seeds = _seeds(first, count, job, jobs)
    if progress_s > 0 and job == 0:  # one job speaks for the campaign: one line per interval, not one per job
        seeds = _with_progress(seeds, progress_s, seconds, job, jobs)
    return run_campaign(seeds, mutant=mutant, seconds=seconds,
                        stop_at_first=not keep_going, linearizability=linearizability)


def _campaign(first: int, count: int | None, seconds: float | None, args: argparse.Namespace) -> Campaign:
    jobs = args.jobs
    payloads = [(first, count, seconds, job, jobs, args.mutant, args.keep_going, not args.no_linearizability,
                 args.progress_s) for job in range(jobs)]
    started = time.monotonic()
    if jobs == 1:
        parts = [_worker(payloads[0])]
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            parts = list(pool.map(_worker, payloads))
    total = Campaign()
    for part in parts:
        total.examples += part.examples
        total.steps += part.steps
        total.simulated_ns += part.simulated_ns
        total.lease_ns += part.lease_ns
        total.operations += part.operations
        total.undecided += part.undecided
        total.failures += part.failures
    total.failures.sort(key=lambda r: r.seed)
    total.elapsed_s = time.monotonic() - started
    return total


def _report(campaign: Campaign, first: int, args: argparse.Namespace) -> None:
    wall = max(campaign.elapsed_s, 1e-9)
    summary = {
        "first_seed": first,
        "mutant": args.mutant,
        "examples": campaign.examples,
        "steps": campaign.steps,
        "operations": campaign.operations,
        "simulated_lease_hours": round(campaign.lease_hours, 6),
        "violations": campaign.violations,
        "failing_seeds": [r.seed for r in campaign.failures],
        "undecided_scopes": campaign.undecided,
        "wall_s": round(campaign.elapsed_s, 3),
        "jobs": args.jobs,
        "seeds_per_s": round(campaign.examples / wall, 2),
        "steps_per_s": round(campaign.steps / wall),
        "lease_hours_per_s": round(campaign.lease_hours / wall, 6),
    }
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"stockade sim: seeds from {first}" + (f", mutant {args.mutant}" if args.mutant else ""))
        print(f"examples {campaign.examples}, steps {campaign.steps:,}, simulated lease-hours "
              f"{campaign.lease_hours:.3f}, operations {campaign.operations:,}, violations {campaign.violations}"
              + (f", undecided scopes {campaign.undecided}" if campaign.undecided else ""))
        print(f"rate: {summary['seeds_per_s']} seeds/s, {summary['steps_per_s']:,} steps/s, "
              f"{summary['lease_hours_per_s']} lease-hours/s ({campaign.elapsed_s:.1f} s wall, {args.jobs} jobs)")
    if campaign.failures:
        failure = campaign.failures[0]
        if args.mutant:
            print(f"mutant {args.mutant} caught at seed {failure.seed} (seed #{failure.seed - first + 1} of the run)",
                  file=sys.stderr if args.json else sys.stdout)
        _print_failure(failure, args.save, stream=sys.stderr if args.json else sys.stdout)


def _print_failure(result: RunResult, save: Path | None, stream: Any = None) -> None:
    out = stream or sys.stdout
    print(f"\nVIOLATION at seed {result.seed}: {len(result.violations)} violation(s) in the "
          f"{_WORLDS[result.world]} world", file=out)
    print(f"replay: {replay_command(result.seed, result.mutant)}", file=out)
    print(narrate(result), file=out)
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        with open(save / "history.jsonl", "w") as f:
            dump_jsonl(result.history, f)
        with open(save / "audit.jsonl", "w") as f:
            rows = ({"scope": s, "token": t, "idempotency_key": k, "commit_seq": q} for s, t, k, q in result.audit)
            dump_jsonl(rows, f)
        print(f"history and audit trail saved in {save}{os.sep}", file=out)
