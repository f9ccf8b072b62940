"""`ttft-exporter` command line: serve, demo, generate, diagnose, watch, view, check-config.

User mistakes (a bad config, a busy port) print one clear line per problem and exit 2; a
traceback means a bug in the exporter.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NoReturn

from ._internal import runtime
from ._internal.config.loader import key_lines, load
from ._internal.config.settings import Config, ConfigError
from ._internal.expose.http_thread import address_problem
from ._internal.expose.server import serve_until_signalled

#: What check-config cannot know before serve runs, said after its "ok".
RUNTIME_ONLY = ("not checked until serve starts: whether server.port is free, and the "
                "snapshot's content (one that cannot be read is set aside and logged)")


def serve_problems(config: Config) -> list[tuple[str, str]]:
    """What `serve` would refuse in this config besides its syntax, as (key, reason) pairs: the
    listen address, an open /push beyond loopback, the secret and TLS files, the snapshot
    directory."""
    from ._internal.fleet import access, journal

    out = []
    why = address_problem(config.server.addr)
    if why is not None:
        out.append(("server.addr", why))
    why = access.open_push_problem(config, config.server.addr)
    if why is not None:
        out.append((access.PUSH_TOKEN, why))
    out += access.problems(config)
    snapshot = config.aggregator.snapshot_path
    why = journal.unusable(snapshot) if snapshot else None
    if why is not None:
        out.append(("aggregator.snapshot_path", why))
    return out


def _check_config(args: argparse.Namespace) -> int:
    problems = serve_problems(load(args.file))
    if problems:
        raise ConfigError(args.file, problems, key_lines(args.file))
    print(f"{args.file}: ok ({RUNTIME_ONLY})")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from ._internal.expose.server import create_app
    from ._internal.fleet import access
    from ._internal.fleet.aggregator import Aggregator, tune_gc

    config = load(args.config)
    addr = args.addr or config.server.addr
    port = args.port if args.port is not None else config.server.port
    why = address_problem(addr)
    if why is not None:
        raise ConfigError("command line" if args.addr else args.config or "config",
                          [("--addr" if args.addr else "server.addr", why)],
                          key_lines(args.config) if args.config and not args.addr else None)
    why = access.open_push_problem(config, addr)
    if why is not None:  # before the snapshot is restored: refused, nothing touched
        raise ConfigError(args.config or "config", [(access.PUSH_TOKEN, why)])
    aggregator = Aggregator(config)  # restores the snapshot, if any
    runtime.become_aggregator(config, aggregator.recorder, aggregator.families)
    tune_gc()
    serve_until_signalled(addr, port, create_app(lambda: runtime.state().renderer, aggregator),
                          aggregator.access.ssl_context(), config.server)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._internal.demo.loadgen import LoadShape
    from ._internal.demo.run import run_demo

    return run_demo(port=args.port, seconds=args.seconds, config=args.config,
                    shape=LoadShape(rate=args.rate), incidents=not args.no_incidents,
                    calm_seconds=args.calm_seconds, phase_seconds=args.phase_seconds,
                    page_port=args.page_port, page=not args.no_page)


def _diagnose(args: argparse.Namespace) -> int:
    import json
    from dataclasses import replace

    from ._internal.evidence.thresholds import DEFAULT
    from ._internal.diagnose.run import (DiagnoseError, Prometheus, Request, diagnose,
                                         parse_duration, parse_time, table)

    try:
        at = parse_time(args.at) if args.at else time.time()
        req = Request(at=at, since=parse_duration(args.since),
                      baseline=parse_duration(args.baseline),
                      baseline_at=parse_time(args.baseline_at) if args.baseline_at else None,
                      model=args.model, route=args.route,
                      candidates=args.baseline_candidates)
        if args.baseline_candidates < 1:
            raise DiagnoseError(f"--baseline-candidates must be at least 1, got "
                                f"{args.baseline_candidates}")
        if args.min_calls < 1:
            raise DiagnoseError(f"--min-calls must be at least 1, got {args.min_calls}")
        findings = diagnose(Prometheus(args.prometheus, timeout=args.timeout), req,
                            replace(DEFAULT, min_calls=args.min_calls))
    except DiagnoseError as e:
        print(f"ttft-exporter diagnose: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([f.as_json() for f in findings], indent=2))
    else:
        print(table(findings, req))
    return 0


def _watch(args: argparse.Namespace) -> int:
    from ._internal.diagnose.run import DiagnoseError, Prometheus, parse_duration
    from ._internal.diagnose.watch import Watch, WatchService, Windows
    from ._internal.expose import http_thread
    from ._internal.expose.connection_guard import Limits

    config = load(args.config)
    why = address_problem(args.addr)
    if why is not None:
        raise ConfigError("command line", [("--addr", why)])
    try:
        interval = parse_duration(args.interval)
        windows = Windows.of(config.alerting)
        windows.request(time.time())  # a baseline that overlaps the window is refused here
        watch = Watch(Prometheus(args.prometheus, timeout=args.timeout), windows)
    except DiagnoseError as e:
        print(f"ttft-exporter watch: {e}", file=sys.stderr)
        return 2
    service = WatchService(watch, args.addr, args.port, Limits.of(config.server))
    service.start(interval)
    try:
        http_thread.wait_for_signal(
            f"ttft-exporter watch serving {service.server.base_url}/metrics, deciding every "
            f"{interval:g} s from {args.prometheus}")
    finally:
        service.stop()
    return 0


def _view(args: argparse.Namespace) -> int:
    from ._internal.diagnose.run import DiagnoseError, parse_duration
    from ._internal.view.backend import Findings
    from ._internal.view.boards import BoardsError, load_boards
    from ._internal.view.pages import Settings
    from ._internal.view.server import create_app, serve_until_signalled

    try:
        boards = load_boards(Path(args.dashboards))
        findings = Findings(args.prometheus, since=parse_duration(args.since),
                            baseline=parse_duration(args.baseline))
        settings = Settings(scrape_seconds=parse_duration(args.scrape_interval),
                            time_from=f"now-{parse_duration(args.range):.0f}s" if args.range else None)
        app = create_app(boards, args.prometheus, settings, findings,
                         allowed_hosts=args.allow_host)
    except (BoardsError, DiagnoseError) as e:
        print(f"ttft-exporter view: {e}", file=sys.stderr)
        return 2
    serve_until_signalled(app, args.addr, args.port)
    return 0


def _generate(args: argparse.Namespace) -> int:
    import yaml

    try:
        from ._internal.generate.files import generate, generate_defaults
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "grafanalib":
            raise
        print("ttft-exporter generate: needs the generate extra: pip install "
              "'ttft-exporter[generate]' (grafanalib; the serve image leaves it out)",
              file=sys.stderr)
        return 2

    if args.check:
        return _check_dashboards(args)
    if args.config is None:  # the defaults in both modes: what the repository commits
        written = generate_defaults(Path(args.out))
    else:  # the file as written goes with the chart's copies (generated-config.yaml)
        source = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
        written = generate(load(args.config), Path(args.out), source or {})
    for path in written:
        print(path)
    return 0


def _check_dashboards(args: argparse.Namespace) -> int:
    """`generate --check`: the dashboard files under --out read only defined metrics."""
    from dataclasses import replace

    from ._internal.config.settings import Config, DashboardsConfig
    from ._internal.generate.check import defined_metrics, undefined_metrics

    if args.config is None:  # the defaults in both modes, as generate writes them
        configs = [replace(Config(), dashboards=DashboardsConfig(histograms=mode))
                   for mode in ("classic", "native")]
    else:
        configs = [load(args.config)]
    files = sorted(Path(args.out, "dashboards").rglob("*.json"))
    if not files:
        print(f"ttft-exporter generate --check: no dashboards under {Path(args.out, 'dashboards')}",
              file=sys.stderr)
        return 2
    problems = undefined_metrics(files, defined_metrics(configs))
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print(f"{len(files)} dashboards read only metrics the exporter serves or its rules record")
    return 1 if problems else 0


def _port(text: str) -> int:
    """A TCP port for argparse: 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 0 (any free port) and 65535, "
                                         f"got {port}")
    return port


def _positive(text: str) -> float:
    """A positive number for argparse (calls per second, seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def _prometheus_options(p: argparse.ArgumentParser) -> None:
    """The Prometheus a reading command queries, and how long each query may take."""
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus' base URL, e.g. http://prometheus:9090")
    p.add_argument("--timeout", type=_positive, default=10.0,
                   help="seconds per Prometheus query (default 10)")


class _OneLineParser(argparse.ArgumentParser):
    """A parser whose errors are one line on stderr and exit 2, like every other user
    mistake (argparse's own prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (--help for usage)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="ttft-exporter", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve /metrics (and /push from worker processes) in the "
                                     "foreground until SIGTERM")
    p.add_argument("--config", help="ttft-exporter.yaml (defaults when absent)")
    p.add_argument("--addr", help="bind address (default from config: 127.0.0.1)")
    p.add_argument("--port", type=_port, help="port (default from config: 9469)")
    p.set_defaults(func=_serve)
    p = sub.add_parser("demo", help="provider, load, exporter, Prometheus with the generated "
                                    "rules and the dashboards' page, on the embedded default")
    p.add_argument("--config", help="ttft-exporter.yaml (defaults when absent)")
    p.add_argument("--port", type=_port, default=9469, help="exporter port (default 9469)")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: never)")
    p.add_argument("--rate", type=_positive, default=10.0,
                   help="calls per second, all models together (default 10)")
    p.add_argument("--no-incidents", action="store_true",
                   help="stay calm: do not play the incident day")
    p.add_argument("--calm-seconds", type=float, default=120.0,
                   help="calm before the first incident and after the last (default 120)")
    p.add_argument("--phase-seconds", type=float, default=180.0,
                   help="length of each of the four incidents (default 180)")
    p.add_argument("--page-port", type=_port,
                   help="the dashboards page's port (default: --port + 1, any free one with "
                        "--port 0)")
    p.add_argument("--no-page", action="store_true",
                   help="no Prometheus and no dashboards page: provider, load and exporter")
    p.set_defaults(func=_demo)
    p = sub.add_parser("generate", help="write dashboards/ and alerts/ from the config")
    p.add_argument("--config", help="ttft-exporter.yaml (without it: the defaults, classic "
                                    "histograms at the top and native ones under native/)")
    p.add_argument("--out", default=".", help="directory holding dashboards/ and alerts/")
    p.add_argument("--check", action="store_true",
                   help="write nothing; fail (exit 1) when a panel of the dashboards under "
                        "--out queries a metric that no code defines")
    p.set_defaults(func=_generate)
    p = sub.add_parser("diagnose", help="name the likely cause of a TTFT rise per model and "
                                        "route, from Prometheus (docs/diagnose.md)")
    _prometheus_options(p)
    p.add_argument("--since", default="15m", metavar="DURATION",
                   help="the window diagnosed, ending now (default 15m)")
    p.add_argument("--baseline", default="1h", metavar="DURATION",
                   help="the window compared with, ending where --since starts (default 1h)")
    p.add_argument("--model", help="only this model")
    p.add_argument("--route", help="only this route")
    p.add_argument("--json", action="store_true", help="a JSON array of findings")
    p.add_argument("--at", metavar="TIME",
                   help="end of the diagnosed window instead of now (unix seconds or RFC 3339)")
    p.add_argument("--baseline-at", metavar="TIME",
                   help="end of the baseline window (default: where the diagnosed one starts)")
    p.add_argument("--baseline-candidates", type=int, default=3, metavar="N",
                   help="baseline windows to choose from, each one step further back; per "
                        "model and route the most recent one no incident covers (default 3; "
                        "1: the baseline as given)")
    p.add_argument("--min-calls", type=int, default=20,
                   help="calls a model and route needs in each window (default 20, as "
                        "alerting.min_calls)")
    p.set_defaults(func=_diagnose)
    p = sub.add_parser("watch", help="run diagnose's decision every interval and serve it as "
                                     "llm_ttft_likely_cause for the LLMTTFTLikelyCause alert")
    _prometheus_options(p)
    p.add_argument("--config", help="ttft-exporter.yaml: its alerting windows, job and "
                                    "min_calls (defaults when absent)")
    p.add_argument("--addr", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=9471, help="port (default 9471)")
    p.add_argument("--interval", default="30s", metavar="DURATION",
                   help="how often the decision runs (default 30s)")
    p.set_defaults(func=_watch)
    p = sub.add_parser("view", help="a local web page of the generated dashboards, drawn from "
                                    "Prometheus, with its firing alerts and diagnose's findings")
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus' base URL, e.g. http://127.0.0.1:9090")
    p.add_argument("--port", type=_port, default=9470, help="page port (default 9470)")
    p.add_argument("--addr", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a DNS name the page is opened by (repeatable); by default it answers "
                        "only to its address, and to localhost on loopback (DNS rebinding)")
    p.add_argument("--dashboards", default="dashboards", metavar="DIR",
                   help="the dashboards' JSON, as generate wrote it (default ./dashboards)")
    p.add_argument("--scrape-interval", default="15s", metavar="DURATION",
                   help="Prometheus' scrape interval, for $__rate_interval (default 15s)")
    p.add_argument("--range", metavar="DURATION",
                   help="time range shown, ending now (default: each dashboard's own)")
    p.add_argument("--since", default="15m", metavar="DURATION",
                   help="diagnose's window on the page (default 15m)")
    p.add_argument("--baseline", default="1h", metavar="DURATION",
                   help="diagnose's baseline window (default 1h)")
    p.set_defaults(func=_view)
    p = sub.add_parser("check-config", help="validate a config file; exit 2 on any error")
    p.add_argument("file")
    p.set_defaults(func=_check_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    except OSError as e:  # e.g. the port is taken
        print(f"ttft-exporter {args.command}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
