"""Figures, targets and output of `pzq bench`: percentiles, medians over runs, the table, JSON, the plot."""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Sequence

# name -> (figure key, comparison, target, unit): the targets of the performance issue, for 100-byte
# bodies with durable (fsync'd) acks on a 2-core machine.
TARGETS = {
    "producer_w100.msg_s": (">=", 150_000),
    "e2e.msg_s": (">=", 75_000),
    "producer_w1.ack_p50_ms": ("<=", 0.25),
    "producer_w1.ack_p99_ms": ("<=", 0.5),
    "e2e_paced.lat_p50_ms": ("<=", 0.7),
    "e2e_paced.lat_p99_ms": ("<=", 1.3),
    "restart_s": ("<=", 1.0),
    "server_rss_mb": ("<=", 150),
    # issue 27: batched clients (PZQ-BATCH/1), the same messages in flight
    "producer_batched.server_cpu_us": ("<=", 5),
    "e2e_batched.server_cpu_us": ("<=", 12),
}


def percentile(sorted_values: Sequence[int], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, nearest rank; 0 for no values."""
    if not sorted_values:
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return float(sorted_values[rank])


def latency_ms(latencies_ns: list[int], prefix: str) -> dict[str, float]:
    values = sorted(latencies_ns)
    return {
        f"{prefix}_p50_ms": round(percentile(values, 50) / 1e6, 3),
        f"{prefix}_p99_ms": round(percentile(values, 99) / 1e6, 3),
        f"{prefix}_p999_ms": round(percentile(values, 99.9) / 1e6, 3),
        f"{prefix}_max_ms": round(values[-1] / 1e6, 3) if values else 0.0,
    }


def flatten(run: dict, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in run.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def medians(runs: list[dict]) -> dict[str, float]:
    """The median of every numeric figure over the runs (figures missing from a run are skipped)."""
    flat = [flatten(r) for r in runs]
    keys = sorted({k for f in flat for k in f})
    return {k: round(statistics.median(f[k] for f in flat if k in f), 3) for k in keys}


_END_TO_END = ("e2e.", "e2e_paced.", "e2e_batched.")  # pzq's phases that count lost and duplicated messages


def lost_or_duplicated(result: dict) -> list[str]:
    """The figures of any run that say a message was lost or duplicated: pzq's end-to-end counts, and
    the other protocols' ``distinct`` (or ``finished``) that must equal their count, ``left`` that must be 0."""
    problems = []
    for number, run in enumerate(result["runs"], 1):
        figures = flatten(run)
        for key, value in figures.items():
            prefix, _, name = key.rpartition(".")
            prefix += "." if prefix else ""
            wrong = (
                (key.startswith(_END_TO_END) and name in ("lost", "duplicated") and value != 0)
                or (name == "left" and value != 0)
                or (name == "distinct" and value != figures.get(prefix + "messages"))
                or (name == "finished" and value != figures.get(prefix + "jobs"))
            )
            if wrong:
                problems.append(f"run {number}: {key} {value:g}")
    return problems


def machine() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


ROWS = [
    ("producer, window 1 (msg/s)", "producer_w1.msg_s", "ceiling_w1.msg_s"),
    ("  ack latency p50 (ms)", "producer_w1.ack_p50_ms", "ceiling_w1.ack_p50_ms"),
    ("  ack latency p99 (ms)", "producer_w1.ack_p99_ms", "ceiling_w1.ack_p99_ms"),
    ("  ack latency p99.9 (ms)", "producer_w1.ack_p999_ms", "ceiling_w1.ack_p999_ms"),
    ("producer, window W (msg/s)", "producer_w100.msg_s", "ceiling_w100.msg_s"),
    ("  ack latency p50 (ms)", "producer_w100.ack_p50_ms", "ceiling_w100.ack_p50_ms"),
    ("  ack latency p99 (ms)", "producer_w100.ack_p99_ms", "ceiling_w100.ack_p99_ms"),
    ("send, written, no receipt (msg/s)", "send.msg_s", None),
    ("send, until all stored (msg/s)", "send_then_consume.send_msg_s", None),
    ("consume + ack, until 0 (msg/s)", "send_then_consume.consume_msg_s", None),
    ("send -> consume -> ack (msg/s)", "send_then_consume.msg_s", None),
    ("consumer, draining (msg/s)", "consumer.msg_s", None),
    ("end to end (msg/s)", "e2e.msg_s", "ceiling_e2e.msg_s"),
    ("  latency p50 (ms)", "e2e.lat_p50_ms", "ceiling_e2e.lat_p50_ms"),
    ("  latency p99 (ms)", "e2e.lat_p99_ms", "ceiling_e2e.lat_p99_ms"),
    ("  lost / duplicated", "e2e.lost", None),
    ("end to end paced (msg/s)", "e2e_paced.msg_s", None),
    ("  latency p50 (ms)", "e2e_paced.lat_p50_ms", "ceiling_paced.lat_p50_ms"),
    ("  latency p99 (ms)", "e2e_paced.lat_p99_ms", "ceiling_paced.lat_p99_ms"),
    ("  lost / duplicated", "e2e_paced.lost", None),
    ("batched producer, W (msg/s)", "producer_batched.msg_s", None),
    ("  ack latency p50 (ms)", "producer_batched.ack_p50_ms", None),
    ("  ack latency p99 (ms)", "producer_batched.ack_p99_ms", None),
    ("batched draining (msg/s)", "consumer_batched.msg_s", None),
    ("batched end to end (msg/s)", "e2e_batched.msg_s", None),
    ("  latency p50 (ms)", "e2e_batched.lat_p50_ms", None),
    ("  latency p99 (ms)", "e2e_batched.lat_p99_ms", None),
    ("  lost / duplicated", "e2e_batched.lost", None),
    ("server CPU µs/msg, window 1", "producer_w1.server_cpu_us", None),
    ("server CPU µs/msg, window W", "producer_w100.server_cpu_us", None),
    ("server CPU µs/msg, draining", "consumer.server_cpu_us", None),
    ("server CPU µs/msg, end to end", "e2e.server_cpu_us", None),
    ("server CPU µs/msg, paced", "e2e_paced.server_cpu_us", None),
    ("server CPU µs/msg, batched W", "producer_batched.server_cpu_us", None),
    ("server CPU µs/msg, batched drain", "consumer_batched.server_cpu_us", None),
    ("server CPU µs/msg, batched e2e", "e2e_batched.server_cpu_us", None),
    ("server CPU, window W (%)", "producer_w100.server_cpu_pct", None),
    ("server CPU, end to end (%)", "e2e.server_cpu_pct", None),
    ("server commits, window W", "producer_w100.commits", None),
    ("restart (s)", "restart_s", None),
    ("server RSS (MB)", "server_rss_mb", None),
]


def table(result: dict) -> str:
    """A plain-text table of the medians: pzq, the no-storage ceiling, pzq as % of it, the target."""
    med, window = result["median"], result["options"]["window"]
    lines = [
        f"pzq bench ({result['options'].get('protocol', 'native')}): {result['options']['runs']} run(s), "
        f"medians; {result['options']['size']}-byte bodies, "
        f"window W={window}, {result['options']['producers']} producer(s), "
        f"{result['options']['consumers']} consumer(s), hard sync {result['options']['hard_sync']}"
        + _clients(result["options"]),
        f"machine: {result['machine']['cpu']} x{result['machine']['cores']}, Python {result['machine']['python']}",
        "",
        f"{'figure':<30}{'pzq':>12}{'ceiling':>12}{'of ceiling':>12}{'target':>12}  met",
    ]
    for label, key, ceiling_key in ROWS:
        if key not in med:
            continue
        value = med[key]
        shown = _fmt(value)
        if key.endswith(".lost"):
            shown = f"{_fmt(value)}/{_fmt(med.get(key[:-4] + 'duplicated', 0))}"
        ceiling = med.get(ceiling_key) if ceiling_key else None
        ratio = f"{100 * value / ceiling:.0f}%" if ceiling and key.endswith("msg_s") else ""
        target = TARGETS.get(key)
        met = ""
        if target:
            op, goal = target
            met = "yes" if (value >= goal if op == ">=" else value <= goal) else "NO"
        lines.append(
            f"{label:<30}{shown:>12}{_fmt(ceiling) if ceiling is not None else '':>12}{ratio:>12}"
            f"{(target[0] + ' ' + _fmt(target[1])) if target else '':>12}  {met}"
        )
    return "\n".join(lines)


def _clients(options: dict) -> str:
    client = options.get("client", "legacy")
    if client == "legacy":
        return ""
    return f"; {client} clients, batches of {options['batch_size']} (W messages in flight, consumer credit W)"


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value < 100:
        return f"{value:.3g}" if value < 10 else f"{value:.1f}"
    return f"{int(value):,}"


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump({k: v for k, v in result.items() if k != "samples"}, f, indent=2)


def plot(result: dict, path: str) -> None:
    """A latency distribution picture (CDF per phase); needs matplotlib (pip install 'pzq[bench]')."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from pzq.errors import ConfigError

        raise ConfigError("--plot needs matplotlib: pip install 'pzq[bench]'") from None
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, samples in result["samples"].items():
        values = sorted(samples)
        if not values:
            continue
        ys = [i / len(values) for i in range(1, len(values) + 1)]
        ax.plot([v / 1e6 for v in values], ys, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of messages")
    ax.set_title("pzq bench: latency distribution (last run)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
