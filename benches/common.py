"""What the Python benches share: their command line's common options, their JSON lines and their
statistics (imported as a sibling module: the benches run as `python3 benches/NAME.py`)."""
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


def parse_args(ap, self_test):
    """The bench's arguments, with `--json` and `--self-test` added; `None` once the host-only
    self-test has run instead. Without it, `--array` is required."""
    ap.add_argument("--json", help="append result lines to this JSONL file")
    ap.add_argument("--self-test", action="store_true", help="host-only checks (no GPU)")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return None
    if not args.array:
        ap.error("--array is required")
    return args
