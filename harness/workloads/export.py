"""Write the requests a run would serve as Mooncake JSONL, for other tools to replay the same load.

    python -m harness.workloads.export OUT.jsonl [overrides]
    python -m harness.workloads.export azure.jsonl workload=trace_azure_conv workload.num_requests=2000

The overrides are `python -m harness`'s: the workload is built as a run builds it (the same seed,
lengths, arrival times, and clipping or skipping at scheduler.max_model_len), then written with
harness.workloads.mooncake.write_mooncake: times in whole milliseconds, hash_ids from the prompts'
512-token blocks, equal ids for equal prefixes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from harness.arguments import check_arguments
from harness.convert import ConfigError
from harness.scripting import compose_run_config, one_line_errors
from harness.workloads.build import build_workload
from harness.workloads.mooncake import write_mooncake
from harness.workloads.trace import MOONCAKE_SUFFIX

USAGE = "usage: python -m harness.workloads.export OUT.jsonl [overrides, as for python -m harness]"


def export(out: str, overrides: Sequence[str]) -> int:
    rc = compose_run_config(overrides)
    workload = build_workload(rc.workload, rc.scheduler.max_model_len, rc.model.vocab_size)
    try:
        path = write_mooncake(workload.requests, out)
    except OSError as error:  # a directory, a file where a folder should be, no permission
        raise ConfigError(f"cannot write {out}: {error.strerror or error}") from None
    print(f"{len(workload.requests)} requests of workload {rc.workload.label!r} written to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or "=" in args[0] or args[0].startswith("-"):
        print(f"error: the output file comes first; {USAGE}", file=sys.stderr)
        return 2
    out, overrides = args[0], args[1:]
    if not out.endswith(MOONCAKE_SUFFIX):
        print(f"error: the output file {out!r} must end in {MOONCAKE_SUFFIX} (Mooncake JSONL); {USAGE}",
              file=sys.stderr)
        return 2
    if (problem := check_arguments(overrides)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return one_line_errors(lambda: export(out, overrides))


if __name__ == "__main__":
    raise SystemExit(main())
