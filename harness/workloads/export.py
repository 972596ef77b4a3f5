"""Write the requests a run would serve as Mooncake JSONL, for other tools to replay the same load.

    python -m harness.workloads.export OUT.jsonl [--block-tokens N] [overrides]
    python -m harness.workloads.export azure.jsonl workload=trace_azure_conv workload.num_requests=2000

The overrides are `python -m harness`'s: the workload is built as a run builds it (the same seed,
lengths, arrival times, and clipping or skipping at scheduler.max_model_len), then written with
harness.workloads.mooncake.write_mooncake: times in whole milliseconds, hash_ids from the prompts'
blocks of N tokens (--block-tokens; default the workload's workload.hash_block_tokens, 512 unless a
Mooncake trace was read at another size, so that it reads back as it was read), equal ids for equal
prefixes.
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

USAGE = "usage: python -m harness.workloads.export OUT.jsonl [--block-tokens N] [overrides, as for python -m harness]"
BLOCK_OPTION = "--block-tokens"


def export(out: str, overrides: Sequence[str], block_tokens: int | None = None) -> int:
    rc = compose_run_config(overrides)
    workload = build_workload(rc.workload, rc.scheduler.max_model_len, rc.model.vocab_size)
    block = rc.workload.hash_block_tokens if block_tokens is None else block_tokens
    try:
        path = write_mooncake(workload.requests, out, block)
    except OSError as error:  # a directory, a file where a folder should be, no permission
        raise ConfigError(f"cannot write {out}: {error.strerror or error}") from None
    print(f"{len(workload.requests)} requests of workload {rc.workload.label!r} written to {path} "
          f"({block} tokens a hash id)")
    return 0


def _block_option(args: list[str]) -> tuple[int | None, list[str]]:
    """--block-tokens N (or =N) taken out of args; a ValueError naming it when N is no int >= 1."""
    rest: list[str] = []
    value: str | None = None
    i = 0
    while i < len(args):
        if args[i] == BLOCK_OPTION:
            value = args[i + 1] if i + 1 < len(args) else ""
            i += 2
            continue
        if args[i].startswith(BLOCK_OPTION + "="):
            value = args[i].split("=", 1)[1]
        else:
            rest.append(args[i])
        i += 1
    if value is None:
        return None, rest
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{BLOCK_OPTION} must be an int >= 1 (tokens a hash id names), got {value!r}")
    return int(value), rest


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{(__doc__ or '').strip()}")
        return 0
    if not args or "=" in args[0] or args[0].startswith("-"):
        print(f"error: the output file comes first; {USAGE}", file=sys.stderr)
        return 2
    out = args[0]
    try:
        block_tokens, overrides = _block_option(args[1:])
    except ValueError as error:
        print(f"error: {error}; {USAGE}", file=sys.stderr)
        return 2
    if not out.endswith(MOONCAKE_SUFFIX):
        print(f"error: the output file {out!r} must end in {MOONCAKE_SUFFIX} (Mooncake JSONL); {USAGE}",
              file=sys.stderr)
        return 2
    if (problem := check_arguments(overrides)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return one_line_errors(lambda: export(out, overrides, block_tokens))


if __name__ == "__main__":
    raise SystemExit(main())
