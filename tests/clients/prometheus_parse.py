"""Validates a Prometheus text exposition with the reference parser (prometheus-client).

Usage: prometheus_parse.py FILE
Parses the whole text (any syntax error fails), then prints one JSON line mapping each
metric family to its type and sample count, for the caller to check.
"""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main() -> None:
    text = open(sys.argv[1], encoding="utf-8").read()
    families = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = {"type": family.type, "samples": len(family.samples),
                                 "labels": sorted({k for s in family.samples for k in s.labels})}
    print(json.dumps(families))


if __name__ == "__main__":
    main()
