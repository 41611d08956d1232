"""Elements a second in the e2e consumer's JSON lines (one a batch, on stdin) between two times.

    granary-e2e-consume ... | python3 bench/consumer_rate.py FROM TO

FROM and TO are seconds after this script starts; it stops reading at TO and prints the rate.
"""

import json
import sys
import time


def main() -> None:
    start = time.monotonic()
    lo, hi = float(sys.argv[1]), float(sys.argv[2])
    n = 0
    for line in sys.stdin:
        t = time.monotonic() - start
        if t >= hi:
            break
        if t >= lo:
            n += len(json.loads(line).get("keys", []))
    print(f"{n / (hi - lo):.1f}")


if __name__ == "__main__":
    main()
