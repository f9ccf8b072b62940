"""Push mode in child processes: every multiprocessing start method, Process and Pool (whose
`with` block terminates its workers), and a raw fork. Each child records a few calls and
returns well within one push interval; the aggregator must receive every call."""

from __future__ import annotations

import os
import subprocess
import sys

from exporter._internal import names
from tests.test_push import Aggregated

CALLS = 5
SCRIPT = r'''
import multiprocessing as mp
import os
import sys

import exporter

def work(case):
    for _ in range(''' + str(CALLS) + r'''):
        with exporter.track(model="m", provider="p", route=case) as call:
            call.token()
    return case

def main():
    cases = sys.argv[1:]
    for method in ("fork", "forkserver", "spawn"):
        context = mp.get_context(method)
        if f"{method}-process" in cases:
            children = [context.Process(target=work, args=(f"{method}-process",))
                        for _ in range(3)]
            for child in children:
                child.start()
            for child in children:
                child.join()
        if f"{method}-pool" in cases:
            with context.Pool(2) as pool:  # leaving `with` terminates the workers (SIGTERM)
                pool.map(work, [f"{method}-pool"] * 4)
    if "raw-fork" in cases:
        pid = os.fork()
        if pid == 0:
            work("raw-fork")
            sys.exit(0)
        os.waitpid(pid, 0)

if __name__ == "__main__":
    main()
'''
CASES = {"fork-process": 3, "fork-pool": 4, "forkserver-process": 3, "forkserver-pool": 4,
         "spawn-process": 3, "spawn-pool": 4, "raw-fork": 1}


def test_every_child_delivers_its_calls_at_exit(tmp_path):
    agg = Aggregated()
    try:
        script = tmp_path / "children.py"
        script.write_text(SCRIPT)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_EXPORTER_")}
        env["TTFT_EXPORTER_PUSH_URL"] = agg.url
        env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
        run = subprocess.run([sys.executable, str(script), *CASES], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        requests = agg.recorder.counts().rows[names.REQUESTS_TOTAL]
        delivered = {case: 0 for case in CASES}
        for (model, outcome, provider, route, tenant), n in requests.items():
            assert outcome == names.OK
            delivered[route] += n
        assert delivered == {case: children * CALLS for case, children in CASES.items()}, \
            run.stderr
    finally:
        agg.stop()
