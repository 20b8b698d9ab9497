"""Tables and plots from the reproduction's runs (experiments/repro/run.py).

    .venv/bin/python -m experiments.repro.analyze [--runs runs/repro] [--plots docs/img] > tables.md

Prints markdown tables (mean ± standard error over seeds) and writes PNG plots. Every number is
read from the runs' metrics.jsonl and eval-*.json files; nothing is typed in by hand.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from experiments.repro import records, runon
from experiments.repro.batches import BATCHES, SwarmBatch
from experiments.repro.run import EVAL_SETS, completed
from ftis_edge.metrics.records import round_records
from ftis_edge.metrics.stats import mean_se

ROOT = Path(__file__).resolve().parents[2]

SWEEP = [("f-tis-g0.05", 0.05), ("f-tis-g1", 1), ("f-tis", 5), ("f-tis-g200", 200)]
PREFIX = "repro"  # plot file names: PREFIX-BATCH-reward.png, PREFIX-eval.png
LAST = 3          # "final reward" = mean reward/own over the last LAST rounds


# --- loading -----------------------------------------------------------------------------------

def load_run(run_dir: Path) -> dict | None:
    """One receiver's rounds and evals, or None when it did not finish. A node that ran on past R
    until its arm's slowest node stopped (H7, runon.py) counts its rounds 1..R, the ones its
    round-R weights were trained in."""
    recs = records.metrics(run_dir)          # plain or gzip-compressed (publish.py --gzip)
    rounds = runon.rounds_to_score(round_records(recs), run_dir)
    if not rounds or not (completed(recs) or runon.scored_round(run_dir) is not None):
        return None
    evals = {}
    for which in EVAL_SETS:
        e = records.eval_of(run_dir, which)
        if e is not None:
            evals[which] = e
    machines = [r["machine"] for r in recs if r.get("type") == "start" and r.get("machine")]
    stops = [r["time"] for r in recs if r.get("type") == "stop" and isinstance(r.get("time"), (int, float))]
    return {"rounds": rounds, "evals": evals, "machines": machines, "stopped": stops[-1] if stops else None}


def load_all(runs: Path) -> dict:
    """{batch: {receiver: {seed: run}}}"""
    out: dict = {}
    for batch in BATCHES:
        for seed_dir in sorted((runs / batch).glob("s*")):
            seed = int(seed_dir.name[1:])
            for rd in sorted(p for p in seed_dir.iterdir() if p.is_dir() and p.name != "peer"):
                run = load_run(rd)
                if run is not None:
                    out.setdefault(batch, {}).setdefault(rd.name, {})[seed] = run
    return out


def machine_lines(data: dict) -> list[str]:
    """One line per batch and seed whose runs (or one run's resumes) ran on more than one machine or
    boot: their CPU-seconds (and, across machines, their floats) do not compare. Runs from before the
    start record named its machine say nothing."""
    lines = []
    for batch, receivers in data.items():
        for seed in sorted({s for seeds in receivers.values() for s in seeds}):
            where: dict[tuple, list[str]] = {}
            for name, seeds in sorted(receivers.items()):
                for m in seeds.get(seed, {}).get("machines", []):
                    runs = where.setdefault((m.get("cpu"), m.get("cores"), m.get("boot_id")), [])
                    if name not in runs:
                        runs.append(name)
            if len(where) > 1:
                parts = [f"{cpu}, {cores} cores, boot {str(boot)[:8]}: {', '.join(names)}"
                         for (cpu, cores, boot), names in where.items()]
                lines.append(f"* **{batch} s{seed} ran on {len(where)} machines or boots** (compare CPU-seconds "
                             f"only within one): " + "; ".join(parts))
    return lines


def base_accuracy(runs: Path, data: dict) -> dict:
    """The untrained model's eval accuracy on the same prompts the receivers were scored on
    (the first n of the deterministic eval list, n taken from the receivers' evals)."""
    n_of = {w: {r["evals"][w]["n"] for recv in data.values() for seeds in recv.values()
                for r in seeds.values() if w in r["evals"]} for w in EVAL_SETS}
    base = {}
    for which in EVAL_SETS:
        e = records.eval_of(runs / "base", which)
        if e is None:
            continue
        items = e["items"]
        n = min(n_of[which]) if n_of[which] else len(items)
        acc = statistics.fmean(it["reward"] >= 1.0 for it in items[:n])
        base[which], base[f"{which}_value"] = f"{acc:.3f} (n = {n})", acc
    return base


# --- statistics ----------------------------------------------------------------------------------

def fmt(m: float, se: float, p: int = 3) -> str:
    if math.isnan(m):
        return "–"
    return f"{m:.{p}f}" if math.isnan(se) else f"{m:.{p}f} ± {se:.{p}f}"


def series(run: dict, key: str) -> list[float | None]:
    return [r.get(key) for r in run["rounds"]]


def final_reward(run: dict) -> float:
    vals = [v for v in series(run, "reward/own")[-LAST:] if v is not None]
    return statistics.fmean(vals) if vals else float("nan")


def peer_mean(run: dict, key: str) -> float | None:
    """Mean over rounds of a round metric, counting only rounds that trained on peer samples."""
    vals = [r.get(key) for r in run["rounds"] if (r.get("peers/samples_used") or 0) > 0 and r.get(key) is not None]
    return statistics.fmean(vals) if vals else None


def peer_stats(run: dict) -> dict:
    """Cumulative per-peer stats from the last round (filter rate over peer samples only): the
    peer named "peer", or in a swarm every peer's, weighted by the samples each contributed."""
    peers = run["rounds"][-1].get("peers") or {}
    if "peer" in peers or not peers:
        return peers.get("peer") or {}
    used = {name: p.get("samples_used") or 0 for name, p in peers.items()}
    total = sum(used.values())
    if not total:
        return {}
    out = {}
    for key in ("filter_rate", "is_weight_mean", "kl_mean"):
        vals = [(p.get(key), used[name]) for name, p in peers.items() if p.get(key) is not None]
        if vals:
            out[key] = sum(v * w for v, w in vals) / max(sum(w for _, w in vals), 1)
    return out


def total(runs, key: str) -> float:
    """``key`` summed over the runs' rounds (a missing value counts 0)."""
    return sum(v or 0 for run in runs for v in series(run, key))


def cumulative_reward(runs) -> float:
    """SAPO's metric: reward/own summed over the runs' rounds."""
    return total(runs, "reward/own")


def running_mean_final(run: dict) -> float:
    vals = [v or 0.0 for v in series(run, "reward/own")]
    return statistics.fmean(vals) if vals else float("nan")


def tokens_to_reach(run: dict, target: float, cost: str = "gen/tokens") -> float | None:
    """Own generated tokens (or another per-round ``cost``: "cpu/round_s") until the running
    mean of reward/own first reaches ``target`` (from round LAST on: round 1 is the same for
    every receiver of a seed); None if never."""
    rewards = [v if v is not None else 0.0 for v in series(run, "reward/own")]
    tokens = [t or 0 for t in series(run, cost)]
    total = 0
    for i, t in enumerate(tokens):
        total += t
        if i + 1 >= LAST and statistics.fmean(rewards[: i + 1]) >= target - 1e-12:
            return total
    return None


# --- tables ----------------------------------------------------------------------------------------

def table_outcomes(data: dict, base: dict) -> list[str]:
    lines = ["| batch | receiver | seeds | reward/own rounds 1–3 | reward/own last 3 | eval ID (L1–2) | eval OOD (L3) "
             "| peer samples / round | peer filter rate | peer IS w | peer KL |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    if base:
        lines.append(f"| – | base model (untrained) | – | – | – | {base.get('id', '–')} | {base.get('ood', '–')} "
                     "| – | – | – | – |")
    for batch, recv in data.items():
        for name, seeds in recv.items():
            runs = list(seeds.values())
            first = mean_se([statistics.fmean([v or 0.0 for v in series(r, "reward/own")[:LAST]]) for r in runs])
            last = mean_se([final_reward(r) for r in runs])
            ev = {w: mean_se([r["evals"][w]["accuracy"] for r in runs if w in r["evals"]]) for w in ("id", "ood")}
            used = mean_se([statistics.fmean([r2.get("peers/samples_used") or 0 for r2 in r["rounds"]]) for r in runs])
            ps = [peer_stats(r) for r in runs]
            filt = mean_se([p.get("filter_rate") for p in ps if p.get("filter_rate") is not None])
            isw = mean_se([p.get("is_weight_mean") for p in ps if p.get("is_weight_mean") is not None])
            kl = mean_se([p.get("kl_mean") for p in ps if p.get("kl_mean") is not None])
            lines.append(f"| {batch} | {name} | {len(runs)} | {fmt(*first)} | {fmt(*last)} | {fmt(*ev['id'])} | "
                         f"{fmt(*ev['ood'])} | {fmt(*used, 1)} | {fmt(*filt)} | {fmt(*isw)} | {fmt(*kl, 4)} |")
    return lines


def table_paired(data: dict) -> list[str]:
    """Each collaborative receiver minus the isolated receiver of the same seed (paired)."""
    lines = ["| batch | receiver − reference | seeds | Δ reward/own last 3 | Δ eval ID | Δ eval OOD |",
             "|---|---|---|---|---|---|"]
    isolated = data.get("methods", {}).get("alone", {})
    for batch, recv in ((b, r) for b, r in data.items() if not getattr(BATCHES[b], "settings", None)):
        # Every receiver of seed s shares prompts, sampling seeds and LoRA init with the isolated
        # receiver of seed s (methods batch), so that is the reference everywhere.
        for name, seeds in recv.items():
            if batch == "methods" and name == "alone":
                continue
            common = sorted(set(seeds) & set(isolated))
            if not common:
                continue
            d_r = mean_se([final_reward(seeds[s]) - final_reward(isolated[s]) for s in common])
            d_e = {w: mean_se([seeds[s]["evals"][w]["accuracy"] - isolated[s]["evals"][w]["accuracy"]
                               for s in common if w in seeds[s]["evals"] and w in isolated[s]["evals"]])
                   for w in ("id", "ood")}
            lines.append(f"| {batch} | {name} − alone | {len(common)} | {fmt(*d_r)} | {fmt(*d_e['id'])} | "
                         f"{fmt(*d_e['ood'])} |")
    return lines


def table_efficiency(data: dict) -> list[str]:
    recv = data.get("methods", {})
    if "alone" not in recv:
        return ["(no isolated runs yet)"]
    lines = ["| receiver | seeds | reached the isolated run's final running-mean reward | own tokens to reach it | "
             "isolated run's own tokens (all rounds) | ratio |", "|---|---|---|---|---|---|"]
    for name, seeds in recv.items():
        reached, ratios, toks, alone_toks = 0, [], [], []
        for s, run in seeds.items():
            if s not in recv["alone"]:
                continue
            target = running_mean_final(recv["alone"][s])
            t = tokens_to_reach(run, target)
            alone_total = total([recv["alone"][s]], "gen/tokens")
            alone_toks.append(alone_total)
            if t is not None:
                reached += 1
                toks.append(t)
                ratios.append(t / alone_total)
        n = sum(1 for s in seeds if s in recv["alone"])
        lines.append(f"| {name} | {n} | {reached}/{n} | {fmt(*mean_se(toks), 0)} | {fmt(*mean_se(alone_toks), 0)} | "
                     f"{fmt(*mean_se(ratios), 2)} |")
    return lines


def table_sweep(data: dict) -> list[str]:
    names = SWEEP
    recv = {**data.get("sweep", {}), "f-tis": data.get("methods", {}).get("f-tis", {})}
    lines = ["| g | seed | peer samples dropped | Â ≤ 0 (all samples) | KL > g (all samples) | "
             "dropped (all samples) | peer KL mean | reward/own last 3 | eval ID | eval OOD |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, g in names:
        run = recv.get(name, {}).get(0)
        if run is None:
            continue
        p = peer_stats(run)
        lines.append(
            f"| {g} | 0 | {fmt(p.get('filter_rate') or 0.0, float('nan'))} | "
            f"{fmt(peer_mean(run, 'filter/adv_le0_frac') or 0.0, float('nan'))} | "
            f"{fmt(peer_mean(run, 'filter/kl_gt_g_frac') or 0.0, float('nan'))} | "
            f"{fmt(peer_mean(run, 'filter/dropped_frac') or 0.0, float('nan'))} | "
            f"{fmt(p.get('kl_mean') or 0.0, float('nan'), 4)} | {fmt(final_reward(run), float('nan'))} | "
            f"{fmt(run['evals'].get('id', {}).get('accuracy', float('nan')), float('nan'))} | "
            f"{fmt(run['evals'].get('ood', {}).get('accuracy', float('nan')), float('nan'))} |")
    return lines


def value_pairs(batch_name: str, recv: dict) -> list[tuple[str, str]]:
    """(collaborative run, its isolated reference) pairs within one issue-18/28 batch."""
    if isinstance(BATCHES[batch_name], SwarmBatch):
        return [(n, "alone-" + n.rsplit("-", 1)[1]) for n in recv if not n.startswith("alone-")]
    return [(n, "alone") for n in recv if n != "alone"]


def table_value(data: dict) -> list[str]:
    """Issue 18: each collaborative run minus its isolated twin (same batch, same seed; in a swarm
    batch node i vs node i alone), and own tokens to reach the twin's final running-mean reward."""
    lines = ["| batch | run − isolated twin | pairs | Δ running-mean reward (all rounds) | Δ reward/own last 3 | "
             "Δ eval ID | Δ eval OOD | reached | speed-up in own tokens (isolated ÷ collaborative) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for batch in (b for b in data if getattr(BATCHES[b], "settings", None) and b not in FILL_BATCHES):
        recv = data[batch]
        by_kind: dict[str, list[tuple[dict, dict]]] = {}
        for run_name, ref_name in value_pairs(batch, recv):
            kind = run_name.split("-")[0] if isinstance(BATCHES[batch], SwarmBatch) else run_name
            for s, run in recv[run_name].items():
                if s in recv.get(ref_name, {}):
                    by_kind.setdefault(kind, []).append((run, recv[ref_name][s]))
        for kind, pairs in by_kind.items():
            d_rm = mean_se([running_mean_final(a) - running_mean_final(b) for a, b in pairs])
            d_r = mean_se([final_reward(a) - final_reward(b) for a, b in pairs])
            d_e = {w: mean_se([a["evals"][w]["accuracy"] - b["evals"][w]["accuracy"] for a, b in pairs
                               if w in a["evals"] and w in b["evals"]]) for w in ("id", "ood")}
            speed, reached = [], 0
            for a, b in pairs:
                target = running_mean_final(b)
                t_a, t_b = tokens_to_reach(a, target), tokens_to_reach(b, target)
                if t_a is not None and t_b:
                    reached += 1
                    speed.append(t_b / t_a)
            lines.append(f"| {batch} | {kind} − alone | {len(pairs)} | {fmt(*d_rm)} | {fmt(*d_r)} | "
                         f"{fmt(*d_e['id'])} | {fmt(*d_e['ood'])} | {reached}/{len(pairs)} | {fmt(*mean_se(speed), 2)}"
                         f"{' (' + ', '.join(f'{x:.2f}' for x in speed) + ')' if len(speed) > 1 else ''} |")
    return lines


FILL_BATCHES = ("fill4", "fill-hetero")      # issue 28 (H4, H5): table_fill


def _speedup(pairs, cost: str) -> tuple[list[float], int]:
    """Per pair: the isolated twin's cost to reach its own final running-mean reward ÷ the
    collaborative run's cost to reach the same value; and how many pairs reached it."""
    out = []
    for a, b in pairs:
        target = running_mean_final(b)
        c_a, c_b = tokens_to_reach(a, target, cost), tokens_to_reach(b, target, cost)
        if c_a and c_b:
            out.append(c_b / c_a)
    return out, len(out)


def _mean_key(run: dict, key: str) -> float:
    vals = [v for v in series(run, key) if isinstance(v, (int, float))]
    return statistics.fmean(vals) if vals else float("nan")


def _list(xs: list[float]) -> str:
    return " (" + ", ".join(f"{x:.2f}" for x in xs) + ")" if len(xs) > 1 else ""


def table_fill(data: dict) -> list[str]:
    """Issue 28 (docs/results.md, H4 and H5): each batch-fill node minus its isolated twin (same
    node id and seed), the speed-ups in own tokens and own CPU-seconds to reach the twin's final
    running-mean reward, SAPO's metric (cumulative reward over all nodes and rounds, as a ratio
    to the isolated nodes'), and arm against arm node by node (own1 − own2, f-tis − nois)."""
    lines = ["| batch | arm − alone | pairs | Δ running-mean reward | Δ eval ID | Δ eval OOD | reached | "
             "speed-up own tokens | speed-up own CPU-s | own groups / round | topped up / round | "
             "cumulative reward (SAPO) arm ÷ alone |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for batch in (b for b in FILL_BATCHES if b in data):
        recv = data[batch]
        by_arm: dict[str, list[tuple[dict, dict]]] = {}
        for run_name, ref_name in value_pairs(batch, recv):
            for s, run in recv[run_name].items():
                if s in recv.get(ref_name, {}):
                    by_arm.setdefault(run_name.rsplit("-", 1)[0], []).append((run, recv[ref_name][s]))
        for arm, pairs in by_arm.items():
            d_rm = mean_se([running_mean_final(a) - running_mean_final(b) for a, b in pairs])
            d_e = {w: mean_se([a["evals"][w]["accuracy"] - b["evals"][w]["accuracy"] for a, b in pairs
                               if w in a["evals"] and w in b["evals"]]) for w in ("id", "ood")}
            tok, reached = _speedup(pairs, "gen/tokens")
            cpu, _ = _speedup(pairs, "cpu/round_s")
            cum_a, cum_b = cumulative_reward(a for a, _ in pairs), cumulative_reward(b for _, b in pairs)
            lines.append(
                f"| {batch} | {arm} − alone | {len(pairs)} | {fmt(*d_rm)} | {fmt(*d_e['id'])} | {fmt(*d_e['ood'])} | "
                f"{reached}/{len(pairs)} | {fmt(*mean_se(tok), 2)}{_list(tok)} | {fmt(*mean_se(cpu), 2)}{_list(cpu)} | "
                f"{fmt(*mean_se([_mean_key(a, 'groups/own') for a, _ in pairs]), 2)} | "
                f"{fmt(*mean_se([_mean_key(a, 'groups/topped_up') for a, _ in pairs]), 2)} | "
                f"{cum_a / cum_b if cum_b else float('nan'):.2f} ({cum_a:.1f} / {cum_b:.1f}) |")
    for batch, arm_a, arm_b, kinds in ARM_VS_ARM:
        lines += table_arm_vs_arm(data, batch, arm_a, arm_b, kinds)
    return lines


HETERO_KIND = ("SmolLM2 LoRA", "SmolLM2 LoRA", "SmolLM2 full FT, HF, T = 0.7", "Gemma 3 LoRA (span)")
ARM_VS_ARM = (("fill4", "own1", "own2", ()),                  # H4: own1 − own2, as pre-registered
              ("fill-hetero", "ftis", "nois", HETERO_KIND))   # H5(b)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "–"


def table_arm_vs_arm(data: dict, batch: str, arm_a: str, arm_b: str, kinds=()) -> list[str]:
    """Node i of ``arm_a`` minus node i of ``arm_b`` (same node id and seed: the same prompts and
    own sampling seeds), per node and pooled, with what each arm paid in own tokens and own
    CPU-seconds over the run; paired by name, so it needs no isolated twin."""
    recv = data.get(batch, {})
    rows = []
    for name in sorted(n for n in recv if n.startswith(f"{arm_a}-")):
        i = name.rsplit("-", 1)[1]
        for s, a in recv[name].items():
            b = recv.get(f"{arm_b}-{i}", {}).get(s)
            if b is not None:
                rows.append((int(i), s, a, b))
    if not rows:
        return []

    def d_eval(a: dict, b: dict, w: str) -> float | None:
        return a["evals"][w]["accuracy"] - b["evals"][w]["accuracy"] if w in a["evals"] and w in b["evals"] else None

    def costs(a_runs, b_runs) -> str:
        return " | ".join(_ratio(total(a_runs, k), total(b_runs, k)) for k in ("gen/tokens", "cpu/round_s"))

    lines = ["", f"| {batch} | node | seed | running-mean reward {arm_a} | {arm_b} | Δ ({arm_a} − {arm_b}) | "
             f"Δ eval ID | Δ eval OOD | cumulative reward {arm_a} ÷ {arm_b} | own tokens {arm_a} ÷ {arm_b} | "
             f"own CPU-s {arm_a} ÷ {arm_b} |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, s, a, b in rows:
        de = {w: d_eval(a, b, w) for w in ("id", "ood")}
        kind = f": {kinds[i]}" if i < len(kinds) else ""
        lines.append(f"| {batch} | {i}{kind} | {s} | "
                     f"{running_mean_final(a):.3f} | {running_mean_final(b):.3f} | "
                     f"{running_mean_final(a) - running_mean_final(b):+.3f} | "
                     + " | ".join("–" if de[w] is None else f"{de[w]:+.3f}" for w in ("id", "ood"))
                     + f" | {_ratio(cumulative_reward([a]), cumulative_reward([b]))} | {costs([a], [b])} |")
    diffs = [running_mean_final(a) - running_mean_final(b) for _, _, a, b in rows]
    de = {w: mean_se([d_eval(a, b, w) for _, _, a, b in rows]) for w in ("id", "ood")}
    a_runs, b_runs = [a for _, _, a, _ in rows], [b for _, _, _, b in rows]
    lines.append(f"| {batch} | pooled | | | | **{fmt(*mean_se(diffs))}** ({len(diffs)} pairs) | "
                 f"{fmt(*de['id'])} | {fmt(*de['ood'])} | "
                 f"{_ratio(cumulative_reward(a_runs), cumulative_reward(b_runs))} | {costs(a_runs, b_runs)} |")
    return lines


# --- plots ----------------------------------------------------------------------------------------

def _cummean(xs: list[float]) -> list[float]:
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x
        out.append(total / (i + 1))
    return out


def plot_rewards(data: dict, out: Path) -> list[Path]:
    """Per batch: reward/own per round (left) and its running mean (right), mean ± SE over seeds.
    Receivers of one seed see the same prompts each round, so the swings on the left are
    mostly prompt difficulty shared by all curves; the running mean shows the trend."""
    from ftis_edge.common.install_hint import require      # the bench extra: say how to install it
    matplotlib = require("matplotlib", "the plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for batch, recv in data.items():
        fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
        for name, seeds in recv.items():
            runs = list(seeds.values())
            n = min(len(r["rounds"]) for r in runs)
            xs = list(range(1, n + 1))
            per_run = [[v or 0.0 for v in series(r, "reward/own")[:n]] for r in runs]
            for ax, curves in ((axes[0], per_run), (axes[1], [_cummean(c) for c in per_run])):
                ms = [mean_se([c[i] for c in curves]) for i in range(n)]
                m = [a for a, _ in ms]
                se = [0.0 if math.isnan(b) else b for _, b in ms]
                ax.plot(xs, m, marker="o", ms=3, label=f"{name} ({len(runs)} seeds)")
                ax.fill_between(xs, [a - b for a, b in zip(m, se)], [a + b for a, b in zip(m, se)], alpha=0.12)
        axes[0].set_ylabel("reward/own (mean ± SE over seeds)")
        axes[1].set_ylabel("running mean of reward/own")
        for ax in axes:
            ax.set_xlabel("round")
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=7)
        fig.suptitle(f"{batch}: {BATCHES[batch].about}", fontsize=7, wrap=True)
        fig.tight_layout()
        path = out / f"{PREFIX}-{batch}-reward.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_evals(data: dict, base: dict, out: Path) -> Path:
    from ftis_edge.common.install_hint import require      # the bench extra: say how to install it
    matplotlib = require("matplotlib", "the plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, ids, oods, id_se, ood_se = [], [], [], [], []
    for batch, recv in data.items():
        if batch == "sweep":
            continue
        for name, seeds in recv.items():
            runs = list(seeds.values())
            a, b = mean_se([r["evals"]["id"]["accuracy"] for r in runs if "id" in r["evals"]])
            c, d = mean_se([r["evals"]["ood"]["accuracy"] for r in runs if "ood" in r["evals"]])
            labels.append(f"{batch}\n{name}")
            ids.append(a)
            oods.append(c)
            id_se.append(0 if math.isnan(b) else b)
            ood_se.append(0 if math.isnan(d) else d)
    fig, ax = plt.subplots(figsize=(max(6.4, 0.7 * len(labels)), 3.8))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], ids, 0.4, yerr=id_se, label="in-distribution (arith L1–2)", capsize=2)
    ax.bar([x + 0.2 for x in xs], oods, 0.4, yerr=ood_se, label="held-out harder (arith L3)", capsize=2)
    if base:
        ax.axhline(base.get("id_value", 0), color="C0", ls="--", lw=1, label="base model, ID")
        ax.axhline(base.get("ood_value", 0), color="C1", ls="--", lw=1, label="base model, OOD")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=6)
    ax.set_ylabel("greedy accuracy (mean ± SE over seeds)")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / f"{PREFIX}-eval.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(data: dict, out: Path) -> Path | None:
    from ftis_edge.common.install_hint import require      # the bench extra: say how to install it
    matplotlib = require("matplotlib", "the plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recv = {**data.get("sweep", {}), "f-tis": data.get("methods", {}).get("f-tis", {})}
    pts = [(g, recv[n][0]) for n, g in SWEEP if 0 in recv.get(n, {})]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    gs = [g for g, _ in pts]
    ax.plot(gs, [peer_stats(r).get("filter_rate") or 0.0 for _, r in pts], marker="o", label="peer samples dropped")
    ax.plot(gs, [peer_mean(r, "filter/kl_gt_g_frac") or 0.0 for _, r in pts], marker="s",
            label="samples with KL > g (all)")
    ax.set_xscale("log")
    ax.set_xlabel("KL threshold g")
    ax.set_ylabel("fraction")
    ax.set_title("F-TIS filter rate vs threshold (methods batch, seed 0)", fontsize=8)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / f"{PREFIX}-kl-sweep.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "repro")
    ap.add_argument("--plots", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--prefix", default="repro", help="plot file names start with this (value runs: value)")
    args = ap.parse_args()
    global PREFIX
    PREFIX = args.prefix
    data = load_all(args.runs)
    base = base_accuracy(args.runs, data)
    confounds = machine_lines(data)
    if confounds:
        print("### Machines\n\n" + "\n".join(confounds) + "\n")
    print("### Outcomes (mean ± SE over seeds)\n")
    print("\n".join(table_outcomes(data, base)))
    print("\n### Paired differences to the isolated node (same seed: same prompts, sampling seeds, LoRA init)\n")
    print("\n".join(table_paired(data)))
    print("\n### Sample efficiency (methods batch)\n")
    print("\n".join(table_efficiency(data)))
    print("\n### KL-threshold sweep (f-tis, the methods peer, seed 0)\n")
    print("\n".join(table_sweep(data)))
    print("\n### Does joining help? (issue 18 batches: paired with the isolated twin)\n")
    print("\n".join(table_value(data)))
    print("\n### Joining a swarm saves your compute (issue 28 batches: batch fill, paired with the isolated twin)\n")
    print("\n".join(table_fill(data)))
    args.plots.mkdir(parents=True, exist_ok=True)
    written = plot_rewards(data, args.plots) + [plot_evals(data, base, args.plots)]
    sweep = plot_sweep(data, args.plots)
    if sweep:
        written.append(sweep)
    print("\nplots: " + ", ".join(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
