"""`python -m harness.serve [overrides]`: an OpenAI-compatible server over the engine or the simulator.

  python -m harness.serve backend=sim model=qwen3-8b hardware=h100 serve.port=8000
  python -m harness.serve backend=engine model=qwen3-0.6b serve.port=8000          # GPU

The config is a run's (conf/config.yaml) plus the serve group (conf/serve/default.yaml), composed
as conf/serving.yaml. On SIGINT/SIGTERM it stops taking requests, aborts those in flight, writes
requests.csv / steps.csv.gz / summary.csv into its run folder (outputs/serve/<time>/) and exits
with 128 + the signal's number; a config mistake is one line and exit 2. serve_overhead.csv
holds what the HTTP side added per request and per token (harness.serve.overhead).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from harness.arguments import check_arguments
from harness.config import build_run_config, section
from harness.convert import ConfigError, to_dataclass
from harness.paths import CONF_DIR
from harness.run import write_outcome
from harness.run_folder import UniqueDirs, remove_if_unused
from harness.serve.config import ServeConfig, with_server_loop


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="serving")
def main(cfg: DictConfig) -> None:
    from harness.config import OutputConfig
    from harness.serve.build import run_event_loop
    from harness.serve.server import serve_async

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        rc = build_run_config(cfg)
        config = to_dataclass(ServeConfig, section(cfg, "serve"), "serve")
        rc = with_server_loop(rc, config)
        output = to_dataclass(OutputConfig, section(cfg, "output"), "output")
    except (ConfigError, ValueError) as error:  # with_server_loop's refusals are ValueErrors
        remove_if_unused(out_dir)
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None

    def ready(port: int) -> None:
        host = f"[{config.host}]" if ":" in config.host else config.host  # an IPv6 address in a URL
        print(f"serving {rc.backend} on http://{host}:{port}/v1 (Ctrl-C writes {out_dir} and stops)", flush=True)

    try:
        outcome, signum = run_event_loop(serve_async(rc, config, ready))
    except (ValueError, TypeError) as error:  # the backend refused the configuration
        remove_if_unused(out_dir)
        print(f"error: backend={rc.backend}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as error:  # the port is taken, or the host does not resolve (server.serve_async binds it)
        remove_if_unused(out_dir)
        print(f"error: {error.strerror or error}", file=sys.stderr)
        raise SystemExit(1) from None
    write_outcome(outcome, out_dir, plots=output.plots and bool(outcome.summary.num_requests), steps=output.steps)
    outcome.overhead.to_csv(out_dir / "serve_overhead.csv", index=False)
    print(f"served {len(outcome.requests)} requests; outputs: {out_dir}", flush=True)
    if signum is not None:
        raise SystemExit(128 + signum)


def cli(argv: list[str]) -> None:
    if (problem := check_arguments(argv, config_name="serving")) is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    OmegaConf.register_new_resolver("unique_dir", UniqueDirs(), replace=True)
    main()


if __name__ == "__main__":
    cli(sys.argv[1:])
