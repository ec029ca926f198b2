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

  // Each route() starts a new view; a read answered after the view changed would draw the old
  // view over the new one, so it is dropped (it never settles).
  var viewGeneration = 0;
  function api(method, path, body, headers) {
    var generation = viewGeneration;
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
          if (method === "GET" && path !== "/console/session" && generation !== viewGeneration) return new Promise(function () {});
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

  function enc(v) { return encodeURIComponent(v); }
  function projectPath(p) { return "/api/v1/projects/" + enc(p); }
  function field(id, label, input, hint) {
    input.id = id;
    var box = el("div", { "class": "field" }, el("label", { "for": id, text: label }), input);
    if (hint) { input.setAttribute("aria-describedby", id + "-hint"); box.appendChild(el("small", { id: id + "-hint", "class": "muted", text: hint })); }
    return box;
  }
  function input(attrs) { return el("input", Object.assign({ type: "text" }, attrs || {})); }
  function select(values, chosen) {
    var s = el("select");
    values.forEach(function (v) { var o = el("option", { value: v, text: v }); if (v === chosen) o.selected = true; s.appendChild(o); });
    return s;
  }
  function check(on) { var c = el("input", { type: "checkbox" }); c.checked = !!on; return c; }
  function numbers(text) {
    return text.split(/[\s,]+/).filter(Boolean).map(function (x) { return Number(x); });
  }
  function words(text) { return text.split(/[\s,]+/).filter(Boolean); }
  function confirmed(what) { return confirm(what); }
  function sure(promise, done) {
    return promise.then(done, function (e) { alert(e.message); });
  }
  // each project with its tasks, triggers and newest Runs (one listing per project)
  function everything(withRuns) {
    return api("GET", "/api/v1/projects").then(function (projects) {
      return Promise.all(projects.map(function (p) {
        var base = projectPath(p.project_id);
        return Promise.all([api("GET", base + "/tasks"), api("GET", base + "/triggers"),
                            withRuns ? api("GET", "/api/v1/runs?project=" + enc(p.project_id) + "&limit=1000")
                                     : Promise.resolve({ runs: [] })])
          .then(function (got) { return { project: p.project_id, tasks: got[0], triggers: got[1], runs: got[2].runs }; });
      }));
    });
  }
  function nextOf(trigger) {
    if (!trigger.enabled) return Promise.resolve(null);
    return api("GET", projectPath(trigger.project_id) + "/triggers/" + enc(trigger.trigger_id) + "/next?count=1")
      .then(function (n) { return n.next.length ? n.next[0].at_ms : null; }, function () { return null; });
  }

  function tasks() {
    everything(true).then(function (all) {
      var triggers = [];
      all.forEach(function (p) { triggers = triggers.concat(p.triggers); });
      return Promise.all(triggers.map(nextOf)).then(function (next) {
        var soonest = {};
        triggers.forEach(function (t, i) {
          var k = t.project_id + "/" + t.task_id;
          if (next[i] != null && (soonest[k] == null || next[i] < soonest[k])) soonest[k] = next[i];
        });
        return { all: all, soonest: soonest };
      });
    }).then(function (got) {
      var rows = [];
      got.all.forEach(function (p) {
        p.tasks.forEach(function (t) {
          var ended = p.runs.filter(function (r) { return r.task_id === t.task_id && ENDED[r.state] && r.state !== "skipped"; });
          var good = ended.filter(function (r) { return r.state === "succeeded"; }).length;
          var last = ended.length ? ended[0].state : null;
          var label = t.project_id + "/" + t.task_id;
          var actions = el("span", { "class": "actions" });
          actions.appendChild(el("a", { href: "#/runs?project=" + enc(t.project_id) + "&task=" + enc(t.task_id),
                                        "aria-label": "Runs of " + label, text: "runs" }));
          if (may("run")) {
            var b = el("button", { type: "button", "class": "run-now", "data-task": t.task_id,
                                   "aria-label": "Run " + label + " now", text: "Run now" });
            b.addEventListener("click", function () { runNow(t.project_id, t.task_id, b); });
            actions.appendChild(b);
          }
          if (may("write")) {
            actions.appendChild(el("a", { href: "#/task?project=" + enc(t.project_id) + "&task=" + enc(t.task_id),
                                          "class": "edit-task", "data-task": t.task_id, "aria-label": "Edit " + label, text: "edit" }));
            var d = el("button", { type: "button", "class": "danger delete-task", "data-task": t.task_id,
                                   "aria-label": "Delete " + label, text: "Delete" });
            d.addEventListener("click", function () {
              if (!confirmed("Delete task " + label + "? Its Runs stay.")) return;
              sure(api("DELETE", projectPath(t.project_id) + "/tasks/" + enc(t.task_id)), tasks);
            });
            actions.appendChild(d);
          }
          rows.push([t.project_id, el("span", { "class": "task-name", text: t.task_id }), dash(t.task_revision),
                     t.command ? t.command.join(" ") : "–",
                     last ? el("span", { "class": "last-outcome " + last, text: last }) : "–",
                     el("span", { "class": "ratio", text: ended.length ? good + "/" + ended.length + " (" +
                                  Math.round(100 * good / ended.length) + " %)" : "–" }),
                     el("span", { "class": "next-fire", text: when(got.soonest[t.project_id + "/" + t.task_id]) }),
                     actions]);
        });
      });
      show(el("h1", { text: "Tasks" }),
           may("write") ? el("p", null, el("a", { href: "#/task", id: "new-task", text: "New task" })) : null,
           rows.length ? table(["project", "task", "revision", "command", "last outcome", "succeeded",
                                "next fire (UTC)", ""], rows)
                       : el("p", { "class": "muted", text: "no tasks" }));
    }).catch(failed);
  }

  var FORM_KEYS = ["command", "env", "working_dir", "timeout_ms", "concurrency", "retry", "idempotent",
                   "log_limit_bytes", "executor", "labels"];

  function envRow(list, name, kept) {
    var n = list.children.length;
    var nameIn = input({ "class": "env-name", value: name || "", autocomplete: "off" });
    var valueIn = input({ type: "password", "class": "env-value", autocomplete: "new-password",
                          placeholder: kept ? "unchanged (type to replace)" : "" });
    var row = el("div", { "class": "env-row" });
    if (kept) { nameIn.readOnly = true; row.setAttribute("data-kept", name); }
    var remove = el("button", { type: "button", "class": "env-remove", text: "Remove",
                                "aria-label": "Remove variable " + (name || String(n + 1)) });
    remove.addEventListener("click", function () { list.removeChild(row); });
    row.appendChild(field("env-name-" + n + "-" + Date.now(), "Name", nameIn));
    row.appendChild(field("env-value-" + n + "-" + Date.now(), kept ? "Value (set, write-only)" : "Value", valueIn));
    row.appendChild(remove);
    list.appendChild(row);
    return row;
  }

  function taskForm(params) {
    var q = new URLSearchParams(params);
    var editing = q.get("project") && q.get("task");
    var load = editing ? api("GET", projectPath(q.get("project")) + "/tasks/" + enc(q.get("task")))
                       : Promise.resolve(null);
    Promise.all([load, api("GET", "/api/v1/projects")]).then(function (got) {
      var t = got[0], projects = got[1].map(function (p) { return p.project_id; });
      var x = (t && t.execution) || {};
      var retry = x.retry || {}, conc = x.concurrency || {};
      var project = editing ? input({ value: t.project_id, readOnly: "readonly" }) : select(projects, projects[0]);
      var taskId = input({ value: editing ? t.task_id : "", required: "required", autocomplete: "off" });
      if (editing) taskId.readOnly = true;
      var command = el("textarea", { rows: "3", required: "required" });
      command.value = (x.command || []).join("\n");
      var env = el("div", { id: "env-list" });
      Object.keys(x.env || {}).forEach(function (name) { envRow(env, name, true); });
      var addEnv = el("button", { type: "button", id: "env-add", text: "Add variable" });
      addEnv.addEventListener("click", function () { envRow(env, "", false).querySelector("input").focus(); });
      var workdir = input({ value: x.working_dir || "" });
      var timeout = input({ type: "number", min: "1", value: x.timeout_ms ? String(x.timeout_ms / 1000) : "" });
      var mode = select(["allow", "forbid", "replace", "queue"], conc.mode || "allow");
      var maxRunning = input({ type: "number", min: "1", value: conc.max_running || "" });
      var attempts = input({ type: "number", min: "1", value: retry.max_attempts || 1 });
      var initial = input({ type: "number", min: "0", value: retry.initial_backoff_ms != null ? retry.initial_backoff_ms : "" });
      var maximum = input({ type: "number", min: "0", value: retry.max_backoff_ms != null ? retry.max_backoff_ms : "" });
      var jitter = input({ type: "number", min: "0", max: "1", step: "0.01", value: retry.jitter != null ? retry.jitter : "" });
      var codes = input({ value: (retry.exit_codes || []).join(", ") });
      var onTimeout = check(retry.on_timeout !== false);
      var idempotent = check(x.idempotent);
      var logLimit = input({ type: "number", min: "0", value: x.log_limit_bytes != null ? x.log_limit_bytes : "" });
      var executor = input({ value: x.executor || "" });
      var labels = input({ value: (x.labels || []).join(", ") });
      var error = el("p", { id: "form-error", "class": "bad", role: "alert" });
      var form = el("form", { id: "task-form", "class": "edit" },
        field("t-project", "Project", project), field("t-task", "Task", taskId),
        field("t-command", "Command", command, "one argument per line (argv, no shell: write sh, -c, ... for one)"),
        el("fieldset", null, el("legend", { text: "Environment (values are write-only)" }), env, addEnv),
        field("t-workdir", "Working directory", workdir, "absolute path; empty for the default"),
        field("t-timeout", "Timeout (seconds)", timeout, "empty for the profile's default"),
        el("fieldset", null, el("legend", { text: "Concurrency" }),
           field("t-mode", "Mode", mode), field("t-max-running", "Most running at once (allow only)", maxRunning)),
        el("fieldset", null, el("legend", { text: "Retry" }),
           field("t-attempts", "Attempts at most", attempts), field("t-initial", "First backoff (ms)", initial),
           field("t-maximum", "Longest backoff (ms)", maximum), field("t-jitter", "Jitter (0-1)", jitter),
           field("t-codes", "Retry on exit codes", codes, "comma separated; empty: any failure"),
           field("t-on-timeout", "Retry after a timeout", onTimeout)),
        field("t-idempotent", "Idempotent (safe to run twice)", idempotent),
        field("t-log-limit", "Log limit (bytes)", logLimit), field("t-executor", "Executor", executor),
        field("t-labels", "Labels a worker must offer", labels, "comma separated"),
        el("p", null, el("button", { type: "submit", id: "task-save", text: editing ? "Save a new revision" : "Create task" }),
           " ", el("a", { href: "#/tasks", text: "Back to tasks" })), error);
      form.addEventListener("submit", function (e) {
        e.preventDefault();
        var payload = {};
        if (t) Object.keys(t.payload || {}).forEach(function (k) { if (FORM_KEYS.indexOf(k) < 0) payload[k] = t.payload[k]; });
        payload.command = command.value.split("\n").filter(function (a) { return a !== ""; });
        var values = {}, keep = [];
        Array.prototype.forEach.call(env.children, function (row) {
          var name = row.querySelector(".env-name").value.trim(), value = row.querySelector(".env-value").value;
          if (!name) return;
          if (row.getAttribute("data-kept") && value === "") keep.push(name); else values[name] = value;
        });
        payload.env = values;
        if (workdir.value.trim()) payload.working_dir = workdir.value.trim();
        if (timeout.value) payload.timeout_ms = Math.round(Number(timeout.value) * 1000);
        payload.concurrency = { mode: mode.value };
        if (maxRunning.value && mode.value === "allow") payload.concurrency.max_running = Number(maxRunning.value);
        var r = { max_attempts: Number(attempts.value || 1), on_timeout: onTimeout.checked };
        if (initial.value !== "") r.initial_backoff_ms = Number(initial.value);
        if (maximum.value !== "") r.max_backoff_ms = Number(maximum.value);
        if (jitter.value !== "") r.jitter = Number(jitter.value);
        if (codes.value.trim()) r.exit_codes = numbers(codes.value);
        payload.retry = r;
        payload.idempotent = idempotent.checked;
        if (logLimit.value !== "") payload.log_limit_bytes = Number(logLimit.value);
        if (executor.value.trim()) payload.executor = executor.value.trim();
        payload.labels = words(labels.value);
        var body = { payload: payload };
        if (keep.length) body.keep_env = keep;
        error.textContent = "";
        api("PUT", projectPath(project.value) + "/tasks/" + enc(taskId.value.trim()), body)
          .then(function () { location.hash = "#/tasks"; }, function (err) { error.textContent = err.message; });
      });
      show(el("h1", { text: editing ? "Edit task " + t.project_id + "/" + t.task_id : "New task" }), form);
      (editing ? command : taskId).focus();
    }).catch(failed);
  }

  function triggers() {
    everything(false).then(function (all) {
      var list = [];
      all.forEach(function (p) { list = list.concat(p.triggers); });
      return Promise.all(list.map(nextOf)).then(function (next) { return { list: list, next: next }; });
    }).then(function (got) {
      var rows = got.list.map(function (t, i) {
        var label = t.project_id + "/" + t.trigger_id;
        var base = projectPath(t.project_id) + "/triggers/" + enc(t.trigger_id);
        var actions = el("span", { "class": "actions" });
        if (may("write")) {
          var toggle = el("button", { type: "button", "class": "toggle", "data-trigger": t.trigger_id,
                                      "aria-label": (t.enabled ? "Disable " : "Enable ") + label,
                                      text: t.enabled ? "Disable" : "Enable" });
          toggle.addEventListener("click", function () {
            toggle.disabled = true;
            sure(api("POST", base + (t.enabled ? "/disable" : "/enable")), triggers);
          });
          actions.appendChild(toggle);
          actions.appendChild(el("a", { href: "#/trigger?project=" + enc(t.project_id) + "&trigger=" + enc(t.trigger_id),
                                        "class": "edit-trigger", "aria-label": "Edit " + label, text: "edit" }));
          var d = el("button", { type: "button", "class": "danger delete-trigger", "data-trigger": t.trigger_id,
                                 "aria-label": "Delete " + label, text: "Delete" });
          d.addEventListener("click", function () {
            if (!confirmed("Delete trigger " + label + "?")) return;
            sure(api("DELETE", base), triggers);
          });
          actions.appendChild(d);
        }
        return [t.project_id, el("span", { "class": "trigger-name", text: t.trigger_id }), t.task_id, t.kind,
                JSON.stringify(t.spec), el("span", { "class": "trigger-state " + (t.enabled ? "clear" : "muted"),
                                                     "data-trigger": t.trigger_id, text: t.enabled ? "enabled" : "disabled" }),
                when(got.next[i]), actions];
      });
      show(el("h1", { text: "Triggers" }),
           may("write") ? el("p", null, el("a", { href: "#/trigger", id: "new-trigger", text: "New trigger" })) : null,
           rows.length ? table(["project", "trigger", "task", "kind", "spec", "state", "next fire (UTC)", ""], rows)
                       : el("p", { "class": "muted", text: "no triggers" }));
    }).catch(failed);
  }

  function triggerForm(params) {
    var q = new URLSearchParams(params);
    var editing = q.get("project") && q.get("trigger");
    var load = editing ? api("GET", projectPath(q.get("project")) + "/triggers/" + enc(q.get("trigger")))
                       : Promise.resolve(null);
    Promise.all([load, everything(false)]).then(function (got) {
      var t = got[0], all = got[1];
      var projects = all.map(function (p) { return p.project; });
      var project = editing ? input({ value: t.project_id, readOnly: "readonly" }) : select(projects, projects[0]);
      var task = el("select");
      function tasksOf() {
        task.textContent = "";
        all.forEach(function (p) {
          if (p.project !== project.value) return;
          p.tasks.forEach(function (x) {
            var o = el("option", { value: x.task_id, text: x.task_id });
            if (t && t.task_id === x.task_id) o.selected = true;
            task.appendChild(o);
          });
        });
      }
      tasksOf();
      project.addEventListener("change", tasksOf);
      var triggerId = input({ value: editing ? t.trigger_id : "", required: "required", autocomplete: "off" });
      if (editing) triggerId.readOnly = true;
      var kind = input({ value: t ? t.kind : "cron", required: "required" });
      var loaded = t ? JSON.stringify(t.spec) : JSON.stringify({ expression: "*/5 * * * *" });
      var spec = el("textarea", { rows: "3" });
      spec.value = loaded;
      var expression = input({ value: (t ? t.spec.expression : "*/5 * * * *") || "", autocomplete: "off" });
      var policy = select(["fire_once", "skip"], t ? t.misfire_policy : "fire_once");
      var grace = input({ type: "number", min: "0", value: t ? t.misfire_grace_ms : "" });
      var jitter = input({ type: "number", min: "0", value: t ? t.jitter_ms : "0" });
      var enabled = check(t ? t.enabled : true);
      var preview = el("ol", { id: "preview", "aria-live": "polite" });
      var previewError = el("p", { id: "preview-error", "class": "bad" });
      var error = el("p", { id: "form-error", "class": "bad", role: "alert" });
      var seq = 0, pending = null;
      function specValue() { return JSON.parse(spec.value); }
      function refresh() {
        clearTimeout(pending);
        pending = setTimeout(function () {
          var mine = ++seq, value;
          try { value = specValue(); } catch (e) { previewError.textContent = "the spec is not JSON"; preview.textContent = ""; return; }
          api("GET", "/api/v1/kinds/" + enc(kind.value.trim()) + "/next?count=5&spec=" + enc(JSON.stringify(value)))
            .then(function (n) {
              if (mine !== seq) return;
              previewError.textContent = "";
              preview.textContent = "";
              n.next.forEach(function (f) { preview.appendChild(el("li", { text: when(f.at_ms) })); });
            }, function (e) { if (mine === seq) { preview.textContent = ""; previewError.textContent = e.message; } });
        }, 150);
      }
      expression.addEventListener("input", function () {
        var value;
        try { value = specValue(); } catch (e) { value = {}; }
        value.expression = expression.value;
        spec.value = JSON.stringify(value);
        refresh();
      });
      spec.addEventListener("input", function () {
        try { var v = specValue(); if (typeof v.expression === "string") expression.value = v.expression; } catch (e) { /* shown by the preview */ }
        refresh();
      });
      kind.addEventListener("input", refresh);
      var form = el("form", { id: "trigger-form", "class": "edit" },
        field("g-project", "Project", project), field("g-trigger", "Trigger", triggerId),
        field("g-task", "Task it starts", task), field("g-kind", "Kind", kind, "cron, or a kind a plugin adds"),
        field("g-expression", "Cron expression", expression, "minute hour day month weekday, e.g. 0 9 * * 1-5"),
        field("g-spec", "Spec (JSON)", spec, "the whole spec, as trigger add --spec takes it"),
        el("h2", { text: "Next five fire times (UTC)" }), preview, previewError,
        field("g-policy", "Misfire policy", policy), field("g-grace", "Misfire grace (ms)", grace, "empty for the default"),
        field("g-jitter", "Jitter (ms)", jitter), field("g-enabled", "Enabled", enabled),
        el("p", null, el("button", { type: "submit", id: "trigger-save", text: editing ? "Save a new revision" : "Create trigger" }),
           " ", el("a", { href: "#/triggers", text: "Back to triggers" })), error);
      form.addEventListener("submit", function (e) {
        e.preventDefault();
        var body = { task_id: task.value, kind: kind.value.trim(), misfire_policy: policy.value,
                     enabled: enabled.checked, jitter_ms: Number(jitter.value || 0) };
        if (grace.value !== "") body.misfire_grace_ms = Number(grace.value);
        try {
          // an unchanged spec is left out: a masked secret is never written back
          if (!editing || spec.value !== loaded) body.spec = specValue();
        } catch (err) { error.textContent = "the spec is not JSON"; return; }
        error.textContent = "";
        api("PUT", projectPath(project.value) + "/triggers/" + enc(triggerId.value.trim()), body)
          .then(function () { location.hash = "#/triggers"; }, function (err) { error.textContent = err.message; });
      });
      show(el("h1", { text: editing ? "Edit trigger " + t.project_id + "/" + t.trigger_id : "New trigger" }), form);
      refresh();
      (editing ? expression : triggerId).focus();
    }).catch(failed);
  }

  // "2026-12-02 21:00" or any ISO time, read as UTC; "" is none; NaN is refused
  function instant(text) {
    text = text.trim();
    if (!text) return null;
    var iso = text.replace(" ", "T");
    if (/^\d{4}-\d\d-\d\d$/.test(iso)) iso += "T00:00";
    if (!/(Z|[+-]\d\d:?\d\d)$/.test(iso)) iso += "Z";
    return Date.parse(iso);
  }
  function isoOf(ms) { return ms == null || ms === "" ? "" : new Date(Number(ms)).toISOString().replace("T", " ").replace("Z", ""); }

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
    var since = el("input", { id: "f-since", name: "since", value: isoOf(query.get("since_ms")), size: "19",
                              placeholder: "2026-01-31 09:00", "aria-describedby": "f-time-hint" });
    var until = el("input", { id: "f-until", name: "until", value: isoOf(query.get("until_ms")), size: "19",
                              placeholder: "2026-01-31 18:00", "aria-describedby": "f-time-hint" });
    var error = el("p", { id: "filter-error", "class": "bad", role: "alert" });
    var form = el("form", { "class": "filters" },
                  el("div", null, el("label", { "for": "f-state", text: "State" }), state),
                  el("div", null, el("label", { "for": "f-project", text: "Project" }), project),
                  el("div", null, el("label", { "for": "f-task", text: "Task" }), task),
                  el("div", null, el("label", { "for": "f-since", text: "Scheduled from (UTC)" }), since),
                  el("div", null, el("label", { "for": "f-until", text: "until (UTC)" }), until),
                  el("button", { type: "submit", id: "filter", text: "Filter" }));
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var q = new URLSearchParams();
      if (state.value) q.set("state", state.value);
      if (project.value) q.set("project", project.value);
      if (task.value) q.set("task", task.value);
      var from = instant(since.value), to = instant(until.value);
      if ((from !== null && isNaN(from)) || (to !== null && isNaN(to))) {
        error.textContent = "a time is YYYY-MM-DD HH:MM[:SS] in UTC";
        return;
      }
      if (from !== null) q.set("since_ms", String(from));
      if (to !== null) q.set("until_ms", String(to));
      location.hash = "#/runs?" + q.toString();
    });
    var api_q = new URLSearchParams();
    ["state", "project", "task", "since_ms", "until_ms"].forEach(function (k) { if (query.get(k)) api_q.set(k, query.get(k)); });
    api_q.set("limit", "100");
    api("GET", "/api/v1/runs?" + api_q.toString()).then(function (page) {
      var rows = page.runs.map(function (r) {
        return [el("a", { href: "#/run/" + encodeURIComponent(r.run_id), text: r.run_id }),
                r.project_id + "/" + r.task_id, el("span", { "class": r.state, text: r.state }),
                dash(r.exit_code), secs(r.duration_ms), when(r.scheduled_for_ms), dash(r.trigger_id || "manual")];
      });
      show(el("h1", { text: "Runs" }), form,
           el("small", { id: "f-time-hint", "class": "muted", text: "times in UTC: YYYY-MM-DD HH:MM[:SS]; from is inclusive, until exclusive" }),
           error,
           rows.length ? table(["run", "task", "state", "exit code", "duration", "scheduled (UTC)", "trigger"], rows)
                       : el("p", { "class": "muted", id: "no-runs", text: "no runs" }));
    }, failed);
  }

  // the log of the Run on screen: followed as Server-Sent Events while its Attempt runs
  var follow = null;
  function unfollow() { if (follow && follow.source) follow.source.close(); follow = null; }

  function followLog(base, log, attempt, ended) {
    if (follow && follow.attempt === attempt && (follow.source || follow.done)) return;
    if (!follow || follow.attempt !== attempt) {
      unfollow();
      follow = { attempt: attempt, bytes: 0, source: null, done: false };
      log.textContent = "";
    }
    var f = follow;
    var path = base + "/log?attempt=" + attempt;
    if (ended) {  // nothing more will come: one read of the rest
      f.done = true;
      api("GET", path + "&offset=" + f.bytes).then(function (text) {
        if (follow !== f) return;
        log.textContent += text;
        if (!log.textContent) log.textContent = "(empty)";
      }, function (e) { log.textContent += "(" + e.message + ")"; });
      return;
    }
    var source = new EventSource(path + "&follow=1&offset=" + f.bytes);
    f.source = source;
    source.addEventListener("log", function (e) {
      if (follow !== f) return;
      log.textContent += e.data;
      f.bytes += new TextEncoder().encode(e.data).length;
      if (log.scrollHeight - log.scrollTop - log.clientHeight < 80) log.scrollTop = log.scrollHeight;
    });
    source.addEventListener("end", function () { source.close(); f.source = null; f.done = true; });
    // a dropped stream is opened again from the bytes already shown at the next refresh
    source.onerror = function () { source.close(); if (f.source === source) f.source = null; };
  }

  function run(id) {
    var base = "/api/v1/runs/" + encodeURIComponent(id);
    var here = "#/run/" + encodeURIComponent(id);
    var log = el("pre", { id: "log", tabindex: "0", "aria-label": "log" });
    var top = el("div", { id: "run-top" });
    var drawn = false;
    unfollow();
    function refresh() {
      api("GET", base).then(function (r) {
        if (location.hash !== here) return;
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
        var controls = el("p", { "class": "actions" });
        if (may("run") && !ENDED[r.state]) {
          var cancel = el("button", { type: "button", id: "cancel", "class": "danger", text: "Cancel this Run" });
          cancel.addEventListener("click", function () {
            if (!confirm("Cancel Run " + r.run_id + "?")) return;
            cancel.disabled = true;
            api("POST", base + "/cancel").then(function () { clearTimeout(timer); refresh(); }, function (e) { alert(e.message); });
          });
          controls.appendChild(cancel);
        }
        if (may("run")) {
          var again = el("button", { type: "button", id: "run-again", text: "Run again",
                                     "aria-label": "Run " + r.project_id + "/" + r.task_id + " again" });
          again.addEventListener("click", function () { runNow(r.project_id, r.task_id, again); });
          controls.appendChild(again);
        }
        top.textContent = "";
        [el("h1", null, "Run ", el("span", { id: "run-id", text: r.run_id })),
         el("p", null, el("strong", { id: "run-state", "class": r.state, text: r.state })),
         facts, controls, el("h2", { text: "Attempts" }), attempts].forEach(function (n) { top.appendChild(n); });
        if (!drawn) { drawn = true; show(top, el("h2", { text: "Log" }), log); }
        if (r.attempts.length) {
          var last = r.attempts[r.attempts.length - 1];
          followLog(base, log, last.attempt_no, ENDED[r.state] || !!last.finished_at_ms);
        } else {
          log.textContent = "(no attempt yet)";
        }
        if (!ENDED[r.state]) timer = setTimeout(refresh, 1000);
      }, failed);
    }
    refresh();
  }

  function skips() {
    api("GET", "/api/v1/skips?limit=200").then(function (got) {
      var misfires = got.skips.map(function (k) {
        return [k.project_id + "/" + k.trigger_id, dash(k.trigger_revision), k.policy, when(k.first_skipped_ms),
                when(k.last_skipped_ms), k.count + (k.count_exact ? "" : "+"), when(k.recorded_at_ms)];
      });
      var before = got.run_skips.map(function (k) {
        return [el("a", { href: "#/run/" + enc(k.run_id), text: k.run_id }), k.project_id + "/" + k.task_id,
                k.trigger_id || "manual", when(k.scheduled_for_ms), el("span", { "class": "skip-reason", text: k.reason }),
                when(k.recorded_at_ms)];
      });
      show(el("h1", { text: "Skips" }),
           el("h2", { text: "Occurrences not admitted (misfires)" }),
           misfires.length ? table(["trigger", "revision", "policy", "first skipped (UTC)", "last skipped (UTC)", "count",
                                    "recorded (UTC)"], misfires) : el("p", { "class": "muted", text: "none recorded" }),
           el("h2", { text: "Runs skipped before they started" }),
           before.length ? table(["run", "task", "trigger", "scheduled (UTC)", "reason", "recorded (UTC)"], before)
                         : el("p", { "class": "muted", text: "none recorded" }));
    }, failed);
  }

  function workers() {
    api("GET", "/api/v1/workers").then(function (got) {
      if (got.workers === null) return show(el("h1", { text: "Workers" }), el("p", { "class": "muted", id: "no-workers", text: got.reason }));
      var free = 0;
      var rows = got.workers.map(function (w) {
        free += w.free_slots;
        return [el("span", { "class": "worker-id", text: w.worker_id }),
                el("span", { "class": "worker-state " + (w.state === "live" ? "clear" : w.state === "expired" ? "bad" : "muted"),
                             "data-worker": w.worker_id, text: w.state }),
                w.labels.length ? w.labels.join(", ") : "–", w.running + " / " + w.capacity,
                el("span", { "class": "worker-free", "data-worker": w.worker_id, text: String(w.free_slots) }),
                when(w.heartbeat_at_ms), when(w.lease_expires_at_ms), when(w.opened_at_ms), when(w.closed_at_ms)];
      });
      show(el("h1", { text: "Workers" }), el("p", { id: "free-slots", text: free + " free slots on live workers" }),
           rows.length ? table(["worker", "session", "labels", "running / capacity", "free slots", "last heartbeat (UTC)",
                                "lease until (UTC)", "opened (UTC)", "closed (UTC)"], rows)
                       : el("p", { "class": "muted", text: "no worker has opened a session" }));
    }, failed);
  }

  function notifications(params) {
    var query = new URLSearchParams(params);
    var state = el("select", { id: "n-state", name: "state" });
    ["", "pending", "delivered", "dead"].forEach(function (v) {
      var o = el("option", { value: v, text: v || "any" });
      if (v === (query.get("state") || "")) o.selected = true;
      state.appendChild(o);
    });
    var form = el("form", { "class": "filters" },
                  el("div", null, el("label", { "for": "n-state", text: "State" }), state),
                  el("button", { type: "submit", id: "n-filter", text: "Filter" }));
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      location.hash = "#/notifications" + (state.value ? "?state=" + enc(state.value) : "");
    });
    var q = new URLSearchParams();
    ["state", "cursor"].forEach(function (k) { if (query.get(k)) q.set(k, query.get(k)); });
    q.set("limit", "100");
    api("GET", "/api/v1/notifications?" + q.toString()).then(function (page) {
      var rows = page.deliveries.map(function (d) {
        var about = d.run_id ? el("a", { href: "#/run/" + enc(d.run_id), text: d.subject || d.run_id }) : dash(d.subject);
        return [when(d.at_ms), el("span", { "class": "delivery-event", text: d.kind }), about,
                el("span", { "class": "delivery-channel", text: d.channel }),
                el("span", { "class": "delivery-state " + (d.state === "dead" ? "bad" : d.state === "delivered" ? "clear" : ""),
                             "data-event": d.event_id, "data-channel": d.channel, text: d.state }),
                String(d.tries), el("span", { "class": "delivery-error", text: d.last_error || "–" }),
                when(d.next_try_at_ms), when(d.delivered_at_ms)];
      });
      var more = null;
      if (page.next) {
        var next = new URLSearchParams();
        if (query.get("state")) next.set("state", query.get("state"));
        next.set("cursor", page.next);
        more = el("p", null, el("a", { id: "n-more", href: "#/notifications?" + next.toString(), text: "Older deliveries" }));
      }
      show(el("h1", { text: "Notifications" }),
           el("p", { "class": "muted", text: "Deliveries of the events out to the [notifications] channels, newest first (read-only)." }),
           form,
           rows.length ? table(["event at (UTC)", "event", "about", "channel", "state", "tries", "last error",
                                "next try (UTC)", "delivered (UTC)"], rows)
                       : el("p", { "class": "muted", id: "no-deliveries", text: "no deliveries" + (query.get("state") ? " " + query.get("state") : "") }),
           more);
    }, failed);
  }

  function audit() {
    api("GET", "/api/v1/audit?limit=200").then(function (entries) {
      var rows = entries.map(function (e) {
        return [when(e.at_ms), e.actor, dash(e.source), el("span", { "class": "audit-action", text: e.action }),
                e.object, el("span", { "class": e.result === "ok" ? "" : "bad", text: e.result }),
                Object.keys(e.detail || {}).length ? JSON.stringify(e.detail) : ""];
      });
      show(el("h1", { text: "Audit log" }),
           rows.length ? table(["at (UTC)", "who", "from", "action", "object", "result", "detail"], rows)
                       : el("p", { "class": "muted", text: "nothing recorded" }));
    }, failed);
  }

  function tokens(made) {
    api("GET", "/api/v1/tokens").then(function (list) {
      var rows = list.map(function (t) {
        var actions = el("span", { "class": "actions" });
        if (t.state === "active" && (!who || t.name !== who.name)) {
          var revoke = el("button", { type: "button", "class": "danger revoke", "data-token": t.name,
                                      "aria-label": "Revoke token " + t.name, text: "Revoke" });
          revoke.addEventListener("click", function () {
            if (!confirmed("Revoke token " + t.name + "? Whatever uses it fails at its next request.")) return;
            sure(api("DELETE", "/api/v1/tokens/" + enc(t.name)), function () { tokens(); });
          });
          actions.appendChild(revoke);
        }
        return [el("span", { "class": "token-name", text: t.name }), t.scope,
                t.projects.length ? t.projects.join(", ") : "all", when(t.created_at_ms), when(t.expires_at_ms),
                el("span", { "class": "token-state", "data-token": t.name, text: t.state }), actions];
      });
      var name = input({ required: "required", autocomplete: "off" });
      var scope = select(["read", "run", "write", "admin"], "read");
      var projects = input({ autocomplete: "off" });
      var days = input({ type: "number", min: "1" });
      var error = el("p", { id: "form-error", "class": "bad", role: "alert" });
      var form = el("form", { id: "token-form", "class": "edit" },
        el("h2", { text: "Make a token" }), field("k-name", "Name", name), field("k-scope", "Scope", scope),
        field("k-projects", "Limited to projects", projects, "comma separated; empty: every project"),
        field("k-days", "Expires after (days)", days, "empty: never"),
        el("p", null, el("button", { type: "submit", id: "token-create", text: "Make token" })), error);
      form.addEventListener("submit", function (e) {
        e.preventDefault();
        var body = { name: name.value.trim(), scope: scope.value, projects: words(projects.value) };
        if (days.value) body.expires_in_ms = Math.round(Number(days.value) * 86400000);
        api("POST", "/api/v1/tokens", body).then(function (t) { tokens(t); }, function (err) { error.textContent = err.message; });
      });
      var once = null;
      if (made) {
        var secret = el("input", { id: "new-secret", readonly: "readonly", value: made.secret, size: "40",
                                   "aria-describedby": "new-secret-hint" });
        once = el("div", { "class": "once", role: "status" },
                  el("label", { "for": "new-secret", text: "The secret of token " + made.name }), secret,
                  el("small", { id: "new-secret-hint", text: "Copy it now: it is shown this once and the host keeps only its digest." }));
      }
      show(el("h1", { text: "Tokens" }), once,
           rows.length ? table(["name", "scope", "projects", "created (UTC)", "expires (UTC)", "state", ""], rows)
                       : el("p", { "class": "muted", text: "no tokens" }), form);
      if (made) $("new-secret").select();
    }, failed);
  }

  function route() {
    viewGeneration++;
    clearTimeout(timer);
    unfollow();
    if (!who) return;
    var hash = location.hash || "#/overview";
    var q = hash.indexOf("?");
    var path = q < 0 ? hash : hash.slice(0, q);
    var params = q < 0 ? "" : hash.slice(q + 1);
    if (path.indexOf("#/run/") === 0) return run(decodeURIComponent(path.slice(6)));
    if (path === "#/tasks") return tasks();
    if (path === "#/task") return taskForm(params);
    if (path === "#/triggers") return triggers();
    if (path === "#/trigger") return triggerForm(params);
    if (path === "#/skips") return skips();
    if (path === "#/workers") return workers();
    if (path === "#/notifications" && who.projects === null) return notifications(params);
    if (path === "#/audit" && may("admin") && who.projects === null) return audit();
    if (path === "#/tokens" && may("admin") && who.projects === null) return tokens();
    if (path === "#/runs") return runs(params);
    return who.projects === null ? overview() : tasks();
  }

  function signedIn(me) {
    who = me;
    $("signin").hidden = true;
    $("nav").hidden = false;
    $("signout").hidden = false;
    $("who").textContent = me.name + " (" + me.scope + ")";
    // tokens, the audit log, the status and deliveries span every project: a token limited to
    // some is not offered them (the API refuses it too)
    Array.prototype.forEach.call(document.querySelectorAll("#nav .admin"), function (a) {
      a.hidden = !may("admin") || me.projects !== null;
    });
    $("nav-notifications").hidden = me.projects !== null;
    $("nav-overview").hidden = me.projects !== null;
    route();
  }
  function signedOut(message) {
    who = null;
    clearTimeout(timer);
    unfollow();
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
