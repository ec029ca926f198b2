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
from http_helpers import child_env

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


#: The Run links a view shows, read in one script.
_RUN_LINKS = "return Array.from(document.querySelectorAll(\"a[href^='#/run/']\")).map(a => a.getAttribute('href'))"


def _texts(driver, css: str) -> list[str]:
    """The texts of the elements ``css`` selects, read in one script so that a view drawn again
    between two reads cannot leave a stale element behind."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText.trim())", css)


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
        assert browser.find_elements(By.CSS_SELECTOR, "#new-task, .edit-task, .delete-task") == []
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
    signs an operator out mid-task; an idle session left counted would fill the console for good,
    and one principal's sign-in that ended another's would let any token sign the admin out."""
    import pytest

    from qinglong.host.http.console import Sessions, SessionsFull

    now = [0]
    sessions = Sessions(idle_ms=1000, clock_ms=lambda: now[0], limit=3, per_principal=2)
    kept, _ = sessions.create("a", "d1")
    idle, _ = sessions.create("b", "d2")
    now[0] = 900
    assert sessions.get(kept) is not None
    now[0] = 1500
    assert sessions.get(kept) is not None  # used at 900: idle 600 ms
    assert sessions.get(idle) is None  # unused since 0
    first, _ = sessions.create("c", "d3")
    second, _ = sessions.create("c", "d3")
    third, _ = sessions.create("c", "d3")  # past c's own bound: c's least recently used went
    assert len(sessions) == 3 and sessions.get(first) is None and sessions.get(kept) is not None
    with pytest.raises(SessionsFull):  # full: refused, nobody signed out
        sessions.create("d", "d4")
    assert all(sessions.get(s) is not None for s in (kept, second, third))
    now[0] = 3000  # idle ones are swept before a sign-in is refused
    fourth, _ = sessions.create("d", "d4")
    assert len(sessions) == 1 and sessions.get(fourth) is not None


def _type(element, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    element.send_keys(Keys.CONTROL, "a")
    element.send_keys(Keys.DELETE)
    element.send_keys(text)


def _run_log(client: Client, project: str, task: str) -> str:
    """Run the task through the API, wait for its end and answer its log."""
    status, started, _ = client.request("POST", f"/api/v1/projects/{project}/tasks/{task}/runs")
    assert status == 201, started
    run_id = started["run_id"]
    wait_until(lambda: client.request("GET", f"/api/v1/runs/{run_id}")[1]["state"] == "succeeded" or None,
               f"the Run of {task} to succeed", timeout=60, every=0.1)
    status, log, _ = client.request("GET", f"/api/v1/runs/{run_id}/log")
    return log.decode() if isinstance(log, bytes) else str(log)


def test_tasks_and_triggers_are_created_edited_toggled_and_deleted_in_the_console(tmp_path, browser):
    """Without this a task or trigger can be made only from a shell; an edit that reads env values
    back would put secrets in the page (or, written back masked, replace them with the mask); a
    delete without a confirmation loses a task to one stray click; a cron typo is found only
    when the trigger never fires."""
    from selenium.webdriver.common.by import By

    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    writer = make_token(settings, "writer", "write")
    plane = Plane(settings)
    client = Client(plane.port, writer)
    port = plane.port
    try:
        _sign_in(browser, port, writer)
        browser.get(f"http://127.0.0.1:{port}/#/tasks")
        _visible(browser, "#new-task", "the new-task link").click()
        _type(_visible(browser, "#t-task", "the task form"), "backup")
        _type(browser.find_element(By.ID, "t-command"), "sh\n-c\necho \"$GREETING $TOKEN\"")
        for name, value in (("GREETING", "hello-kept"), ("TOKEN", "first-secret")):
            browser.find_element(By.ID, "env-add").click()
            row = browser.find_elements(By.CSS_SELECTOR, "#env-list .env-row")[-1]
            row.find_element(By.CSS_SELECTOR, ".env-name").send_keys(name)
            row.find_element(By.CSS_SELECTOR, ".env-value").send_keys(value)
        _type(browser.find_element(By.ID, "t-timeout"), "90")
        _type(browser.find_element(By.ID, "t-attempts"), "2")
        browser.find_element(By.ID, "t-labels").send_keys("linux")
        _shot(browser, tmp_path, "task-form", 375)
        browser.set_window_size(1280, 900)
        browser.find_element(By.ID, "task-save").click()
        _visible(browser, "button.run-now[data-task=backup]", "the new task in the list")
        status, shown, _ = client.request("GET", "/api/v1/projects/ops/tasks/backup")
        assert shown["execution"]["env"] == {"GREETING": "(set)", "TOKEN": "(set)"}
        assert (shown["execution"]["timeout_ms"], shown["execution"]["retry"]["max_attempts"],
                shown["execution"]["labels"]) == (90_000, 2, ["linux"])
        assert _run_log(client, "ops", "backup").strip() == "hello-kept first-secret"

        # edit: the form never holds a value; one is kept by name, one replaced
        browser.get(f"http://127.0.0.1:{port}/#/tasks")
        _visible(browser, "a.edit-task[data-task=backup]", "the task's edit link").click()
        _visible(browser, "#env-list .env-row[data-kept=TOKEN]", "the task's env names")
        assert "hello-kept" not in browser.page_source and "first-secret" not in browser.page_source
        assert browser.execute_script(
            "return Array.from(document.querySelectorAll('.env-value')).map(e => e.value).join('')") == ""
        browser.find_element(By.CSS_SELECTOR, ".env-row[data-kept=TOKEN] .env-value").send_keys("second-secret")
        _type(browser.find_element(By.ID, "t-timeout"), "120")
        browser.find_element(By.ID, "task-save").click()
        _visible(browser, "button.run-now[data-task=backup]", "the task list after the edit")
        status, shown, _ = client.request("GET", "/api/v1/projects/ops/tasks/backup")
        assert shown["task_revision"] == 2 and shown["execution"]["timeout_ms"] == 120_000
        assert _run_log(client, "ops", "backup").strip() == "hello-kept second-secret"

        # a trigger: the next five fire times follow the expression as it is typed
        browser.get(f"http://127.0.0.1:{port}/#/triggers")
        _visible(browser, "#new-trigger", "the new-trigger link").click()
        _type(_visible(browser, "#g-trigger", "the trigger form"), "yearly")
        expression = browser.find_element(By.ID, "g-expression")
        _type(expression, "not a cron")
        _text_of(browser, "#preview-error", "fields", "the preview to refuse a bad expression")
        _type(expression, "0 0 1 1 *")
        previewed = wait_until(lambda: (lambda t: t if len(t) == 5 else None)(_texts(browser, "#preview li")),
                               "five fire times previewed", timeout=60, every=0.1)
        years = [text[:10] for text in previewed]
        assert all(y.endswith("-01-01") for y in years) and len(set(years)) == 5, years
        assert browser.find_element(By.ID, "preview-error").text == ""
        _shot(browser, tmp_path, "trigger-form", 375)
        browser.set_window_size(1280, 900)
        browser.find_element(By.ID, "trigger-save").click()
        _text_of(browser, ".trigger-state[data-trigger=yearly]", "enabled", "the new trigger, enabled")
        assert client.request("GET", "/api/v1/projects/ops/triggers/yearly")[1]["spec"]["expression"] == "0 0 1 1 *"

        # the task list: last outcome, success ratio and the next fire time
        browser.get(f"http://127.0.0.1:{port}/#/tasks")
        _text_of(browser, ".last-outcome", "succeeded", "the task's last outcome")
        assert browser.find_element(By.CSS_SELECTOR, ".ratio").text == "2/2 (100 %)"
        assert browser.find_element(By.CSS_SELECTOR, ".next-fire").text.endswith("-01-01 00:00:00")
        _shot(browser, tmp_path, "tasks-list", 1280)

        browser.get(f"http://127.0.0.1:{port}/#/triggers")
        _visible(browser, "button.toggle[data-trigger=yearly]", "the disable button").click()
        _text_of(browser, ".trigger-state[data-trigger=yearly]", "disabled", "the trigger disabled")
        assert client.request("GET", "/api/v1/projects/ops/triggers/yearly")[1]["enabled"] is False
        _visible(browser, "button.toggle[data-trigger=yearly]", "the enable button").click()
        _text_of(browser, ".trigger-state[data-trigger=yearly]", "enabled", "the trigger enabled again")
        _visible(browser, "a.edit-trigger", "the trigger's edit link").click()
        _type(_visible(browser, "#g-expression", "the trigger's edit form"), "30 6 * * 1")
        wait_until(lambda: (lambda t: len(t) == 5 and "06:30:00" in t[0])(_texts(browser, "#preview li")) or None,
                   "the edited expression previewed", timeout=60, every=0.1)
        browser.find_element(By.ID, "trigger-save").click()
        _text_of(browser, ".trigger-state[data-trigger=yearly]", "enabled", "the trigger list after the edit")
        edited = client.request("GET", "/api/v1/projects/ops/triggers/yearly")[1]
        assert (edited["spec"]["expression"], edited["trigger_revision"]) == ("30 6 * * 1", 4)  # disable, enable, edit

        _visible(browser, "button.delete-trigger", "the trigger's delete button").click()
        wait_until(lambda: _alert(browser), "the delete confirmation", timeout=30, every=0.05).accept()
        wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, ".trigger-name") == [] or None,
                   "the trigger gone from the list", timeout=60, every=0.1)
        assert client.request("GET", "/api/v1/projects/ops/triggers")[1] == []

        # a task's delete asks first: dismissed, nothing goes
        browser.get(f"http://127.0.0.1:{port}/#/tasks")
        _visible(browser, "button.delete-task[data-task=backup]", "the delete button").click()
        wait_until(lambda: _alert(browser), "the delete confirmation", timeout=30, every=0.05).dismiss()
        assert client.request("GET", "/api/v1/projects/ops/tasks/backup")[0] == 200
        _visible(browser, "button.delete-task[data-task=backup]", "the delete button").click()
        wait_until(lambda: _alert(browser), "the delete confirmation", timeout=30, every=0.05).accept()
        wait_until(lambda: client.request("GET", "/api/v1/projects/ops/tasks/backup")[0] == 404 or None,
                   "the task deleted", timeout=60, every=0.1)
    finally:
        client.close()
        plane.stop()


def _iso_ms(ms: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def test_a_running_log_is_followed_live_runs_filter_by_time_and_a_run_runs_again(tmp_path, browser):
    """Without a followed log an operator watching a long job sees its output only by reloading;
    a log followed and fetched again shows lines twice; without a time filter a failure of last
    night is lost among today's Runs; without run-again a failed Run is retried only from the
    task list."""
    from selenium.webdriver.common.by import By

    settings = api_settings(tmp_path)
    go = tmp_path / "go"
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "slow", "--", "sh", "-c",
        f"echo first; while [ ! -e '{go}' ]; do sleep 0.05; done; echo second")
    runner = make_token(settings, "runner", "run")
    plane = Plane(settings)
    client = Client(plane.port, runner)
    port = plane.port
    try:
        _sign_in(browser, port, runner)
        browser.get(f"http://127.0.0.1:{port}/#/tasks")
        _visible(browser, "button.run-now[data-task=slow]", "the run-now button").click()
        _text_of(browser, "#log", "first", "the first line while the Run runs")
        _text_of(browser, "#run-state", "running", "the page to show the Run running")
        first_id = _texts(browser, "#run-id")[0]  # the page is drawn again each second while it runs
        _shot(browser, tmp_path, "log-follow", 375)
        browser.set_window_size(1280, 900)
        go.touch()
        _text_of(browser, "#run-state", "succeeded", "the Run to end")
        _text_of(browser, "#log", "second", "the last line, as it came")
        assert browser.find_element(By.CSS_SELECTOR, "#log").text == "first\nsecond"
        # followed as one stream from the API (listed once it ended), not fetched again each second
        streams = wait_until(lambda: browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name).filter(n => n.indexOf('/log') > 0)"),
            "the log stream's entry", timeout=60, every=0.1)
        assert len(streams) == 1 and "follow=1" in streams[0], streams

        _visible(browser, "#run-again", "the run-again button").click()
        # the page is drawn again while it loads: read the id only from a page that held still
        second_id = wait_until(lambda: next((t for t in _texts(browser, "#run-id")
                                             if t not in ("", first_id)), None),
                               "the page of the new Run", timeout=60, every=0.1)
        _text_of(browser, "#run-state", "succeeded", "the second Run to end")
        assert browser.find_element(By.CSS_SELECTOR, "#log").text == "first\nsecond"

        runs = {r["run_id"]: r for r in client.request("GET", "/api/v1/runs")[1]["runs"]}
        assert set(runs) == {first_id, second_id}
        boundary = runs[second_id]["scheduled_for_ms"]
        assert runs[first_id]["scheduled_for_ms"] < boundary
        for field, shown in (("#f-since", second_id), ("#f-until", first_id)):
            browser.get(f"http://127.0.0.1:{port}/#/runs")
            # the unfiltered list drawn (both Runs): typing into the previous view's form, about
            # to be replaced, would filter nothing
            for run_id in (first_id, second_id):
                _visible(browser, f"a[href='#/run/{run_id}']", "the unfiltered Runs")
            other = "#f-until" if field == "#f-since" else "#f-since"
            _type(_visible(browser, other, "the runs filter"), "")
            _type(browser.find_element(By.CSS_SELECTOR, field), _iso_ms(boundary))
            browser.find_element(By.ID, "filter").click()
            # the unfiltered list also shows ``shown`` until the filtered one replaces it
            wait_until(lambda: browser.execute_script(_RUN_LINKS) == [f"#/run/{shown}"] or None,
                       f"only the Run left by {field}", timeout=60, every=0.1)
        _type(browser.find_element(By.ID, "f-since"), "yesterday")
        browser.find_element(By.ID, "filter").click()
        _text_of(browser, "#filter-error", "UTC", "a bad time refused with what is expected")
        status, body, _ = client.request("GET", "/api/v1/runs?since_ms=soon")
        assert (status, body["error"]["field"]) == (422, "since_ms")
    finally:
        client.close()
        plane.stop()


def test_skips_the_audit_log_tokens_and_workers_views(tmp_path, browser):
    """Without these views a skipped Run, who changed what, and which tokens exist are read only on
    the host; a token's secret shown twice (or kept in the page) can be read off a screen later; a
    revoke that does not take keeps a lost phone's token working; a read token offered the admin
    views learns they exist."""
    from selenium.webdriver.common.by import By

    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "single", "--concurrency", "forbid", "--", "sleep", "120")
    cli(settings, "project", "create", "other")
    admin = make_token(settings, "root", "admin")
    reader = make_token(settings, "reader", "read")
    outsider = make_token(settings, "outsider", "read", "other")
    plane = Plane(settings)
    client = Client(plane.port, admin)
    port = plane.port
    try:
        first = client.request("POST", "/api/v1/projects/ops/tasks/single/runs")[1]["run_id"]
        wait_until(lambda: client.request("GET", f"/api/v1/runs/{first}")[1]["state"] == "running" or None,
                   "the first Run running", timeout=60, every=0.1, alive=plane.process)
        second = client.request("POST", "/api/v1/projects/ops/tasks/single/runs")[1]["run_id"]
        wait_until(lambda: client.request("GET", "/api/v1/skips")[1]["run_skips"] or None,
                   "the second Run skipped", timeout=60, every=0.1, alive=plane.process)

        # a token limited to another project sees none of these skips
        assert client.request("GET", "/api/v1/skips", token=outsider)[1] == {"skips": [], "run_skips": []}

        _sign_in(browser, port, reader)
        assert [a.is_displayed() for a in browser.find_elements(By.CSS_SELECTOR, "#nav a.admin")] == [False, False]
        browser.get(f"http://127.0.0.1:{port}/#/skips")
        _visible(browser, f"a[href='#/run/{second}']", "the skipped Run in the skips view")
        browser.get(f"http://127.0.0.1:{port}/#/workers")
        _text_of(browser, "#no-workers", "no workers", "the edge profile's workers view")
        _sign_out(browser)

        _sign_in(browser, port, admin)
        browser.get(f"http://127.0.0.1:{port}/#/skips")
        _text_of(browser, ".skip-reason", "", "the skip's reason")
        _shot(browser, tmp_path, "skips", 375)
        browser.set_window_size(1280, 900)

        browser.get(f"http://127.0.0.1:{port}/#/tokens")
        _type(_visible(browser, "#k-name", "the token form"), "phone")
        browser.find_element(By.CSS_SELECTOR, "#k-scope option[value=run]").click()
        browser.find_element(By.ID, "k-projects").send_keys("ops")
        browser.find_element(By.ID, "token-create").click()
        secret = _visible(browser, "#new-secret", "the new secret, shown once").get_attribute("value")
        assert secret.startswith("qlt_")
        status, who, _ = Client(port).request("GET", "/api/v1/runs?project=ops", token=secret)
        assert status == 200
        _shot(browser, tmp_path, "tokens", 375)
        browser.set_window_size(1280, 900)
        browser.refresh()
        _text_of(browser, ".token-state[data-token=phone]", "active", "the token listed")
        assert secret not in browser.page_source
        _visible(browser, "button.revoke[data-token=phone]", "the revoke button").click()
        wait_until(lambda: _alert(browser), "the revoke confirmation", timeout=30, every=0.05).accept()
        _text_of(browser, ".token-state[data-token=phone]", "revoked", "the token revoked")
        assert Client(port).request("GET", "/api/v1/runs?project=ops", token=secret)[0] == 401
        assert browser.find_elements(By.CSS_SELECTOR, "button.revoke[data-token=root]") == []  # not its own

        browser.get(f"http://127.0.0.1:{port}/#/audit")
        _text_of(browser, "#view table", "token.revoke", "the revoke in the audit log")
        actions = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".audit-action")]
        assert actions[:2] == ["token.revoke", "token.create"] and "task.run" in actions, actions
        _shot(browser, tmp_path, "audit", 1280)
        client.request("POST", f"/api/v1/runs/{first}/cancel")
        wait_until(lambda: client.request("GET", f"/api/v1/runs/{first}")[1]["state"] == "cancelled" or None,
                   "the long Run cancelled", timeout=60, every=0.1, alive=plane.process)
    finally:
        client.close()
        plane.stop()


def _cluster_settings(server, name: str, tmp_path):
    """A migrated database ``name`` on ``server`` with the three roles, and a cluster settings file
    for it with the HTTP surface on a free port."""
    from tests.support import pg

    pg.create_roles(server)
    pg.create_database(server, name)
    dsns = {key: server.dsn(role, pg.ROLE_PASSWORDS[role], name) for key, role in (
        ("runtime_dsn", "qinglong_runtime"), ("admin_dsn", "qinglong_admin"), ("owner_dsn", "qinglong_owner"))}
    settings = tmp_path / "cluster.toml"
    settings.write_text('profile = "cluster"\n[backend]\n' + "".join(f'{k} = "{v}"\n' for k, v in dsns.items())
                        + '[http]\nlisten = "127.0.0.1:0"\n')
    cli(settings, "db", "migrate")
    return settings


def test_the_workers_view_shows_cluster_sessions_labels_and_free_slots(tmp_path, browser):
    """Without it an operator whose queued Runs wait cannot see from the console which workers are
    alive, what labels they offer and how many slots they have free; a slot taken by a claim
    that still reads free sends them looking for a scheduler fault."""
    import psycopg

    from api_helpers import ApiProcessPlane
    from tests.support import pg

    server = pg.start_server("pg18")
    try:
        name = "ql_console_workers"
        settings = _cluster_settings(server, name, tmp_path)
        cli(settings, "project", "create", "ops")
        cli(settings, "task", "put", "ops", "gpu-job", "--label", "gpu", "--", "true")
        cli(settings, "trigger", "add", "ops", "every-second", "--task", "gpu-job", "--cron", "* * * * * *")
        reader = make_token(settings, "reader", "read")
        worker = psycopg.connect(server.dsn("qinglong_gateway", pg.ROLE_PASSWORDS["qinglong_gateway"],
                                            name), autocommit=True)
        plane = ApiProcessPlane(settings)
        try:
            session, generation = worker.execute(
                "SELECT session_id, generation FROM qinglong.worker_open_session('w1', '{gpu,zone=eu-1}', 3, 600000)"
            ).fetchone()
            w2_session, w2_generation = worker.execute(
                "SELECT session_id, generation FROM qinglong.worker_open_session('w2', '{}', 2, 600000)").fetchone()
            _sign_in(browser, plane.port, reader)
            browser.get(f"http://127.0.0.1:{plane.port}/#/workers")
            _text_of(browser, ".worker-state[data-worker=w1]", "live", "the live worker")
            _text_of(browser, "#free-slots", "5 free slots", "the free slots of both workers")
            assert "gpu, zone=eu-1" in browser.find_element(_by_css(), "#view table").text

            # a claim takes a slot of w1; a closed session offers none
            replica = Plane(settings)
            try:
                def claimed():
                    return worker.execute(
                        "SELECT attempt_id FROM qinglong.worker_claim('w1', %s, %s, %s::bytea[])",
                        (session, generation, [b"t" * 32])).fetchall() or None
                wait_until(claimed, "an admitted Run claimed by w1", timeout=60, every=0.1, alive=replica.process)
            finally:
                replica.stop()
            worker.execute("SELECT qinglong.worker_close_session('w2', %s, %s)", (w2_session, w2_generation))
            browser.refresh()
            _text_of(browser, ".worker-state[data-worker=w2]", "closed", "the closed worker")
            _text_of(browser, "#free-slots", "2 free slots", "w1's slots less its claim, none of w2's")
            assert browser.find_element(_by_css(), ".worker-free[data-worker=w1]").text == "2"
            _shot(browser, tmp_path, "workers", 375)
        finally:
            plane.stop()
            worker.close()
    finally:
        server.destroy()


def _by_css():
    from selenium.webdriver.common.by import By

    return By.CSS_SELECTOR


def test_a_console_link_signs_a_browser_in_once_and_the_code_leaves_the_url(tmp_path, browser):
    """Without it the host's operator must make, paste and then revoke a token to open the console;
    a link that worked twice (or after its minutes) is a copied URL that opens the control plane;
    a code left in the address bar or the history is read off the screen or the next visitor's
    back button; a forged code that changed anything lets a guesser write to the store."""
    import time

    from selenium.webdriver.common.by import By

    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    admin = make_token(settings, "root", "admin")
    plane = Plane(settings)
    client = Client(plane.port, admin)
    port = plane.port
    base = f"http://127.0.0.1:{port}"
    try:
        made = json.loads(cli(settings, "console", "link", "--url", base, "--json"))
        url, code = made["url"], made["url"].split("code=", 1)[1]
        assert url.startswith(f"{base}/console/link?code=qlc_") and made["scope"] == "admin"
        stored = b"".join(p.read_bytes() for p in tmp_path.glob("q.db*") if p.is_file())
        assert code.encode() not in stored, "the code is in the store"

        # a link preview's HEAD uses nothing up
        assert Client(port).request("HEAD", url[len(base):])[0] == 405
        browser.get(url)
        _visible(browser, "#nav", "the console, signed in by the link")
        assert browser.current_url == f"{base}/" and code not in browser.page_source
        assert [a.is_displayed() for a in browser.find_elements(By.CSS_SELECTOR, "#nav a.admin")] == [True, True]
        cookie = _session_cookie(browser)
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert browser.execute_script("return document.cookie") == ""
        history = browser.execute_script(
            "return [location.href, history.length, performance.getEntriesByType('navigation')"
            ".map(e => e.name).join(' ')]")
        assert code not in json.dumps(history), history
        _shot(browser, tmp_path, "link-signed-in", 375)
        browser.set_window_size(1280, 900)
        browser.back()  # the page before the link, never the link itself
        assert code not in browser.current_url
        browser.forward()
        _visible(browser, "#nav", "the console again")
        browser.get(f"{base}/#/audit")
        signed_in = _text_of(browser, "#view table", "console.sign_in", "the sign-in in the audit log")
        assert "console link" in signed_in.text and made["link_id"][:8] in signed_in.text
        assert code not in signed_in.text
        entries = client.request("GET", "/api/v1/audit")[1]
        assert [(e["action"], e["object"], e["source"]) for e in entries[:2]] == [
            ("console.sign_in", made["link_id"], "127.0.0.1"), ("console.link", made["link_id"], "local")]
        # a change made in the link's session: the audit log names the link
        browser.get(f"{base}/#/tokens")
        _type(_visible(browser, "#k-name", "the token form"), "from-link")
        browser.find_element(By.ID, "token-create").click()
        _visible(browser, "#new-secret", "the new token's secret")
        (made_token,) = [e for e in client.request("GET", "/api/v1/audit")[1] if e["action"] == "token.create"
                         and e["object"] == "from-link"]
        assert made_token["actor"] == "console link " + made["link_id"][:8] and made_token["token_id"] is None

        # a second opening, an expired link and a forged one: a page saying so, nothing changed
        expired = json.loads(cli(settings, "console", "link", "--url", base, "--json",
                                 env=child_env(QINGLONG_API__CONSOLE_LINK_TTL_MS="1")))
        wait_until(lambda: time.time_ns() // 1_000_000 > expired["expires_at_ms"] or None,
                   "the one-millisecond link to expire", timeout=30, every=0.01)
        before = client.request("GET", "/api/v1/audit")[1]
        for opened, said in ((url, "used already"), (expired["url"], "expired"),
                             (url[:-4] + "AAAA", "not valid"), (f"{base}/console/link", "not valid")):
            browser.delete_all_cookies()
            browser.get(opened)
            _text_of(browser, "#link-refused", said, f"the refusal of {opened}")
            assert [c for c in browser.get_cookies() if c["name"] == "qinglong_session"] == []
            assert browser.execute_script("return document.querySelectorAll('script').length") == 0
            status, _, _ = Client(port).request("GET", opened[len(base):])
            assert status in (404, 410), (opened, status)
        _shot(browser, tmp_path, "link-refused", 375)
        assert client.request("GET", "/api/v1/audit")[1] == before
    finally:
        client.close()
        plane.stop()


def test_the_notifications_view_shows_every_delivery_and_filters_it_by_state(tmp_path, browser):
    """Without it an operator learns that alerts stopped reaching the on-call channel only from
    the host's shell; a view without the last error and the next try cannot tell a channel that
    is down from one that is slow; one offered to a project-limited token shows a button that
    only fails."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from selenium.webdriver.common.by import By

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (the standard library's name)
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    channels = ('[notifications]\ndefault = "always"\nmax_tries = 3\nbackoff_ms = 3600000\n'
                'backoff_cap_ms = 3600000\npoll_ms = 50\n'
                f'[notifications.channels.oncall]\nkind = "webhook"\nurl = "http://127.0.0.1:{receiver.server_port}/in"\n'
                'secret = "channel-secret-0123456789"\n'
                '[notifications.channels.down]\nkind = "webhook"\nurl = "http://127.0.0.1:9/x"\n'
                'secret = "channel-secret-0123456789"\n')
    settings = api_settings(tmp_path, extra=channels)
    cli(settings, "project", "create", "ops")
    for task in ("backup", "report"):  # two subjects: a channel holds a subject's next while one waits
        cli(settings, "task", "put", "ops", task, "--", "true")
        cli(settings, "task", "run", "ops", task)
    reader = make_token(settings, "reader", "read")
    outsider = make_token(settings, "outsider", "read", "ops")
    plane = Plane(settings)
    client = Client(plane.port, reader)
    port = plane.port
    try:
        def settled():
            listed = client.request("GET", "/api/v1/notifications")[1]["deliveries"]
            states = sorted((d["channel"], d["state"], d["tries"]) for d in listed)
            return listed if states == [("down", "pending", 1)] * 2 + [("oncall", "delivered", 1)] * 2 else None

        listed = wait_until(settled, "two deliveries delivered and two waiting to be tried again", timeout=60,
                            every=0.1, alive=plane.process)
        _sign_in(browser, port, reader)
        _visible(browser, "#nav-notifications", "the notifications link").click()
        wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, ".delivery-state")) == 4 or None,
                   "every delivery listed", timeout=60, every=0.1)
        for d in listed:
            cells = browser.find_element(
                By.CSS_SELECTOR, f".delivery-state[data-event='{d['event_id']}'][data-channel='{d['channel']}']"
            ).find_element(By.XPATH, "./ancestor::tr").find_elements(By.TAG_NAME, "td")
            text = [c.text for c in cells]
            assert text[1:6] == ["run.succeeded", d["subject"], d["channel"], d["state"], "1"], text
            if d["state"] == "pending":
                assert d["last_error"] and text[6] == d["last_error"] and text[7] == _iso_ms(d["next_try_at_ms"])[:19]
            else:
                assert (text[6], text[7]) == ("–", "–") and text[8] != "–"
        assert browser.find_elements(By.CSS_SELECTOR, "#view button:not(#n-filter)") == []  # read-only
        _shot(browser, tmp_path, "notifications", 375)
        browser.set_window_size(1280, 900)

        for state, channel in (("pending", "down"), ("delivered", "oncall")):
            browser.find_element(By.CSS_SELECTOR, f"#n-state option[value={state}]").click()
            browser.find_element(By.ID, "n-filter").click()
            wait_until(lambda: _texts(browser, ".delivery-channel") == [channel, channel] or None,
                       f"only the {state} deliveries", timeout=60, every=0.1)
            assert set(_texts(browser, ".delivery-state")) == {state}
        browser.get(f"http://127.0.0.1:{port}/#/notifications?state=dead")
        _text_of(browser, "#no-deliveries", "no deliveries dead", "no dead delivery")
        # a page further on (as "Older deliveries" links it): the rest, in the API's order
        browser.get(f"http://127.0.0.1:{port}/#/notifications?cursor=2")
        wait_until(lambda: len(_texts(browser, ".delivery-state")) == 2 or None, "the second page",
                   timeout=60, every=0.1)
        assert [e.get_attribute("data-event") for e in browser.find_elements(By.CSS_SELECTOR, ".delivery-state")] == [
            d["event_id"] for d in listed[2:]]
        assert browser.find_elements(By.ID, "n-more") == []
        _sign_out(browser)

        _sign_in(browser, port, outsider)  # deliveries and the status span every project: not offered
        assert browser.find_element(By.ID, "nav-notifications").is_displayed() is False
        assert browser.find_element(By.ID, "nav-overview").is_displayed() is False
        # the view is drawn after sign-in: waited for, not looked up once
        _text_of(browser, "#view h1", "Tasks", "the tasks view a token limited to projects lands on")
    finally:
        client.close()
        plane.stop()
        receiver.shutdown()


def test_task_trigger_and_env_fields_holding_markup_are_shown_as_text_and_env_values_never(tmp_path, browser):
    """A console that put a stored or echoed value into the page as markup hands the operator's
    session (admin, on a link) to whoever can publish a task or type into a form someone else
    reads; an env value in the page is a secret on a screen. Task and trigger ids are restricted
    to identifiers, env names to letters, digits and _, so markup reaches the page through the
    command, the working directory, a refusal that echoes a typed env name, and a trigger's kind
    and expression echoed by the preview."""
    from selenium.webdriver.common.by import By

    marks = {name: f'<img src=x onerror="window.__qinglong_{name}=1"><script>window.__qinglong_{name}=2</script>'
             for name in ("command", "workdir", "env", "kind", "expression", "description")}
    marks["kind"] = '<img src=x onerror="window.__qinglong_kind=1">'  # a path segment: no "/"
    secret = "env-value-never-in-the-page"
    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    writer = make_token(settings, "writer", "write")
    plane = Plane(settings)
    client = Client(plane.port, writer)
    port = plane.port

    def nothing_ran():
        flags = browser.execute_script(
            "return [" + ",".join(f"typeof window.__qinglong_{n}" for n in marks) + ", typeof window.__qinglong_xss]")
        assert set(flags) == {"undefined"}, flags
        assert browser.find_elements(By.CSS_SELECTOR, "#view img, #view script, #view iframe") == []

    try:
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/tasks/report", {"payload": {
            "command": ["echo", marks["command"]], "working_dir": "/tmp/" + marks["workdir"],
            "env": {"API_TOKEN": secret}, "description": marks["description"]}})
        assert status in (200, 201), body
        status, body, _ = client.request("PUT", "/api/v1/projects/ops/triggers/yearly", {
            "task_id": "report", "kind": "cron", "spec": {"expression": "0 0 1 1 *"}})
        assert status == 201, body

        _sign_in(browser, port, writer)
        browser.get(f"http://127.0.0.1:{port}/#/tasks")
        listing = _text_of(browser, "#view table", marks["command"], "the command shown as text")
        assert secret not in browser.page_source
        nothing_ran()

        _visible(browser, "a.edit-task[data-task=report]", "the task's edit link").click()
        _visible(browser, "#env-list .env-row[data-kept=API_TOKEN]", "the env names")
        assert browser.find_element(By.ID, "t-workdir").get_attribute("value") == "/tmp/" + marks["workdir"]
        assert marks["command"] in browser.find_element(By.ID, "t-command").get_attribute("value")
        assert secret not in browser.page_source
        # an env name holding markup: the API refuses it and its message, echoing the name, is text
        browser.find_element(By.ID, "env-add").click()
        row = browser.find_elements(By.CSS_SELECTOR, "#env-list .env-row")[-1]
        row.find_element(By.CSS_SELECTOR, ".env-name").send_keys(marks["env"])
        row.find_element(By.CSS_SELECTOR, ".env-value").send_keys("x")
        browser.find_element(By.ID, "task-save").click()
        refusal = _text_of(browser, "#form-error", "variable names", "the env name refused")
        assert "(got '<img src=" in refusal.text, refusal.text  # echoed shortened, as text
        nothing_ran()
        status, shown, _ = client.request("GET", "/api/v1/projects/ops/tasks/report")
        assert shown["task_revision"] == 1 and shown["execution"]["env"] == {"API_TOKEN": "(set)"}

        # a trigger's kind and expression, echoed by the preview's refusal, are text
        browser.get(f"http://127.0.0.1:{port}/#/triggers")
        _text_of(browser, ".trigger-state[data-trigger=yearly]", "enabled", "the trigger list")
        _visible(browser, "#new-trigger", "the new-trigger link").click()
        _type(_visible(browser, "#g-expression", "the trigger form"), marks["expression"])
        # errors quote a value's first 80 characters: enough of the markup to see it shown as text
        _text_of(browser, "#preview-error", marks["expression"][:80], "the expression echoed as text")
        nothing_ran()
        _type(browser.find_element(By.ID, "g-kind"), marks["kind"])
        _text_of(browser, "#preview-error", marks["kind"], "the kind echoed as text")
        nothing_ran()
        _shot(browser, tmp_path, "markup-as-text", 375)
        assert listing is not None
    finally:
        client.close()
        plane.stop()


#: Every control of the drawn view without an accessible name or out of the tab order, every link
#: without a target or a name, and every id used twice.
UNLABELLED = """
var bad = [], seen = {};
document.querySelectorAll("input, select, textarea, button").forEach(function (c) {
  if (c.type === "hidden" || c.closest("[hidden]")) return;
  var named = c.getAttribute("aria-label") || c.getAttribute("aria-labelledby") || c.closest("label") ||
      (c.id && document.querySelector("label[for='" + CSS.escape(c.id) + "']")) ||
      (c.tagName === "BUTTON" && c.textContent.trim());
  if (!named) bad.push("no label: " + c.outerHTML.slice(0, 100));
  if (c.tabIndex < 0 || c.disabled) bad.push("not reachable: " + c.outerHTML.slice(0, 100));
});
document.querySelectorAll("a").forEach(function (a) {
  if (a.closest("[hidden]")) return;
  if (!a.getAttribute("href") || !(a.textContent.trim() || a.getAttribute("aria-label"))) bad.push("link: " + a.outerHTML.slice(0, 100));
});
document.querySelectorAll("[id]").forEach(function (e) { if (seen[e.id]) bad.push("id twice: " + e.id); seen[e.id] = 1; });
return bad;
"""


def _tab_to(browser, css: str, what: str, most: int = 80):
    """Press Tab until the focus is on ``css`` (the keyboard alone reaches it)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    for _ in range(most):
        if browser.execute_script(f"return document.activeElement.matches({json.dumps(css)})"):
            return browser.switch_to.active_element
        ActionChains(browser).send_keys(Keys.TAB).perform()
    raise AssertionError(f"{what} is not reached with Tab")


def test_every_view_fits_a_phone_labels_every_control_and_works_from_the_keyboard(tmp_path, browser):
    """docs/console.md promises a console usable on a 375 px phone, a label on every control and
    every control reachable by keyboard: a view that scrolls sideways, an unlabelled field a screen
    reader reads as "edit text", or a button only a mouse can press breaks that promise silently."""
    from selenium.webdriver.common.keys import Keys

    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    cli(settings, "task", "put", "ops", "hello", "--", "sh", "-c", "echo hi")
    cli(settings, "trigger", "add", "ops", "nightly", "--task", "hello", "--cron", "0 3 * * *")
    admin = make_token(settings, "root", "admin")
    make_token(settings, "phone", "read")
    plane = Plane(settings)
    port = plane.port
    try:
        # the keyboard alone: type the token, Enter, Tab to Tasks, Enter, Tab to Run now, Enter
        browser.get(f"http://127.0.0.1:{port}/")
        _visible(browser, "#token", "the sign-in form")
        assert browser.switch_to.active_element.get_attribute("id") == "token"
        browser.switch_to.active_element.send_keys(admin, Keys.ENTER)
        _visible(browser, "#nav", "the console after a keyboard sign-in")
        _tab_to(browser, "#nav a[href='#/tasks']", "the Tasks link").send_keys(Keys.ENTER)
        _visible(browser, "button.run-now[data-task=hello]", "the task list")
        _tab_to(browser, "button.run-now[data-task=hello]", "the Run now button").send_keys(Keys.ENTER)
        _text_of(browser, "#run-state", "succeeded", "the Run started from the keyboard")
        run_page = browser.current_url.split("#", 1)[1]

        views = {"overview": ("#/overview", "#verdict"), "tasks": ("#/tasks", "button.run-now"),
                 "task-form": ("#/task?project=ops&task=hello", "#task-save"),
                 "new-task": ("#/task", "#task-save"), "triggers": ("#/triggers", "button.toggle"),
                 "trigger-form": ("#/trigger?project=ops&trigger=nightly", "#trigger-save"),
                 "runs": ("#/runs", "#filter"), "run": ("#" + run_page, "#run-again"),
                 "skips": ("#/skips", "#view h1"), "workers": ("#/workers", "#no-workers"),
                 "notifications": ("#/notifications", "#n-filter"), "audit": ("#/audit", ".audit-action"),
                 "tokens": ("#/tokens", "button.revoke")}
        for name, (hash_, ready) in views.items():
            browser.set_window_size(1280, 900)
            browser.get(f"http://127.0.0.1:{port}/{hash_}")
            _visible(browser, ready, f"the {name} view")
            assert browser.execute_script(UNLABELLED) == [], name
            _shot(browser, tmp_path, f"a11y-{name}", 375)  # nothing wider than the phone
        # the task form's env rows: a label for each name and value, a named Remove
        browser.set_window_size(1280, 900)
        browser.get(f"http://127.0.0.1:{port}/#/task")
        _visible(browser, "#env-add", "the add-variable button").click()
        _visible(browser, "#env-list .env-row", "an env row")
        assert browser.execute_script(UNLABELLED) == []
        # nothing in any view needed what the policy forbids (inline script or style, another origin)
        refused = [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]
        assert refused == [], refused
    finally:
        plane.stop()


def test_a_console_link_made_by_the_cli_signs_in_once_at_the_cluster_api(tmp_path):
    """On the cluster the link is made by the CLI on one machine and opened at a `qinglong api`
    process: a code kept anywhere but the shared store would never work there, and one not used
    up in the store would work once per API replica."""
    from api_helpers import ApiProcessPlane
    from tests.support import pg

    server = pg.start_server("pg18")
    try:
        settings = _cluster_settings(server, "ql_console_link", tmp_path)
        plane = ApiProcessPlane(settings)
        try:
            base = f"http://127.0.0.1:{plane.port}"
            made = json.loads(cli(settings, "console", "link", "--url", base, "--json"))
            path = made["url"][len(base):]
            answers = []
            for _ in range(2):
                conn = http.client.HTTPConnection("127.0.0.1", plane.port, timeout=60)
                conn.request("GET", path)
                response = conn.getresponse()
                response.read()
                answers.append((response.status, response.getheader("Location"), response.getheader("Set-Cookie")))
                conn.close()
            (status, location, cookie), again = answers
            assert (status, location) == (303, "/") and "HttpOnly" in cookie and "SameSite=strict" in cookie
            assert again == (410, None, None)
            session = cookie.split(";", 1)[0]
            status, who, _ = Client(plane.port).request("GET", "/console/session", headers={"Cookie": session})
            assert status == 200 and who["scope"] == "admin" and who["projects"] is None
            assert who["name"] == "console link " + made["link_id"][:8]
        finally:
            plane.stop()
    finally:
        server.destroy()
