"""A screenshot of `/dashboard` under W3 load: the server of `python -m bench w3`, its closed-loop
clients at one concurrency, and Debian's headless `chromium` (driven by playwright) showing the
page; the screenshot is taken `--shot-after` seconds into the load.

    python -m bench dashboard [--model PATH] [--concurrency 64] [--duration 90] [--shot-after 75]

Writes the PNG (`--png`, default bench/figures/dashboard-w3-<model>-<dtype>.png) and prints
what the load did (requests, errors).
"""

import json
import shutil
import threading
import time
from pathlib import Path

import anyio

from bench import common
from bench.parity import label_ids
from bench.w3 import Server, load_level, request_pool
from engine.loaders import load_checkpoint

FIGURES = Path(__file__).resolve().parent / "figures"
QUICK = dict(concurrency=4, duration=8.0, shot_after=6.0, pool=16)


def parse(argv):
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=90.0, help="seconds of load")
    p.add_argument("--shot-after", type=float, default=75.0, help="seconds into the load")
    p.add_argument("--pool", type=int, default=512, help="distinct request bodies, cycled")
    p.add_argument("--png", type=Path, default=None)
    p.add_argument("--startup-timeout", type=float, default=900.0)
    args = common.parse_args(p, argv, QUICK)
    args.worker = "asyncio"
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    executable = shutil.which("chromium")
    if executable is None:
        raise SystemExit("`chromium` is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    path = common.model_path(args)
    tokenizer = load_checkpoint(path, progress=not args.no_progress).tokenizer
    bodies = request_pool(tokenizer, label_ids(tokenizer), args.pool, args.seed)
    payloads = [json.dumps(b).encode() for b in bodies]
    png = args.png or FIGURES / f"dashboard-w3-{common.model_tag(args, path)}-{args.dtype}.png"
    with Server(path, args) as server, sync_playwright() as playwright:
        server.wait_ready(args.startup_timeout)
        browser = playwright.chromium.launch(executable_path=executable)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{server.url}/dashboard")
        load: dict = {}

        def run_load() -> None:
            load["results"], load["seconds"], _ = anyio.run(
                load_level, server.url, payloads, args.concurrency, args.duration, 10**9
            )

        clients = threading.Thread(target=run_load)
        clients.start()
        time.sleep(args.shot_after)
        page.screenshot(path=png, full_page=True)
        clients.join()
        browser.close()
    errors = sum(1 for _, status, _ in load["results"] if status != 200)
    report = {"png": str(png), "requests": len(load["results"]), "errors": errors}
    print(f"dashboard under W3 load at concurrency {args.concurrency}: {report}")
    return report
