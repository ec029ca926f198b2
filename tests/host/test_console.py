"""The web console in a real Chromium (Debian's chromium and chromium-driver, driven by Selenium)
against a real ``qinglong run`` over TCP: sign-in with a session cookie and CSRF token, the views,
run now, a Run's page and log, cancel, sign-out, what a read token is offered, cross-site posts,
and values shown as text. Screenshots at 1280 and 375 px go to the test's tmp dir (and are copied
to /tmp/console-shots/)."""

from __future__ import annotations

import http.client
import json
import re
import shutil
from pathlib import Path

import pytest

from api_helpers import Client, Plane, api_settings, cli, make_token
from host_helpers import wait_until

SHOTS = Path("/tmp/console-shots")
XSS_LOG = "<script>window.__qinglong_xss = 1</script>"


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    assert chromium and driver_path, "chromium and chromium-driver are needed: .ci/install-system-deps installs them"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--no-first-run", "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver, tmp_path: Path, name: str, width: int) -> Path:
    driver.set_window_size(width, 900)
    wait_until(lambda: driver.execute_script("return window.innerWidth") == width or None,
               f"the window to be {width} px wide", timeout=30, every=0.05)
    folder = tmp_path / "shots"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}-{width}.png"
    driver.save_screenshot(str(path))
    SHOTS.mkdir(exist_ok=True)
    shutil.copy(path, SHOTS / path.name)
    # usable on a phone: nothing but a table's own scroller is wider than the window
    overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, (name, width, overflow)
    return path


def _visible(driver, css: str, what: str):
    from selenium.webdriver.common.by import By

    from selenium.common.exceptions import StaleElementReferenceException

    def found():
        try:  # a Run's page is drawn again while the Run runs
            for element in driver.find_elements(By.CSS_SELECTOR, css):
                if element.is_displayed():
                    return element
        except StaleElementReferenceException:
            pass
        return None
    return wait_until(found, what, timeout=60, every=0.1)


def _sign_in(driver, port: int, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"http://127.0.0.1:{port}/")
    field = _visible(driver, "#token", "the sign-in form")
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#signin button[type=submit]").click()
    _visible(driver, "#nav", "the console after sign-in")


def _sign_out(driver) -> None:
    _visible(driver, "#signout", "the sign-out button").click()
    _visible(driver, "#token", "the sign-in form after sign-out")


def _text_of(driver, css: str, expected: str, what: str):
    from selenium.webdriver.common.by import By

    from selenium.common.exceptions import StaleElementReferenceException

    def found():
        try:  # a Run's page is drawn again while the Run runs
            elements = driver.find_elements(By.CSS_SELECTOR, css)
            return elements[0] if elements and expected in elements[0].text else None
        except StaleElementReferenceException:
            return None
    return wait_until(found, what, timeout=60, every=0.1)


def _alert(driver):
    from selenium.common.exceptions import NoAlertPresentException

    try:
        alert = driver.switch_to.alert
        alert.text
        return alert
    except NoAlertPresentException:
        return None


def _session_cookie(driver) -> dict:
    (cookie,) = [c for c in driver.get_cookies() if c["name"] == "qinglong_session"]
    return cookie


def test_sign_in_run_now_follow_the_run_and_its_log_then_sign_out(tmp_path, browser):
    """Without this a browser cannot open the control plane at all, a Run started from a phone has
    no page, a log line holding markup runs as script in the operator's session, and a session
    outlives its sign-out."""
    from selenium.webdriver.common.by import By

    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "hello", "--", "sh", "-c", f"echo '{XSS_LOG}'; echo done")
    runner = make_token(settings, "runner", "run")
    plane = Plane(settings)
    try:
        port = plane.port
        # the first page: shell, script and style, all from the package, under 150 KB, no inline script
        weight = 0
        for path in ("/", "/console/app.js", "/console/app.css"):
            status, body, response = plane.get(path)
            assert status == 200, (path, status)
            csp = response.getheader("Content-Security-Policy")
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
            weight += len(body.encode())
        assert weight < 150 * 1024, weight
        assert not re.search(r"<script(?![^>]*\bsrc=)", plane.get("/")[1]), "an inline script in the shell"

        _sign_in(browser, port, runner)
        cookie = _session_cookie(browser)
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["secure"] is False
        assert runner not in browser.current_url and runner not in browser.page_source
        assert browser.execute_script("return document.cookie") == "", "the session cookie is readable by script"
        _text_of(browser, "#verdict", "", "the overview's verdict")
        _shot(browser, tmp_path, "overview", 1280)

        browser.get(f"http://127.0.0.1:{port}/#/tasks")
        button = _visible(browser, "button.run-now[data-task=hello]", "the task's run-now button")
        assert XSS_LOG in browser.find_element(By.CSS_SELECTOR, "#view table").text  # its command, as text
        _shot(browser, tmp_path, "tasks", 1280)
        _shot(browser, tmp_path, "tasks", 375)
        browser.set_window_size(1280, 900)
        button.click()
        _text_of(browser, "#run-state", "succeeded", "the Run's page to show it succeeded")
        log = _text_of(browser, "#log", "done", "the Run's log")
        assert XSS_LOG in log.text
        assert browser.find_elements(By.CSS_SELECTOR, "#log script, #view script") == []
        assert browser.execute_script("return window.__qinglong_xss === undefined") is True
        run_id = browser.find_element(By.CSS_SELECTOR, "#run-id").text
        attempts = browser.find_element(By.CSS_SELECTOR, "#view table").text
        assert "succeeded" in attempts and " 0 " in f" {attempts} "  # the Attempt and its exit code
        _shot(browser, tmp_path, "run", 1280)
        _shot(browser, tmp_path, "run", 375)
        browser.set_window_size(1280, 900)

        browser.get(f"http://127.0.0.1:{port}/#/runs?state=succeeded&task=hello")
        _visible(browser, f"a[href='#/run/{run_id}']", "the Run in the filtered list")
        _shot(browser, tmp_path, "runs", 1280)
        _shot(browser, tmp_path, "runs", 375)
        browser.set_window_size(1280, 900)

        _sign_out(browser)
        assert [c for c in browser.get_cookies() if c["name"] == "qinglong_session"] == []
        # the session is over on the server too, not only forgotten by this browser
        status, _, _ = Client(port).request("GET", "/console/session",
                                            headers={"Cookie": f"qinglong_session={cookie['value']}"})
        assert status == 401
        browser.refresh()
        _visible(browser, "#token", "the sign-in form after a reload")
    finally:
        plane.stop()


def test_a_read_token_is_offered_no_changing_control_and_run_token_cancels(tmp_path, browser):
    """A console offering a read token run-now and cancel buttons that then fail teaches operators
    to ignore errors; a run token that cannot cancel a running Run from the console leaves it
    running."""
    from selenium.webdriver.common.by import By

    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "long", "--", "sleep", "120")
    reader = make_token(settings, "reader", "read")
    runner = make_token(settings, "runner", "run")
    plane = Plane(settings)
    client = Client(plane.port, runner)
    try:
        status, started, _ = client.request("POST", "/api/v1/projects/ops/tasks/long/runs")
        assert status == 201
        run_id = started["run_id"]
        wait_until(lambda: client.request("GET", f"/api/v1/runs/{run_id}")[1]["state"] == "running" or None,
                   "the long Run to be running", timeout=60, every=0.1, alive=plane.process)

        _sign_in(browser, plane.port, reader)
        browser.get(f"http://127.0.0.1:{plane.port}/#/tasks")
        _visible(browser, ".task-name", "the task list")
        assert browser.find_elements(By.CSS_SELECTOR, "button.run-now") == []
        browser.get(f"http://127.0.0.1:{plane.port}/#/run/{run_id}")
        _text_of(browser, "#run-state", "running", "the running Run's page")
        assert browser.execute_script("return document.querySelectorAll('#view button').length") == 0
        _shot(browser, tmp_path, "run-read-token", 375)
        _sign_out(browser)

        _sign_in(browser, plane.port, runner)
        browser.get(f"http://127.0.0.1:{plane.port}/#/run/{run_id}")
        _text_of(browser, "#run-state", "running", "the running Run's page")
        # clicked in the page: the page is drawn again every second while the Run runs
        browser.execute_script("document.getElementById('cancel').click()")
        wait_until(lambda: _alert(browser), "the cancel confirmation", timeout=30, every=0.05).accept()
        _text_of(browser, "#run-state", "cancelled", "the Run cancelled from the console")
        assert client.request("GET", f"/api/v1/runs/{run_id}")[1]["state"] == "cancelled"
    finally:
        client.close()
        plane.stop()


def test_a_cross_site_form_post_and_a_missing_csrf_token_are_refused(tmp_path, browser):
    """Without SameSite and the CSRF token any page the operator visits could start or cancel Runs
    with the operator's session; a sign-in posted from another site would plant a session; a
    session outliving its token's revocation would keep a stolen browser in."""
    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "hello", "--", "true")
    runner = make_token(settings, "runner", "run")
    plane = Plane(settings)
    client = Client(plane.port, runner)
    try:
        port = plane.port
        _sign_in(browser, port, runner)
        cookie = _session_cookie(browser)["value"]
        target = f"http://127.0.0.1:{port}/api/v1/projects/ops/tasks/hello/runs"
        # a page of another site posts a form at the API with the operator's browser
        browser.get("data:text/html,<form id=f method=post action='" + target + "'>"
                    "<input name=x value=1></form><p id=ready>ready</p>")
        _visible(browser, "#ready", "the other site's page")
        browser.execute_script("document.getElementById('f').submit()")
        answer = wait_until(lambda: (browser.current_url.startswith("http://127.0.0.1") and
                                     "error" in browser.page_source and browser.page_source) or None,
                            "the API's answer to the cross-site form", timeout=60, every=0.1)
        assert '"unauthorized"' in answer or '"csrf"' in answer, answer
        assert client.request("GET", "/api/v1/runs")[1]["runs"] == []

        # the cookie alone (as a same-site attacker would send it) is not enough: the CSRF token is
        # checked on every changing request, and a wrong one is refused as a missing one is
        with_cookie = {"Cookie": f"qinglong_session={cookie}"}
        bare = Client(port)
        for headers in (with_cookie, {**with_cookie, "X-CSRF-Token": "not-the-token"}):
            status, body, _ = bare.request("POST", "/api/v1/projects/ops/tasks/hello/runs", headers=headers)
            assert (status, body["error"]["code"]) == (403, "csrf"), body
        assert client.request("GET", "/api/v1/runs")[1]["runs"] == []
        status, who, _ = bare.request("GET", "/console/session", headers=with_cookie)
        assert status == 200 and who["scope"] == "run" and "token" not in json.dumps(who).replace('"name"', "")
        status, body, _ = bare.request("POST", "/api/v1/projects/ops/tasks/hello/runs",
                                       headers={**with_cookie, "X-CSRF-Token": who["csrf"]})
        assert status == 201, body

        # a sign-in posted by another origin, or as a form, plants no session
        for headers, data in (({"Origin": "http://evil.example", "Content-Type": "application/json"},
                               json.dumps({"token": runner}).encode()),
                              ({"Content-Type": "application/x-www-form-urlencoded"}, f"token={runner}".encode())):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/console/session", body=data, headers=headers)
            response = conn.getresponse()
            response.read()
            assert response.status in (403, 415) and response.getheader("Set-Cookie") is None
            conn.close()
        # the session holds no authority of its own: a revoked token ends it at its next request
        cli(settings, "token", "revoke", "runner")
        status, body, _ = bare.request("GET", "/api/v1/runs", headers=with_cookie)
        assert (status, body["error"]["code"]) == (401, "unauthorized")
        bare.close()
    finally:
        client.close()
        plane.stop()


def test_a_session_idle_too_long_is_gone_and_used_sessions_stay():
    """A session that never expires is a stolen laptop's open door; one that expires while in use
    signs an operator out mid-task."""
    from qinglong.host.http.console import Sessions

    now = [0]
    sessions = Sessions(idle_ms=1000, clock_ms=lambda: now[0], limit=2)
    kept, _ = sessions.create("d1")
    idle, _ = sessions.create("d2")
    now[0] = 900
    assert sessions.get(kept) is not None
    now[0] = 1500
    assert sessions.get(kept) is not None  # used at 900: idle 600 ms
    assert sessions.get(idle) is None  # unused since 0
    third, _ = sessions.create("d3")
    fourth, _ = sessions.create("d4")
    assert len(sessions) == 2 and sessions.get(kept) is None  # bounded: the least recently used went
