#!/usr/bin/env python3
"""Plots the Pipeline dashboard's main panels from a Prometheus that scraped a real run.

    scripts/plot-pipeline-dashboard.py PROMETHEUS_URL START END OUT.png

START and END are unix seconds. The queries are the dashboard's own (charts/granary/dashboards/
pipeline.json), with Grafana's variables replaced as the end-to-end test replaces them. Needs
matplotlib. docs/observability.md says how docs/img/pipeline-dashboard.png was made.
"""

import json
import sys
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ("Trainer wait fraction", "percent", [
        ("waiting", 'sum(rate(granary_trainer_wait_seconds_sum[5s])) / '
                    '(sum(rate(granary_trainer_wait_seconds_sum[5s])) + sum(rate(granary_trainer_step_seconds_sum[5s])))'),
    ]),
    ("Batches per second: delivered vs demanded", "batches/s", [
        ("delivered", "sum(rate(granary_trainer_batches_total[5s]))"),
        ("demanded", "sum(granary_trainer_demand_batches_per_second)"),
    ]),
    ("Workers", "workers", [
        ("desired", "sum(granary_workers_desired)"),
        ("ready", "sum(granary_workers_ready)"),
    ]),
    ("Cache splits per second", "splits/s", [
        ("{outcome}", "sum by (outcome) (rate(granary_cache_splits_total[5s]))"),
    ]),
]


def query_range(base, expr, start, end):
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 1})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}") as r:
        body = json.load(r)
    if body["status"] != "success":
        raise SystemExit(f"{expr}: {body}")
    return body["data"]["result"]


def main():
    base, start, end, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    fig, axes = plt.subplots(2, 2, figsize=(12, 6.5), sharex=True)
    for ax, (title, unit, queries) in zip(axes.flat, PANELS):
        for legend, expr in queries:
            for series in query_range(base, expr, start, end):
                xs = [float(t) - start for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                if unit == "percent":
                    ys = [100 * y for y in ys]
                ax.plot(xs, ys, label=legend.format(**series["metric"]), linewidth=1.6)
        ax.set_title(title, fontsize=11)
        ax.set_ylabel("%" if unit == "percent" else unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    for ax in axes[1]:
        ax.set_xlabel("seconds into the run")
    fig.suptitle("Granary / Pipeline: granary run, real data scraped by Prometheus 2.42", fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main()
