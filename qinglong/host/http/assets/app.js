// The Qinglong web console: plain script over the management API, no framework, no build step.
// Every value is put into the page as text (textContent), never as markup.
"use strict";
(function () {
  var who = null;
  var timer = null;
  var RANK = { read: 0, run: 1, write: 2, admin: 3 };
  var ENDED = { succeeded: 1, failed: 1, cancelled: 1, timed_out: 1, lost: 1, skipped: 1 };
  var $ = function (id) { return document.getElementById(id); };

  function el(tag, attrs) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "on") Object.keys(attrs.on).forEach(function (e) { node.addEventListener(e, attrs.on[e]); });
      else node.setAttribute(k, attrs[k]);
    });
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) continue;
      node.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  function may(scope) { return who !== null && RANK[who.scope] >= RANK[scope]; }
  function when(ms) { return ms == null ? "–" : new Date(ms).toISOString().replace("T", " ").slice(0, 19); }
  function secs(ms) { return ms == null ? "–" : (ms / 1000).toFixed(ms < 10000 ? 3 : 0) + " s"; }
  function dash(v) { return v == null ? "–" : String(v); }

  function api(method, path, body, headers) {
    var h = Object.assign({}, headers || {});
    if (method !== "GET" && who) h["X-CSRF-Token"] = who.csrf;
    if (body !== undefined) h["Content-Type"] = "application/json";
    return fetch(path, { method: method, headers: h, credentials: "same-origin",
                         body: body === undefined ? undefined : JSON.stringify(body) })
      .then(function (r) {
        if (r.status === 401 && path !== "/console/session") { signedOut("the session ended: sign in again"); }
        var type = r.headers.get("Content-Type") || "";
        var read = type.indexOf("application/json") === 0 ? r.json() : r.text();
        return read.then(function (data) {
          if (!r.ok) {
            var message = data && data.error ? data.error.message : ("HTTP " + r.status);
            throw new Error(message);
          }
          return data;
        });
      });
  }

  function table(headers, rows) {
    var head = el("tr");
    headers.forEach(function (h) { head.appendChild(el("th", { scope: "col", text: h })); });
    var body = el("tbody");
    rows.forEach(function (row) {
      var tr = el("tr");
      row.forEach(function (cell) { tr.appendChild(el("td", null, cell)); });
      body.appendChild(tr);
    });
    return el("table", null, el("thead", null, head), body);
  }
  function show() {
    var view = $("view");
    view.textContent = "";
    for (var i = 0; i < arguments.length; i++) if (arguments[i]) view.appendChild(arguments[i]);
  }
  function failed(err) { show(el("p", { "class": "bad", role: "alert", text: "Could not load: " + err.message })); }

  function overview() {
    api("GET", "/api/v1/status").then(function (s) {
      var stats = s.stats || {};
      var facts = el("dl");
      Object.keys(stats).forEach(function (k) {
        var v = stats[k];
        if (v !== null && typeof v === "object") v = JSON.stringify(v);
        facts.appendChild(el("dt", { text: k.replace(/_/g, " ") }));
        facts.appendChild(el("dd", { text: dash(v) }));
      });
      show(el("h1", { text: "Overview" }),
           el("p", { id: "verdict", "class": s.verdict || "" }, el("strong", { text: s.verdict || "unknown" }),
              ": " + (s.reasons.length ? s.reasons.join("; ") : "nothing needs attention")),
           el("p", { "class": "muted", text: "profile " + s.profile + " · " + s.readiness }), facts);
    }, failed);
  }

  function runNow(project, task, button) {
    button.disabled = true;
    var key = (window.crypto && crypto.randomUUID) ? crypto.randomUUID() : String(Date.now()) + Math.random();
    api("POST", "/api/v1/projects/" + encodeURIComponent(project) + "/tasks/" + encodeURIComponent(task) + "/runs",
        undefined, { "Idempotency-Key": key })
      .then(function (r) { location.hash = "#/run/" + encodeURIComponent(r.run_id); },
            function (e) { button.disabled = false; alert("Run now failed: " + e.message); });
  }

  function tasks() {
    api("GET", "/api/v1/projects").then(function (projects) {
      return Promise.all(projects.map(function (p) {
        return api("GET", "/api/v1/projects/" + encodeURIComponent(p.project_id) + "/tasks");
      }));
    }).then(function (lists) {
      var rows = [];
      lists.forEach(function (list) {
        list.forEach(function (t) {
          var actions = el("span");
          actions.appendChild(el("a", { href: "#/runs?project=" + encodeURIComponent(t.project_id) + "&task=" +
                                        encodeURIComponent(t.task_id), text: "runs" }));
          if (may("run")) {
            var b = el("button", { type: "button", "class": "run-now", "data-task": t.task_id,
                                   "aria-label": "Run " + t.project_id + "/" + t.task_id + " now", text: "Run now" });
            b.addEventListener("click", function () { runNow(t.project_id, t.task_id, b); });
            actions.appendChild(document.createTextNode(" "));
            actions.appendChild(b);
          }
          rows.push([t.project_id, el("span", { "class": "task-name", text: t.task_id }), dash(t.task_revision),
                     t.command ? t.command.join(" ") : "–", actions]);
        });
      });
      show(el("h1", { text: "Tasks" }), rows.length ? table(["project", "task", "revision", "command", ""], rows)
                                                    : el("p", { "class": "muted", text: "no tasks" }));
    }).catch(failed);
  }

  function runs(params) {
    var query = new URLSearchParams(params);
    var state = el("select", { id: "f-state", name: "state" });
    ["", "queued", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"].forEach(function (s) {
      var o = el("option", { value: s, text: s || "any" });
      if (s === (query.get("state") || "")) o.selected = true;
      state.appendChild(o);
    });
    var task = el("input", { id: "f-task", name: "task", value: query.get("task") || "", size: "14" });
    var project = el("input", { id: "f-project", name: "project", value: query.get("project") || "", size: "10" });
    var form = el("form", { "class": "filters" },
                  el("div", null, el("label", { "for": "f-state", text: "State" }), state),
                  el("div", null, el("label", { "for": "f-project", text: "Project" }), project),
                  el("div", null, el("label", { "for": "f-task", text: "Task" }), task),
                  el("button", { type: "submit", text: "Filter" }));
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var q = new URLSearchParams();
      if (state.value) q.set("state", state.value);
      if (project.value) q.set("project", project.value);
      if (task.value) q.set("task", task.value);
      location.hash = "#/runs?" + q.toString();
    });
    var api_q = new URLSearchParams();
    ["state", "project", "task"].forEach(function (k) { if (query.get(k)) api_q.set(k, query.get(k)); });
    api_q.set("limit", "100");
    api("GET", "/api/v1/runs?" + api_q.toString()).then(function (page) {
      var rows = page.runs.map(function (r) {
        return [el("a", { href: "#/run/" + encodeURIComponent(r.run_id), text: r.run_id }),
                r.project_id + "/" + r.task_id, el("span", { "class": r.state, text: r.state }),
                dash(r.exit_code), secs(r.duration_ms), when(r.scheduled_for_ms), dash(r.trigger_id || "manual")];
      });
      show(el("h1", { text: "Runs" }), form,
           rows.length ? table(["run", "task", "state", "exit code", "duration", "scheduled (UTC)", "trigger"], rows)
                       : el("p", { "class": "muted", text: "no runs" }));
    }, failed);
  }

  function run(id) {
    var base = "/api/v1/runs/" + encodeURIComponent(id);
    api("GET", base).then(function (r) {
      var facts = el("dl");
      [["task", r.project_id + "/" + r.task_id], ["trigger", r.trigger_id || "manual"],
       ["scheduled (UTC)", when(r.scheduled_for_ms)], ["admission lag", secs(r.lag_ms)],
       ["exit code", dash(r.exit_code)], ["duration", secs(r.duration_ms)], ["reason", dash(r.reason)]
      ].forEach(function (kv) { facts.appendChild(el("dt", { text: kv[0] })); facts.appendChild(el("dd", { text: kv[1] })); });
      var attempts = table(["attempt", "state", "exit code", "signal", "started (UTC)", "duration", "log bytes", "reason"],
        r.attempts.map(function (a) {
          return [dash(a.attempt_no), el("span", { "class": a.state, text: a.state }), dash(a.exit_code), dash(a.signal),
                  when(a.started_at_ms), secs(a.duration_ms), dash(a.log_bytes), dash(a.reason || a.cancel_reason)];
        }));
      var controls = el("p");
      if (may("run") && !ENDED[r.state]) {
        var cancel = el("button", { type: "button", id: "cancel", "class": "danger", text: "Cancel this Run" });
        cancel.addEventListener("click", function () {
          if (!confirm("Cancel Run " + r.run_id + "?")) return;
          cancel.disabled = true;
          api("POST", base + "/cancel").then(function () { run(id); }, function (e) { alert(e.message); });
        });
        controls.appendChild(cancel);
      }
      var log = el("pre", { id: "log", tabindex: "0", "aria-label": "log" });
      show(el("h1", null, "Run ", el("span", { id: "run-id", text: r.run_id })),
           el("p", null, el("strong", { id: "run-state", "class": r.state, text: r.state })),
           facts, controls, el("h2", { text: "Attempts" }), attempts, el("h2", { text: "Log" }), log);
      if (r.attempts.length) {
        api("GET", base + "/log").then(function (text) { log.textContent = text || "(empty)"; },
                                        function (e) { log.textContent = "(" + e.message + ")"; });
      } else {
        log.textContent = "(no attempt yet)";
      }
      if (!ENDED[r.state]) timer = setTimeout(function () { if (location.hash === "#/run/" + encodeURIComponent(id)) run(id); }, 1000);
    }, failed);
  }

  function route() {
    clearTimeout(timer);
    if (!who) return;
    var hash = location.hash || "#/overview";
    var q = hash.indexOf("?");
    var path = q < 0 ? hash : hash.slice(0, q);
    var params = q < 0 ? "" : hash.slice(q + 1);
    if (path.indexOf("#/run/") === 0) return run(decodeURIComponent(path.slice(6)));
    if (path === "#/tasks") return tasks();
    if (path === "#/runs") return runs(params);
    return overview();
  }

  function signedIn(me) {
    who = me;
    $("signin").hidden = true;
    $("nav").hidden = false;
    $("signout").hidden = false;
    $("who").textContent = me.name + " (" + me.scope + ")";
    route();
  }
  function signedOut(message) {
    who = null;
    clearTimeout(timer);
    $("nav").hidden = true;
    $("signout").hidden = true;
    $("who").textContent = "";
    $("view").textContent = "";
    $("signin").hidden = false;
    $("signin-error").textContent = message || "";
    $("token").focus();
  }

  document.addEventListener("DOMContentLoaded", function () {
    $("signin").addEventListener("submit", function (e) {
      e.preventDefault();
      var input = $("token");
      api("POST", "/console/session", { token: input.value.trim() }).then(function (me) {
        input.value = "";
        signedIn(me);
      }, function (err) { $("signin-error").textContent = err.message; });
    });
    $("signout").addEventListener("click", function () {
      api("DELETE", "/console/session").then(function () { signedOut("signed out"); },
                                             function () { signedOut("signed out"); });
    });
    window.addEventListener("hashchange", route);
    api("GET", "/console/session").then(signedIn, function () { signedOut(""); });
  });
})();
