#!/usr/bin/env python3
"""Our depth sweep beside llama-benchy (PyPI 0.4.0, the Spark Arena's tool) against the same
server, cell by cell: the CSV rows --spark-arena writes (report/arena.py, from
serving/load/depth.py's measurements) against the CSV llama-benchy writes itself, and the
ratio ours / llama-benchy of t/s (goal: within 5 %) and of e2e TTFT (goal: within 10 %).

The server is the vLLM emulator on 127.0.0.1 (its default pacing: the 122B TP=2 step model),
or any OpenAI-compatible server given with --base-url. llama-benchy runs from a venv of its
own (never a dependency of the plugin): --benchy-venv, default /tmp/benchy-venv
(``python3 -m venv /tmp/benchy-venv && /tmp/benchy-venv/bin/pip install llama-benchy==0.4.0``).
Offline, as on these machines: its prompt text (--book-url) is a word list served over HTTP
from 127.0.0.1, and its tokenizer (--tokenizer) a local word-level tokenizer.json built for
that text, one word one token, as the emulator counts them.

Both sides run the same cells (depths x concurrency, pp, tg, runs) with llama-benchy's
``--no-warmup --skip-coherence --latency-mode none --exact-tg``: no warm-up batch per cell,
no network latency subtracted (est_ppt = TTFR), exactly ``tg`` tokens (``ignore_eos``), as
our sweep. The prompt text is a seeded random word sequence: a periodic text would let two
of llama-benchy's randomly placed contexts share a prefix, and the server's prefix cache.
Each side runs twice, in the order ours, llama-benchy, llama-benchy, ours (a drift in the
machine's load weighs on both alike), and a figure is the mean of its two runs. Wall-clock
figures on a shared machine: the busy CPU share is printed beside them.

Measured 2026-12-05 against the emulator, depths 0,1024,4096, pp 512, tg 32, c 1,2,5, 3 runs,
on the shared 2-core machine at 95-100 % busy: header and every test name identical in every
run. Standard mode (18 rows): worst t/s 1.9 %, e2e TTFT 2.2 % in one run; 6.3 % / 6.1 % in
another (load average 16; our pp at c5 slower). --prefix-caching (30 rows, load average
24-27): t/s within 3 % on 26 of 30 rows, e2e TTFT within 3 % on 12 of 15, worst 6.9 % / 8.3 %
(pp512 @ d4096 (c1): ours slower).

    .venv/bin/python benchmarks/arena_vs_llama_benchy.py [--depths 0,2048] [--pp 512]
        [--tg 32] [--concurrency 1,2,4] [--runs 3] [--record fixtures/arena/benchy.csv]
"""

from __future__ import annotations

import argparse
import csv
import http.server
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import free_port, machine_cpu_s

REPO = Path(__file__).resolve().parents[1]
SIM_DIR = REPO / "sparksim"
sys.path.insert(0, str(REPO))

from pytest_spark.access.api import ApiEndpoint  # noqa: E402
from pytest_spark.report.arena import CSV_COLUMNS, csv_rows, csv_text  # noqa: E402
from pytest_spark.serving.load.depth import run_depth_sweep  # noqa: E402
from pytest_spark.settings.parsers import DepthSweep  # noqa: E402

WORDS = [
    "river",
    "stone",
    "light",
    "garden",
    "window",
    "paper",
    "silver",
    "morning",
    "quiet",
    "forest",
    "letter",
    "bridge",
    "candle",
    "harbor",
    "meadow",
    "winter",
    "orchard",
    "lantern",
    "valley",
    "thunder",
    "marble",
    "feather",
    "island",
    "compass",
    "velvet",
    "ember",
    "willow",
    "canyon",
]

TOKENIZER_SCRIPT = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
words = sys.argv[2].split()
vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
tok.save(sys.argv[1] + "/tokenizer.json")
"""


def serve_text(text: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    body = text.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/plain; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/book-{time.time_ns()}.txt"


def start_emulator(model: str, max_len: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSIM_EMU_")}
    env.update(PYTHONPATH=str(SIM_DIR), SPARKSIM_EMU_TIME_SCALE="0.0005")
    argv = [sys.executable, "-m", "emulator", "serve", f"/models/{model}", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--served-model-name", model, "--max-model-len", str(max_len)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the emulator did not come up in 120 s")


def run_benchy(opts: argparse.Namespace, base: str, tok_dir: Path, book: str, out: Path) -> None:
    cmd = [
        str(Path(opts.benchy_venv) / "bin" / "llama-benchy"),
        "--base-url", f"{base}/v1",
        "--model", opts.model,
        "--tokenizer", str(tok_dir),
        "--book-url", book,
        "--pp", str(opts.pp),
        "--tg", str(opts.tg),
        "--depth", *opts.depths.split(","),
        "--concurrency", *opts.concurrency.split(","),
        "--runs", str(opts.runs),
        "--latency-mode", "none",
        "--no-warmup",
        "--skip-coherence",
        "--exact-tg",
        "--format", "csv",
        "--save-result", str(out),
        *(["--enable-prefix-caching"] if opts.prefix_caching else []),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"llama-benchy failed ({done.returncode}):\n{done.stdout[-3000:]}")


def mean_rows(texts: list[str]) -> list[dict[str, str]]:
    """The CSVs' rows, each figure the mean over the CSVs (rows matched by test name)."""
    tables = [list(csv.DictReader(io.StringIO(t))) for t in texts]
    out = []
    for row in tables[0]:
        same = [r for t in tables for r in t if r["test_name"] == row["test_name"]]
        mean = dict(row)
        for key in CSV_COLUMNS[2:]:
            values = [float(r[key]) for r in same if r.get(key)]
            mean[key] = str(sum(values) / len(values)) if values else ""
        out.append(mean)
    return out


def ratio(a: str | float | None, b: str | float | None) -> str:
    try:
        return f"{float(a) / float(b):.3f}"  # type: ignore[arg-type]
    except (TypeError, ValueError, ZeroDivisionError):
        return "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="a running server (default: start the emulator)")
    parser.add_argument("--model", default="qwen")
    parser.add_argument("--depths", default="0,2048")
    parser.add_argument("--pp", type=int, default=512)
    parser.add_argument("--tg", type=int, default=32)
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--prefix-caching",
        action="store_true",
        help="llama-benchy's --enable-prefix-caching (the Arena's), and ours",
    )
    parser.add_argument("--benchy-venv", default="/tmp/benchy-venv")
    parser.add_argument("--record", help="copy llama-benchy's own CSV here")
    opts = parser.parse_args()
    spec = DepthSweep(
        depths=tuple(int(d) for d in opts.depths.split(",")),
        pp=opts.pp,
        tg=opts.tg,
        concurrency=tuple(int(c) for c in opts.concurrency.split(",")),
        runs=opts.runs,
        prefix_caching=opts.prefix_caching,
    )
    work = Path(tempfile.mkdtemp(prefix="arena-bench-"))
    n = max(spec.depths) + spec.pp
    rng = random.Random(7)
    text = " ".join(rng.choice(WORDS) for _ in range(max(20000, 3 * n)))
    subprocess.run(
        [
            str(Path(opts.benchy_venv) / "bin" / "python"),
            "-c",
            TOKENIZER_SCRIPT,
            str(work),
            " ".join(WORDS),
        ],
        check=True,
    )
    httpd, book = serve_text(text)
    proc = None
    base = opts.base_url
    try:
        if base is None:
            proc, base = start_emulator(opts.model, max(8192, 2 * n))
        cpu0, t0 = machine_cpu_s(), time.monotonic()
        api = ApiEndpoint(base_url=base, model=opts.model, timeout=600.0)
        walls = {"ours": 0.0, "benchy": 0.0}
        ours_texts, benchy_texts, fits, reports = [], [], [], []
        for side in ("ours", "benchy", "benchy", "ours"):
            t1 = time.monotonic()
            if side == "ours":
                result = run_depth_sweep(api, spec)
                fits.append(result.fit)
                reports.append(result.to_benchy())
                ours_texts.append(csv_text(csv_rows(reports[-1])))
            else:
                benchy_csv = work / f"benchy-{len(benchy_texts)}.csv"
                run_benchy(opts, base, work, book, benchy_csv)
                benchy_texts.append(benchy_csv.read_text())
            walls[side] += time.monotonic() - t1
        busy = (machine_cpu_s() - cpu0) / (os.cpu_count() or 1) / (time.monotonic() - t0)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        httpd.shutdown()
    theirs_text = benchy_texts[0]
    theirs = mean_rows(benchy_texts)
    ours_text = ours_texts[0]
    ours = {r["test_name"]: r for r in mean_rows(ours_texts)}
    header_theirs = theirs_text.splitlines()[0].split(",")
    print(f"server {base} model {opts.model}; cells {spec}")
    print(f"our calibration: {fits}")
    print(
        f"llama-benchy {walls['benchy']:.1f} s, ours {walls['ours']:.1f} s (two runs each); "
        f"machine busy {busy:.0%}"
    )
    print(f"header identical: {tuple(header_theirs) == CSV_COLUMNS}")
    print(f"test names identical: {[r['test_name'] for r in theirs] == list(ours)}")
    cols = ("test_name", "t/s benchy", "t/s ours", "ratio", "e2e_ttft benchy", "ours", "ratio")
    print(" | ".join(cols))
    t_s, ttft = [], []
    for row in theirs:
        mine = ours.get(row["test_name"], {})
        r1, r2 = (
            ratio(mine.get("t_s_mean"), row["t_s_mean"]),
            ratio(mine.get("e2e_ttft_mean"), row["e2e_ttft_mean"]),
        )
        if r1 != "-":
            t_s.append(abs(float(r1) - 1))
        if r2 != "-":
            ttft.append(abs(float(r2) - 1))
        print(
            f"{row['test_name']} | {float(row['t_s_mean']):.1f} | "
            f"{float(mine.get('t_s_mean') or 'nan'):.1f} | {r1} | "
            f"{row['e2e_ttft_mean'] or '-'} | {mine.get('e2e_ttft_mean') or '-'} | {r2}"
        )
    print(
        f"worst |ratio - 1|: t/s {max(t_s, default=0):.1%} (goal 5 %), "
        f"e2e TTFT {max(ttft, default=0):.1%} (goal 10 %)"
    )
    if opts.record:
        Path(opts.record).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(work / "benchy-0.csv", opts.record)  # its bytes (csv's \r\n)
        Path(opts.record).with_suffix(".ours.csv").write_text(ours_text, newline="")
        sweep = Path(opts.record).with_suffix(".sweep.json")  # our sweep's report, as recorded
        sweep.write_text(json.dumps(reports[0], indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
