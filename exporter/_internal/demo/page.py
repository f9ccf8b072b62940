"""The demo's page: Debian's Prometheus scraping the demo's exporter with the rules generated
from the demo's config, `ttft-exporter watch` deciding the likely cause for the cause alert, and
`ttft-exporter view` of the dashboards generated from it.

Both come from one `generate` into a temporary directory, so what the page draws and what
Prometheus evaluates are exactly what the demo's config generates; both stop with the demo.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..config.settings import Config
from ..diagnose.run import Prometheus
from ..diagnose.watch import Watch, WatchService, Windows
from ..generate.files import RULE_FILES, generate
from ..view.backend import Findings
from ..view.boards import load_boards
from ..view.pages import Settings
from ..view.server import ViewServer, create_app
from .prometheus import PrometheusProcess, missing, scrape_config

#: Prometheus scrapes the exporter every 5 s and evaluates the rules every 10 s, and the watch
#: decides every 10 s: the panels move within seconds.
SCRAPE_SECONDS, EVALUATION_SECONDS = 5.0, 10.0
#: The page shows the last 15 minutes and refreshes every 10 s.
RANGE, REFRESH_SECONDS = "now-15m", 10.0


@contextlib.contextmanager
def dashboards_page(config: Config, exporter_target: str, port: int,
                    findings: Findings | None = None) -> Iterator[str | None]:
    """The page's URL while the block runs (None, with one line printed saying why, when the
    `prometheus` binary is missing). `exporter_target` is the exporter's host:port; `findings`
    sets diagnose's windows (its Prometheus URL is filled in here)."""
    why = missing()
    if why is not None:
        print(f"{why}; the demo runs without its dashboards page", flush=True)
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="ttft-demo-") as directory:
        out = Path(directory)
        generate(config, out)
        watch = WatchService(Watch(None, Windows.of(config.alerting)), "127.0.0.1", 0)
        watch.start(EVALUATION_SECONDS)
        scrape = scrape_config(exporter_target, job=config.alerting.exporter_job,
                               interval=SCRAPE_SECONDS, evaluation=EVALUATION_SECONDS,
                               watch=watch.target)
        with contextlib.ExitStack() as stack:
            stack.callback(watch.stop)
            prom = stack.enter_context(PrometheusProcess(scrape, rule_files=[
                out / "alerts" / name for name in RULE_FILES]))
            watch.decide(Prometheus(prom.url))
            if findings is None:
                findings = Findings(prom.url)
            findings.prometheus_url = prom.url
            settings = Settings(scrape_seconds=SCRAPE_SECONDS, time_from=RANGE,
                                refresh_seconds=REFRESH_SECONDS)
            view = ViewServer(create_app(load_boards(out / "dashboards"), prom.url, settings,
                                         findings), port=port).start()
            try:
                yield view.url
            finally:
                view.stop()
