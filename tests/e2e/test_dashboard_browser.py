"""The dashboard in a real headless Chromium: the login form, then the live page, which must load with
no console error and show the numbers ``/v1/hosts`` gives for the same fleet."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .cdp import Browser, find_chromium, in_ci
from .procs import Proc, serve_sim

TOKEN = "e2e-dashboard-token-0123456789"
HOSTS = 4
SANDBOXES = 7
# A screenshot of the seeded page is kept here when set (how docs/dashboard.png is made).
SCREENSHOT_ENV = "CORRAL_DASHBOARD_SCREENSHOT"


@pytest.fixture
def chromium() -> str:
    binary = find_chromium()
    if binary is None:
        if in_ci():
            pytest.fail("chromium is not installed (make system-deps installs it); CI must run this test")
        pytest.skip("chromium is not installed (make system-deps installs it)")
    return binary


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Proc]:
    # readings never replace reserves here, so each host's admittable holds still while compared
    with serve_sim(tmp_path, TOKEN, HOSTS, "--memory-settle-s", "100000") as proc:
        yield proc


def api_hosts(http: httpx.Client) -> dict[str, dict[str, object]]:
    hosts = http.get("/v1/hosts").json()["hosts"]
    return {
        h["id"]: {
            "state": h["state"],
            "sandboxes": str(h["sandboxes"]),
            "memory_mb_admittable": str(h["memory_mb_admittable"]),
            "reserved_mb": str(h["reserved_mb"]),
        }
        for h in hosts
    }


PAGE_HOSTS = """(() => {
  const out = {};
  for (const tr of document.querySelectorAll('#hosts tbody tr')) {
    const cell = (k) => tr.querySelector(`td[data-k="${k}"]`).textContent;
    out[tr.dataset.host] = {state: cell('state'), sandboxes: cell('sandboxes'),
      memory_mb_admittable: cell('memory_mb_admittable'), reserved_mb: cell('reserved_mb')};
  }
  return out;
})()"""


def test_dashboard_in_chromium_shows_the_fleet(chromium: str, fleet: Proc, tmp_path: Path) -> None:
    http = httpx.Client(base_url=fleet.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    for _ in range(SANDBOXES):
        assert http.post("/v1/sandboxes", json={"memory_mb": 1024}).status_code == 201
    # wait until heartbeats confirm every reservation: the fleet then holds still
    deadline = time.monotonic() + 30
    while any(h["reserved_mb"] for h in http.get("/v1/hosts").json()["hosts"]):
        assert time.monotonic() < deadline, "reservations were never confirmed"
        time.sleep(0.2)

    browser = Browser(chromium)
    try:
        browser.open(f"{fleet.url}/dashboard")
        browser.wait_for("document.querySelector('form[action=\"/dashboard/login\"]') !== null")
        # a wrong token is turned away at the form
        browser.evaluate(
            "document.getElementById('token').value = 'not-the-token-0123456789';"
            "document.querySelector('form').submit(); true"
        )
        browser.wait_for(
            "document.querySelector('.error') && document.querySelector('.error').textContent.length > 0"
        )
        browser.events.clear()  # that refusal's 401 was the point; from here on, no error is
        browser.evaluate(
            f"document.getElementById('token').value = {TOKEN!r}; document.querySelector('form').submit(); true"
        )
        browser.wait_for("Number(document.body.dataset.loaded || 0) >= 2")
        seen: object = None
        expected: object = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            expected = api_hosts(http)
            seen = browser.evaluate(PAGE_HOSTS)
            if seen == expected:
                break
            time.sleep(0.5)
        assert seen == expected
        assert browser.evaluate("document.getElementById('f-hosts').textContent") == str(HOSTS)
        assert browser.evaluate("document.getElementById('f-sandboxes').textContent") == str(SANDBOXES)
        # the charts drew: uPlot made a canvas for each
        assert browser.evaluate("document.querySelectorAll('.charts canvas').length") >= 5
        # the cookie is HttpOnly: page script cannot read it
        assert "corral_dashboard" not in browser.evaluate("document.cookie")
        errors = browser.console_errors()
        assert errors == [], errors
        shot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "dashboard.png")
        browser.screenshot(shot)
        assert shot.stat().st_size > 1000
    finally:
        browser.close()
