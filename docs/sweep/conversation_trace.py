#!/usr/bin/env python3
"""A synthetic chat-conversation LLM trace in the Azure LLM 2023 trace format (issue 43).

`shared/data/` holds only the Azure LLM 2023 *code* trace (short outputs: median 13
tokens). Issue 43 asks for CALM against its baselines on chat conversations, whose
outputs are an order of magnitude longer. This script writes a trace with the
published shape of the Azure 2023 *conversation* trace (Splitwise, ISCA'24: about
19,400 requests in an hour; prompts median 1,020 tokens, mean ~1,155; outputs median
129, mean ~211), deterministically from its seed:

- arrivals: a Poisson process whose rate swings ±30 % around 5.4 requests/s with a
  10-minute period (a chat service's minutes-scale swing; the code trace is bursty
  too);
- prompt tokens: log-normal, median 1,020, σ 0.5 (mean ≈ 1,156), clipped to 16–8,192;
- generated tokens: log-normal, median 129, σ 0.99 (mean ≈ 211), clipped to 1–2,048.

Usage: python3 docs/sweep/conversation_trace.py OUT.csv [--seed 43] [--minutes 60]
Then: yardmaster sim compare --pipeline llm --workload azure-llm:OUT.csv --speedup 4 ...
"""

import argparse
import math
import random
from datetime import datetime, timedelta

START = datetime(2023, 11, 16, 18, 0, 0)
MEAN_RATE = 5.4
SWING = 0.3
PERIOD_S = 600.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--minutes", type=float, default=60.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    horizon = args.minutes * 60.0
    peak = MEAN_RATE * (1.0 + SWING)
    t = 0.0
    rows = []
    while True:
        # Thinning: candidates at the peak rate, kept with rate(t) / peak.
        t += rng.expovariate(peak)
        if t >= horizon:
            break
        rate = MEAN_RATE * (1.0 + SWING * math.sin(2.0 * math.pi * t / PERIOD_S))
        if rng.random() * peak > rate:
            continue
        prompt = min(8192, max(16, round(rng.lognormvariate(math.log(1020.0), 0.5))))
        output = min(2048, max(1, round(rng.lognormvariate(math.log(129.0), 0.99))))
        rows.append((t, prompt, output))
    with open(args.out, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for t, prompt, output in rows:
            stamp = START + timedelta(seconds=t)
            f.write(f"{stamp.strftime('%Y-%m-%d %H:%M:%S')}.{stamp.microsecond:06d}0,{prompt},{output}\n")


if __name__ == "__main__":
    main()
