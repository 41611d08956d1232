"""Per-epoch medians of bench/cache.sh's runs (JSON lines on stdin), against the prediction."""
import json
import statistics
import sys

runs = [json.loads(line) for line in sys.stdin if line.strip()]
print("%-11s %-6s %5s %-14s %9s %9s %6s" % ("case", "policy", "epoch", "cache", "items/s", "predicted", "ratio"))
for case in ("photos", "slow-store"):
    for policy in ("auto", "never"):
        rs = [r for r in runs if r["case"] == case and r["policy"] == policy]
        if not rs:
            continue
        for e in range(len(rs[0]["epochs"])):
            eps = [r["epochs"][e] for r in rs]
            rate = statistics.median(x["items"] / x["seconds"] for x in eps)
            preds = [x["predicted_items_per_s"] for x in eps if x.get("predicted_items_per_s")]
            pred = statistics.median(preds) if preds else None
            modes = ",".join(sorted({x.get("cache") or "-" for x in eps}))
            ratio = "%.2f" % (rate / pred) if pred else "-"
            print("%-11s %-6s %5d %-14s %9.0f %9s %6s" % (case, policy, e, modes, rate, "%.0f" % pred if pred else "-", ratio))
