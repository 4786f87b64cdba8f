"""What the Python benches share: their JSON lines and their statistics (imported as a sibling
module: the benches run as `python3 benches/NAME.py`)."""
import json
import statistics


def emit(row, json_path=None):
    """One result row: a JSON line on stdout, appended to `json_path` where given."""
    print(json.dumps(row), flush=True)
    if json_path:
        with open(json_path, "a") as f:
            f.write(json.dumps(row) + "\n")


def median_p90(values):
    """statistics.median, and p90 by nearest rank (the ceil(0.9 n)-th smallest), as bench.rs."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * 9 // 10))
    return statistics.median(ordered), ordered[rank - 1]
