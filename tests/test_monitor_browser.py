"""End to end: real headless Chromium opens the monitor while a run writes its logs.

Chromium is the system's, driven by Playwright (tests/browser.py): no browser download.
The screenshot is kept at artifacts/monitor.png (or $SAO_ARTIFACTS/monitor.png).
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sao_repro.monitor import serve_in_thread
from sao_repro.monitor import SMOOTH_STEPS
from sao_repro.report import find_chromium
from sao_repro.settings import setting_color
from browser import open_page

HERE = Path(__file__).resolve().parent
ARTIFACTS = Path(os.environ.get("SAO_ARTIFACTS", HERE.parent / "artifacts"))
CHROMIUM = find_chromium()

pytestmark = pytest.mark.browser  # without Chromium: skipped, or failed under CI (tests/conftest.py)


STATE_JS = """(() => {
  if (!document.getElementById('status') || !document.body) return null;
  const pts = {};
  for (const c of document.querySelectorAll('canvas[data-metric]')) pts[c.dataset.metric] = +c.dataset.points;
  const flags = {};
  for (const tr of document.querySelectorAll('#runs tbody tr')) flags[tr.dataset.run] = tr.dataset.flags;
  return {polls: +(document.body.dataset.polls || 0), points: pts, flags: flags,
          status: document.getElementById('status').textContent,
          resources: performance.getEntriesByType('resource').map(e => e.name)};
})()"""


def fake_runs_cmd(logs, steps, interval, *extra) -> list[str]:
    "The fake testbed writing two runs (sao and grpo, seed 0) of `steps` steps into `logs`, `interval` s apart."
    cmd = [sys.executable, str(HERE / "fake_testbed.py"), "--out", str(logs), "--runs", "sao:0,grpo:0"]
    return cmd + ["--steps", str(steps), "--interval", str(interval), *extra]


def rgb(hex_color):
    return tuple(int(hex_color[i : i + 2], 16) for i in (1, 3, 5))


def wait_for(page, pred, timeout, what):
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        try:
            state = page.evaluate(STATE_JS)
        except Exception as e:  # the page is between documents (navigation in flight)
            state = str(e)
        if isinstance(state, dict) and pred(state):
            return state
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last page state: {state}")


def test_monitor_page_updates_live(tmp_path):
    logs = tmp_path / "runs"
    logs.mkdir()
    srv = serve_in_thread(logs, port=0, refresh_s=0.5)
    browser = contextlib.ExitStack()
    chrome = browser.enter_context(open_page())
    writer = None
    try:
        chrome.goto(srv.url)
        # the runs start once the page is up (Chromium's start under load must not eat the runs' first seconds);
        # the page finds them by itself
        writer = subprocess.Popen(fake_runs_cmd(logs, 45, 0.3, "--nan-run", "grpo:0", "--nan-at", "30"))
        sao, grpo = "mini/sao/seed0", "mini/grpo/seed0"
        first = wait_for(
            chrome,
            lambda s: s["points"].get("acc", 0) > 0 and len(s["flags"]) == 2,
            30,
            "the first points of both runs",
        )
        assert first["flags"][sao] == "" and first["flags"][grpo] == ""
        assert set(first["points"]) >= {
            "acc",
            "reward/mean",
            "dis/kept_frac",
            "dis/masked_frac",
            "critic/explained_var",
            "rollout/resp_len",
            "rollout/policy_lag",
        }
        # smoothed by default (EMA span 20), raw points drawn behind, the report's colour per setting
        assert chrome.evaluate("document.getElementById('smooth').value") == str(SMOOTH_STEPS) == "20"
        assert (
            chrome.evaluate("+document.querySelector('canvas[data-metric=acc]').dataset.rawPoints")
            == first["points"]["acc"]
        )
        swatches = chrome.evaluate(
            "[...document.querySelectorAll('#legend span')].map(s => [s.textContent, "
            "getComputedStyle(s.querySelector('i')).backgroundColor])"
        )
        assert dict(swatches) == {s: "rgb({}, {}, {})".format(*rgb(setting_color(s))) for s in ("sao", "grpo")}
        later = wait_for(
            chrome, lambda s: s["points"]["acc"] >= first["points"]["acc"] + 6, 30, "the accuracy plot to grow"
        )
        assert later["polls"] > first["polls"]
        assert writer.wait(timeout=60) == 0
        done = wait_for(
            chrome,
            lambda s: "finished" in s["flags"][sao] and "crashed" in s["flags"][grpo],
            20,
            "the finished / nan / crashed flags",
        )
        assert set(done["flags"][grpo].split()) == {"nan", "crashed"}
        assert done["flags"][sao] == "finished"
        assert done["points"]["acc"] == 45 + 30
        assert done["points"]["critic/explained_var"] == 45  # only sao has a critic
        assert done["points"]["dis/kept_frac"] == 45  # grpo has no DIS
        assert all(u.startswith(srv.url) for u in done["resources"]), done["resources"]  # nothing off-site
        shot = chrome.screenshot(full_page=True)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "monitor.png").write_bytes(shot)
        assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
    finally:
        browser.close()
        srv.shutdown()
        srv.server_close()
        if writer is not None and writer.poll() is None:
            writer.kill()
            writer.wait()


@contextlib.contextmanager
def monitor_of_finished_runs(tmp_path, steps):
    "The monitor, served from this process, over two finished fake runs (sao and grpo, seed 0) of `steps` steps."
    logs = tmp_path / "runs"
    logs.mkdir()
    subprocess.run(
        fake_runs_cmd(logs, steps, 0),
        check=True,
    )
    srv = serve_in_thread(logs, port=0, refresh_s=0.5)
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def monitor_screenshot_command():
    "The monitor notebook's screenshot command (its docs page, under 'Watching runs live'), as argv."
    import json
    import shlex

    nb = json.loads((HERE.parent / "nbs" / "67_monitor.ipynb").read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    block = text.split("## Watching runs live", 1)[1]
    line = next(l for l in block.replace("\\\n", " ").splitlines() if l.startswith("chromium ") and "--screenshot" in l)
    return shlex.split(line)


def test_documented_screenshot_command_waits_for_the_data(tmp_path):
    "The documented chromium command, pointed at a monitor over finished runs, shows their curves, not 'loading'."
    from PIL import Image

    with monitor_of_finished_runs(tmp_path, 60) as srv:
        argv = monitor_screenshot_command()
        assert any(a.startswith("--virtual-time-budget=") for a in argv)
        png = tmp_path / "monitor.png"
        argv = [CHROMIUM] + [
            f"--screenshot={png}" if a.startswith("--screenshot=") else srv.url if a.startswith("http") else a
            for a in argv[1:]
        ]
        with tempfile.TemporaryDirectory() as prof:
            subprocess.run(argv + [f"--user-data-dir={prof}"], check=True, timeout=120, capture_output=True)
    im = Image.open(png).convert("RGB")
    counts = {c: n for n, c in im.getcolors(1 << 24)}
    for s in ("sao", "grpo"):  # the smoothed lines, in the setting's colour
        assert counts.get(rgb(setting_color(s)), 0) > 500, s


@pytest.mark.slow
def test_monitor_page_follows_a_real_testbed_run(tmp_path):
    """The same, with a real (tiny) `sao-repro run` on the CPU testbed writing the logs."""
    pytest.importorskip("sao_repro.mini.cli")
    logs = tmp_path / "runs"
    logs.mkdir()
    srv = serve_in_thread(logs, port=0, refresh_s=0.5)
    browser = contextlib.ExitStack()
    run = None
    try:
        chrome = browser.enter_context(open_page())
        chrome.goto(srv.url)
        t0 = (
            time.monotonic()
        )  # the page polls before the run starts: a loaded machine's slow browser start cannot miss it
        while time.monotonic() - t0 < 60 and not ((chrome.evaluate(STATE_JS) or {}).get("polls", 0) >= 1):
            time.sleep(0.2)
        run = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from sao_repro.mini.cli import run_main; sys.exit(run_main(sys.argv[1:]))",
                "--setting",
                "sao",
                "--out",
                str(logs),
                "--preset",
                "smoke",
                "--trajectories-per-step",
                "16",
                "--eval-every",
                "10",
                "--n-eval",
                "32",
                "--ckpt-every",
                "30",
                "--steps",
                "60",
                "--threads",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        name = "mini/sao/seed0"
        seen = []
        metrics = logs / "mini" / "sao" / "seed0" / "metrics.jsonl"
        t0 = time.monotonic()
        while (
            time.monotonic() - t0 < 180
            and run.poll() is None
            and not (metrics.is_file() and len(metrics.read_bytes().splitlines()) >= 3)
        ):
            time.sleep(0.05)
        assert run.poll() is None, f"the run ended before it was part-way: {run.stderr.read()}"
        os.killpg(run.pid, signal.SIGSTOP)  # held part-way (the run and its kernel) until the page has shown it so:
        try:  # the page must follow a running run on a machine of any speed, not catch it by luck
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:
                s = chrome.evaluate(STATE_JS)
                if s and name in s["flags"]:
                    seen.append((s["points"].get("rollout/resp_len", 0), s["flags"][name]))
                    if 0 < seen[-1][0] < 60:
                        break
                time.sleep(0.5)
        finally:
            os.killpg(run.pid, signal.SIGCONT)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            s = chrome.evaluate(STATE_JS)
            if s and name in s["flags"]:
                seen.append((s["points"].get("rollout/resp_len", 0), s["flags"][name]))
                if "finished" in s["flags"][name]:
                    break
            time.sleep(0.5)
        assert run.wait(timeout=60) == 0, run.stderr.read()
        assert seen and seen[-1][0] == 60, seen[-5:]
        flags = set(seen[-1][1].split())
        from sao_repro.metrics.health import SAO_FLAGS

        assert "finished" in flags and flags - {"finished"} <= set(SAO_FLAGS), flags  # no crash, NaN or OOM flag
        ms = [json.loads(l) for l in (logs / "mini" / "sao" / "seed0" / "metrics.jsonl").read_text().splitlines()]
        degenerate = any(m.get("critic/returns_std", 1.0) <= 1e-12 for m in ms)  # a batch whose returns were all equal
        assert ("degenerate_returns" in flags) == degenerate, (flags, degenerate)
        growing = sorted({p for p, f in seen if 0 < p < 60})
        assert growing, f"never saw the run part-way: {seen}"  # the page updated while the run was going
        assert any(
            "finished" not in f.split() and set(f.split()) <= set(SAO_FLAGS)  # running: not finished, at most a
            for p, f in seen
            if p < 60
        )  # health flag, before it finished
        shot = chrome.screenshot()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "monitor_testbed.png").write_bytes(shot)
    finally:
        browser.close()
        srv.shutdown()
        srv.server_close()
        if run is not None and run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def test_monitor_page_shows_a_starved_critic_flag(tmp_path):
    "A synthetic starved-critic run (critic grad norm 7 against its clip 1 from step 3): the page shows the flag, visibly."
    d = tmp_path / "runs" / "mini" / "sao" / "seed0"
    d.mkdir(parents=True)
    rows = [
        {"step": s, "acc": 0.5, "critic/grad_norm": 7.0 if s > 2 else 0.5, "critic/grad_clip": 1.0} for s in range(1, 9)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    healthy = tmp_path / "runs" / "mini" / "sao" / "seed1"
    healthy.mkdir(parents=True)
    (healthy / "metrics.jsonl").write_text("".join(json.dumps({**r, "critic/grad_norm": 0.5}) + "\n" for r in rows))
    srv = serve_in_thread(tmp_path / "runs", port=0, refresh_s=0.5)
    try:
        with open_page() as chrome:
            chrome.goto(srv.url)
            state = wait_for(chrome, lambda s: len(s["flags"]) == 2, 30, "both runs in the table")
            assert "critic_starved" in state["flags"]["mini/sao/seed0"].split()
            assert "critic_starved" not in state["flags"]["mini/sao/seed1"].split()
            flag = chrome.locator('#runs tr[data-run="mini/sao/seed0"] span.flag-critic_starved')
            assert flag.is_visible() and flag.inner_text() == "critic_starved"
            assert flag.get_attribute("title") == "critic_starved since step 5"  # steps 3, 4, 5 over the clip
            box = flag.bounding_box()
            assert box and box["width"] > 10 and box["height"] > 5
            assert chrome.locator('#runs tr[data-run="mini/sao/seed1"] span.flag-critic_starved').count() == 0
    finally:
        srv.shutdown()
        srv.server_close()


AXES_JS = """() => [...document.querySelectorAll('#charts .chart')].map(box => {
  const r = e => { const b = e.getBoundingClientRect(); return {l: b.left, r: b.right, t: b.top, b: b.bottom, w: b.width, h: b.height}; };
  const ink = e => { const g = document.createRange(); g.selectNodeContents(e); return r(g); };  // where the text itself is
  const c = box.querySelector('canvas'), x = box.querySelector('.axis-x'), y = box.querySelector('.axis-y');
  const seen = e => e && getComputedStyle(e).visibility === 'visible' && getComputedStyle(e).display !== 'none' && +getComputedStyle(e).opacity > 0;
  return {metric: c.dataset.metric, points: +c.dataset.points, canvas: r(c), title: r(box.querySelector('h2')),
          x: x && {text: x.textContent, box: ink(x), seen: seen(x), font: parseFloat(getComputedStyle(x).fontSize),
                   color: getComputedStyle(x).color},
          y: y && {text: y.textContent, box: ink(y), seen: seen(y), font: parseFloat(getComputedStyle(y).fontSize),
                   color: getComputedStyle(y).color}};
})"""


def _apart(a, b):
    "Two boxes that do not overlap."
    return a["r"] <= b["l"] + 0.5 or b["r"] <= a["l"] + 0.5 or a["b"] <= b["t"] + 0.5 or b["b"] <= a["t"] + 0.5


@pytest.mark.parametrize("width", [1400, 700])
def test_every_chart_names_its_axes(tmp_path, width):
    "Each chart has an x-axis title (training step) and a y-axis title with its unit, shown as text beside the plot."
    from sao_repro.monitor.page import CHARTS

    with monitor_of_finished_runs(tmp_path, 30) as srv, open_page(width, 1500) as chrome:
        chrome.goto(srv.url)
        wait_for(chrome, lambda s: s["points"].get("acc", 0) == 60, 30, "both runs' accuracy")
        charts = chrome.evaluate(AXES_JS)
        shot = chrome.screenshot(full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"monitor_axes_{width}.png").write_bytes(shot)
    assert [c["metric"] for c in charts] == [s["metric"] for s in CHARTS]
    for c, spec in zip(charts, CHARTS):
        x, y, plot = c["x"], c["y"], c["canvas"]
        assert c["points"] > 0, c["metric"]  # a chart with its data drawn
        assert x and y, f"{c['metric']}: an axis title is missing"
        assert x["text"] == spec["xlabel"] == "training step"
        assert y["text"] == spec["ylabel"] and re.search(r"\(.+\)$", y["text"]), y["text"]  # the unit, in brackets
        for t in (x, y):
            assert t["seen"] and t["font"] >= 11 and t["color"] != "rgb(255, 255, 255)", (c["metric"], t)
        assert x["box"]["w"] > 3 * x["box"]["h"] > 20, (c["metric"], x["box"])  # a line of text across ...
        assert y["box"]["h"] > 3 * y["box"]["w"] > 20, (c["metric"], y["box"])  # ... and one turned upright
        # x below the plot, within its width; y left of it, turned (taller than wide), within its height
        assert (
            x["box"]["t"] >= plot["b"] - 0.5 and plot["l"] - 0.5 <= x["box"]["l"] and x["box"]["r"] <= plot["r"] + 0.5
        )
        assert y["box"]["r"] <= plot["l"] + 0.5, (c["metric"], y["box"], plot)
        assert plot["t"] - 0.5 <= y["box"]["t"] and y["box"]["b"] <= plot["b"] + 0.5, (c["metric"], y["box"], plot)
        boxes = [plot, x["box"], y["box"], c["title"]]
        assert all(_apart(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]), c["metric"]  # nothing drawn over
