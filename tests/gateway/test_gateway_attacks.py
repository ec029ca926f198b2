"""Attacks by a holder of one worker's token, each with a real second registered worker, through a
real ``qinglong api`` over TCP on real PostgreSQL (both builds). Each test asserts the HTTP answer
and that the store did not change; its docstring says what would be stolen or killed otherwise."""

from __future__ import annotations

import base64
import concurrent.futures
import socket

import psycopg
import pytest

from qinglong.contracts.worker import new_lease_token
from qinglong.host.http.gateway import MAX_REQUESTS_PER_WORKER
from tests.gateway.helpers import ApiGateway, WorkerHttp, cli, plane_settings, register
from tests.worker.helpers import PROJECT, admit, publish_task, py_job, run_state, wait_until

LEASE_MS = 30_000
#: What a worker's calls can change, read as the superuser.
STORE_TABLES = {
    "worker_sessions": "worker_id",
    "attempts": "attempt_id",
    "runs": "run_id",
    "attempt_logs": "attempt_id, offset_bytes",
    "worker_registrations": "worker_id",
    "run_events": "1",
}


def dump(db) -> dict[str, list]:
    return {table: db.sql(f"SELECT * FROM qinglong.{table} ORDER BY {order}") for table, order in STORE_TABLES.items()}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Plane:
    def __init__(self, cluster, tmp_path, **settings) -> None:
        self.db = cluster
        self.settings = plane_settings(cluster, tmp_path, **settings)
        self.token_a = register(self.settings, "alice", labels=("linux",), projects=(PROJECT,), capacity=1)
        self.token_b = register(self.settings, "bob", labels=(), projects=("elsewhere",), capacity=1)
        self.api = ApiGateway(self.settings, tmp_path / "api.stderr")
        self.alice = WorkerHttp(self.api.port, self.token_a)
        self.bob = WorkerHttp(self.api.port, self.token_b)

    def open(self, client: WorkerHttp, **body) -> dict:
        status, session = client.call("open_session", {"lease_ms": LEASE_MS, **body})
        assert status == 200, session
        return session

    def close(self) -> None:
        self.alice.close()
        self.bob.close()
        self.api.stop()


@pytest.fixture
def plane(cluster, tmp_path):
    p = Plane(cluster, tmp_path)
    yield p
    p.close()


def fence(session: dict) -> dict:
    return {"session_id": session["session_id"], "generation": session["generation"]}


def claim_one(plane: Plane, client: WorkerHttp, session: dict) -> dict:
    status, answer = client.call("claim", {**fence(session), "tokens": [b64(new_lease_token())], "wait_ms": 0})
    assert status == 200, answer
    (claimed,) = answer["claimed"]
    return claimed


def test_a_token_opens_sessions_only_for_its_own_worker_id(plane):
    """Otherwise bob's token could open a session as alice, bump her generation and so fence her:
    alice would kill her own jobs and stop (a denial of service from any one worker's token)."""
    alice = plane.open(plane.alice)
    before = plane.db.sql("SELECT generation, session_id FROM qinglong.worker_sessions WHERE worker_id = 'alice'")
    bob = plane.open(plane.bob, worker_id="alice", labels=["linux"], capacity=256)
    assert bob["worker_id"] == "bob"
    after = plane.db.sql("SELECT generation, session_id FROM qinglong.worker_sessions WHERE worker_id = 'alice'")
    assert after == before
    # alice's session still answers; bob cannot heartbeat it even knowing its fence
    assert plane.alice.call("heartbeat", {**fence(alice), "running": []})[0] == 200
    snapshot = dump(plane.db)
    status, answer = plane.bob.call("heartbeat", {**fence(alice), "running": [], "worker_id": "alice"})
    assert (status, answer["error"]["code"]) == (409, "session_fenced")
    assert dump(plane.db)["worker_sessions"] == snapshot["worker_sessions"]


def test_labels_and_capacity_come_from_the_registration_not_the_request(plane):
    """Otherwise bob could declare a label he was never given (a gpu pool's Runs, their payloads and
    env secrets) or a capacity of 256 and hoard the queue under long leases."""
    trigger = publish_task(plane.db, "gpu-job", {"command": py_job("pass"), "labels": ["gpu"]})
    run_id = admit(plane.db, trigger)
    session = plane.open(plane.bob, labels=["gpu"], capacity=256)
    assert (session["labels"], session["capacity"]) == ([], 1)
    stored = plane.db.sql("SELECT labels, capacity FROM qinglong.worker_sessions WHERE worker_id = 'bob'")
    assert stored == [([], 1)]
    snapshot = dump(plane.db)
    status, answer = plane.bob.call("claim", {**fence(session), "tokens": [b64(new_lease_token())], "wait_ms": 0})
    assert (status, answer) == (200, {"claimed": []})
    assert run_state(plane.db, run_id) == "queued"
    assert dump(plane.db) == snapshot


def test_a_worker_is_offered_only_runs_of_its_registered_projects(plane):
    """Otherwise bob, registered for project 'elsewhere', could take project wp's Runs and read their
    payloads and env secrets."""
    trigger = publish_task(plane.db, "plain", {"command": py_job("pass"), "env": {"SECRET": "hunter2"}})
    run_id = admit(plane.db, trigger)
    session = plane.open(plane.bob)
    snapshot = dump(plane.db)
    status, answer = plane.bob.call("claim", {**fence(session), "tokens": [b64(new_lease_token())], "wait_ms": 0})
    assert (status, answer) == (200, {"claimed": []})
    assert dump(plane.db) == snapshot
    assert run_state(plane.db, run_id) == "queued"


def test_another_sessions_heartbeat_started_log_and_complete_are_refused(plane):
    """Otherwise bob, holding alice's session fence and even her lease token, could keep her Attempt
    alive, start it, write into its log or invent its outcome: the Run's result would be his."""
    trigger = publish_task(plane.db, "victim", {"command": py_job("pass"), "labels": ["linux"]})
    admit(plane.db, trigger)
    alice = plane.open(plane.alice)
    claimed = claim_one(plane, plane.alice, alice)
    plane.open(plane.bob)
    snapshot = dump(plane.db)
    stolen = {**fence(alice), "lease": claimed["lease"]}
    outcome = {"state": "succeeded", "exit_code": 0, "signal": None, "log_bytes": 0, "log_dropped_bytes": 0,
               "reason": None}
    calls = [("heartbeat", {**fence(alice), "running": [claimed["lease"]["attempt_id"]]}),
             ("started", stolen),
             ("append_log", {**stolen, "offset": 0, "data": b64(b"forged\n")}),
             ("complete", {**stolen, "outcome": outcome, "started": True, "log_missing_bytes": 0}),
             ("close_session", fence(alice))]
    for name, body in calls:
        status, answer = plane.bob.call(name, body)
        assert (status, answer["error"]["code"]) == (409, "session_fenced"), (name, answer)
    # complete_late needs no session: bob's id is not the one that leased it
    status, answer = plane.bob.call("complete_late", {"lease": claimed["lease"], "outcome": outcome})
    assert (status, answer["error"]["code"]) == (409, "lease_fenced")
    assert dump(plane.db) == snapshot
    # alice's own calls still work
    assert plane.alice.call("started", stolen)[0] == 200


def test_a_claim_beyond_the_registered_capacity_is_refused_and_the_store_bounds_it(plane):
    """Otherwise one worker could take the whole queue at once and sit on it under its lease, while
    every other worker idles (hoarding)."""
    for n in range(3):
        admit(plane.db, publish_task(plane.db, f"hoard-{n}", {"command": py_job("pass"), "labels": ["linux"]}))
    session = plane.open(plane.alice)
    snapshot = dump(plane.db)
    tokens = [b64(new_lease_token()) for _ in range(3)]
    status, answer = plane.alice.call("claim", {**fence(session), "tokens": tokens, "wait_ms": 0})
    assert (status, answer["error"]["code"]) == (400, "bad_worker_call")
    assert dump(plane.db) == snapshot
    claim_one(plane, plane.alice, session)
    status, answer = plane.alice.call("claim", {**fence(session), "tokens": tokens[:1], "wait_ms": 0})
    assert (status, answer) == (200, {"claimed": []})
    assert plane.db.count("attempts", "state = 'dispatching'") == 1


def test_a_revoked_token_is_refused_at_once_and_its_runs_are_handed_over(plane):
    """Otherwise a stolen token, once revoked, would keep its session and the Runs it holds until
    the lease ran out, and could keep renewing them for ever."""
    trigger = publish_task(plane.db, "held", {"command": py_job("pass"), "labels": ["linux"]})
    run_id = admit(plane.db, trigger)
    session = plane.open(plane.alice)
    claimed = claim_one(plane, plane.alice, session)
    out = cli(plane.settings, "worker", "revoke", "alice").stdout
    assert "1 Attempt(s) handed over" in out
    assert plane.db.sql("SELECT closed_at_ms IS NOT NULL FROM qinglong.worker_sessions "
                        "WHERE worker_id = 'alice'") == [(True,)]
    assert run_state(plane.db, run_id) == "queued"  # never started: straight back to the queue
    snapshot = dump(plane.db)
    for name, body in (("heartbeat", {**fence(session), "running": [claimed["lease"]["attempt_id"]]}),
                       ("started", {**fence(session), "lease": claimed["lease"]}),
                       ("open_session", {"lease_ms": LEASE_MS})):
        status, answer = plane.alice.call(name, body)
        assert (status, answer["error"]["code"]) == (401, "unauthorized"), name
    assert dump(plane.db) == snapshot
    # bob's token is untouched by alice's revocation
    assert plane.bob.call("open_session", {"lease_ms": LEASE_MS})[0] == 200


def test_a_rotated_token_replaces_the_old_one(plane):
    """Otherwise a leaked token could not be retired without re-registering the worker, or both the
    old and the new token would open sessions."""
    new = cli(plane.settings, "worker", "rotate", "alice").stdout.strip()
    assert new.startswith("qlw_") and new != plane.token_a
    assert plane.alice.call("open_session", {"lease_ms": LEASE_MS})[0] == 401
    assert plane.alice.call("open_session", {"lease_ms": LEASE_MS}, token=new)[0] == 200
    listing = cli(plane.settings, "worker", "list", "--json").stdout
    assert plane.token_a not in listing and new not in listing


def test_a_claim_waiting_when_its_token_is_rotated_takes_nothing_after_the_wait(plane):
    """A claim authenticated before a rotation waited at the gateway (up to 20 s) and, woken,
    claimed again under the identity it started with: the holder of the leaked, just-rotated
    token received the next Run, its payload and env secrets. After each wait the claim checks
    its token again; the Run stays queued for the worker holding the new token.

    The order is forced without timing: alice (capacity 1) holds one started Run and a second is
    queued; the claim is held on her session's row (locked here) past its authentication, the
    token is rotated, the row released (the claim finds no free slot and waits), the first Run
    completes with the new token, and a wake-up is sent."""
    import threading

    tasks = [publish_task(plane.db, f"rotated-{n}", {"command": py_job("pass"), "labels": ["linux"]})
             for n in range(2)]
    first = admit(plane.db, tasks[0])
    alice = plane.open(plane.alice)
    held = claim_one(plane, plane.alice, alice)
    assert plane.alice.call("started", {**fence(alice), "lease": held["lease"]})[0] == 200
    second = admit(plane.db, tasks[1])
    answers: list = []

    def waiting_claim() -> None:
        client = WorkerHttp(plane.api.port, plane.token_a)
        try:
            answers.append(client.call("claim", {**fence(alice), "tokens": [b64(new_lease_token())],
                                                 "wait_ms": 20_000}))
        finally:
            client.close()

    holder = psycopg.connect(plane.db.superuser_dsn())
    try:
        holder.execute("SELECT 1 FROM qinglong.worker_sessions WHERE worker_id = 'alice' FOR UPDATE")
        claim = threading.Thread(target=waiting_claim)
        claim.start()
        wait_until(lambda: plane.db.sql(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.pid <> %s", (holder.info.backend_pid,))[0][0] > 0,
            "the claim, authenticated, to wait for alice's session row")
        new = cli(plane.settings, "worker", "rotate", "alice").stdout.strip()
    finally:
        holder.rollback()
        holder.close()
    outcome = {"state": "succeeded", "exit_code": 0, "signal": None, "log_bytes": 0, "log_dropped_bytes": 0,
               "reason": None}
    status, answer = plane.alice.call("complete", {**fence(alice), "lease": held["lease"], "outcome": outcome,
                                                  "started": True, "log_missing_bytes": 0}, token=new)
    assert status == 200, answer
    assert run_state(plane.db, first) == "succeeded"
    plane.db.sql("NOTIFY qinglong_claimable")
    claim.join()
    ((status, answer),) = answers
    assert (status, answer) == (200, {"claimed": []}), answer
    assert run_state(plane.db, second) == "queued"
    # the worker holding the new token takes it
    status, answer = plane.alice.call("claim", {**fence(alice), "tokens": [b64(new_lease_token())], "wait_ms": 0},
                                      token=new)
    assert status == 200 and [c["run_id"] for c in answer["claimed"]] == [second], answer


def test_tokens_open_only_their_own_side_of_the_api(plane):
    """Otherwise a worker's token would reach the management API (publish tasks, read every
    Run) or an operator's API token would act as a worker."""
    api_token = cli(plane.settings, "token", "create", "ops", "--scope", "admin").stdout.strip()
    snapshot = dump(plane.db)
    status, answer = plane.alice.call("open_session", {"lease_ms": LEASE_MS}, token=api_token)
    assert (status, answer["error"]["code"]) == (401, "unauthorized")
    plane.alice.conn.request("GET", "/api/v1/projects", headers={"Authorization": f"Bearer {plane.token_a}"})
    response = plane.alice.conn.getresponse()
    response.read()
    assert response.status == 401
    assert dump(plane.db) == snapshot


def test_a_worker_holds_no_database_credential_and_cannot_exhaust_connections(plane, tmp_path):
    """Before, every worker held the shared worker login: it could ALTER ROLE it (lock every
    worker out), set role defaults, or open 197 of 200 connections. A worker now holds only its
    token, which PostgreSQL does not accept, and any number of waiting claims share the gateway's
    bounded pool (of one worker's, a few are served at once and the others refused at once)."""
    server = plane.db.server
    for user in ("qinglong_gateway", "alice"):
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(server.dsn(user, plane.token_a, plane.db.dbname), connect_timeout=5).close()
    sessions = [plane.open(WorkerHttp(plane.api.port, plane.token_a))]

    def waiting_claim(_: int) -> tuple[int, str | None]:
        client = WorkerHttp(plane.api.port, plane.token_a)
        try:
            status, answer = client.call("claim", {**fence(sessions[0]), "tokens": [b64(new_lease_token())],
                                                   "wait_ms": 3_000})
            return status, (answer.get("error") or {}).get("code")
        finally:
            client.close()

    def gateway_connections() -> int:
        return plane.db.sql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'qinglong_gateway' "
                            "AND datname = current_database()")[0][0]

    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        statuses = list(pool.map(waiting_claim, range(40)))
    # one worker's requests beyond the few served at once are refused at once, never queued
    assert set(statuses) <= {(200, None), (503, "worker_busy")}, statuses
    assert statuses.count((200, None)) >= 4
    assert gateway_connections() <= 2 + 1  # the pool (2) and the listener


def test_unauthenticated_slow_bodies_never_hold_the_workers_out(plane):
    """Anyone could open connections to the console's sign-in, which reads a body before any
    token is checked, send the head and one byte of the body, and hold every one of the requests
    served at once: each worker's heartbeat and claim was then answered 503 "too many requests at
    once" for as long as the attacker kept it up, and a worker that cannot renew its session
    stops its jobs at its self-fence (every Run of the fleet lost to an anonymous client). A
    request now counts against that bound only once its whole body has arrived; a slow one holds
    only its own connection, until its deadline."""
    session = plane.open(plane.alice)
    head = (b"POST /console/session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{")
    held = []
    try:
        for _ in range(80):  # more than [http] max_connections (64 here)
            conn = socket.create_connection(("127.0.0.1", plane.api.port), timeout=60)
            conn.sendall(head)
            held.append(conn)
        snapshot = dump(plane.db)
        worker = WorkerHttp(plane.api.port, plane.token_a)  # its kept-alive one was evicted, idle
        try:
            status, answer = worker.call("claim", {**fence(session), "tokens": [b64(new_lease_token())],
                                                   "wait_ms": 0})
            assert (status, answer) == (200, {"claimed": []}), answer
            assert dump(plane.db) == snapshot
            status, answer = worker.call("heartbeat", {**fence(session), "running": []})
            assert status == 200, answer
        finally:
            worker.close()
    finally:
        for conn in held:
            conn.close()


def _claims_of(plane: Plane, token: str, session: dict, statuses: list[int], *, wait_ms: int,
               count: int = 70) -> list:
    """``count`` claims of one worker at once, each on its own connection, started; each
    answer's status goes to ``statuses`` (0: its connection was cut as the oldest idle one, so
    it was neither served nor holding anything)."""
    import threading

    lock = threading.Lock()

    def claim() -> None:
        client = WorkerHttp(plane.api.port, token)
        try:
            status, _ = client.call("claim", {**fence(session), "tokens": [b64(new_lease_token())],
                                              "wait_ms": wait_ms})
        except (ConnectionError, OSError):
            status = 0
        finally:
            client.close()
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=claim) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def test_one_workers_waiting_claims_never_hold_the_other_workers_out(plane):
    """Bob's token alone (registered for one job of another project) could send 70 claims that
    each wait 20 s at the gateway, hold every request served at once, and so get alice's
    heartbeat answered 503 again and again: alice stops her jobs at her self-fence, and so does
    every other worker of the fleet, for one stolen token. A worker now has at most a few
    requests served at once; the rest of its requests are refused at once, and its claims change
    nothing in the store."""
    alice = plane.open(plane.alice)
    bob = plane.open(plane.bob)
    statuses: list[int] = []
    snapshot = dump(plane.db)
    threads = _claims_of(plane, plane.token_b, bob, statuses, wait_ms=20_000)
    # 70 claims against 64 requests served at once: once some are answered, the rest are held
    # (before, 64 of them for their whole 20 s wait) when alice speaks
    wait_until(lambda: len(statuses) >= 70 - 64, "bob's first claims answered")
    worker = WorkerHttp(plane.api.port, plane.token_a)
    try:
        status, answer = worker.call("heartbeat", {**fence(alice), "running": []})
        assert status == 200, answer
    finally:
        worker.close()
    for thread in threads:
        thread.join()
    assert set(statuses) <= {0, 200, 503}, statuses
    assert dump(plane.db)["attempts"] == snapshot["attempts"]


def test_one_token_waiting_to_be_identified_never_holds_the_api_tier_out(plane):
    """While the store is slow to say whose a token is, each of bob's requests waited for that
    answer holding one of the requests the API tier serves at once: 70 of them held all 64, and
    every other request (alice's heartbeat, an operator's call) was answered 503 "too many
    requests at once"; at her self-fence alice stops her jobs. The store is held here (its
    registrations locked) so that no identification can finish: bob's requests beyond a few are
    refused at once by the token they present, the API tier keeps serving others, and once the
    store is back alice's heartbeat is answered and nothing of bob's changed the store."""
    alice = plane.open(plane.alice)
    bob = plane.open(plane.bob)
    snapshot = dump(plane.db)
    statuses: list[int] = []
    holder = psycopg.connect(plane.db.superuser_dsn())
    try:
        holder.execute("LOCK TABLE qinglong.worker_registrations IN ACCESS EXCLUSIVE MODE")
        threads = _claims_of(plane, plane.token_b, bob, statuses, wait_ms=0)
        # no identification can finish: whatever is answered now was refused by the token alone
        wait_until(lambda: len(statuses) >= 70 - MAX_REQUESTS_PER_WORKER, "bob's extra claims refused at once")
        assert 200 not in statuses, statuses  # 503 worker_busy, or 0: cut as an idle connection
        # and the API tier still serves a request that needs no identification
        answer = socket.create_connection(("127.0.0.1", plane.api.port), timeout=60)
        try:
            answer.sendall(b"GET /api/v1/projects HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            first = answer.recv(64)
        finally:
            answer.close()
        assert first.startswith(b"HTTP/1.1 401"), first
    finally:
        holder.rollback()
        holder.close()
    for thread in threads:
        thread.join()
    worker = WorkerHttp(plane.api.port, plane.token_a)  # its kept-alive one was evicted, idle
    try:
        status, answer = worker.call("heartbeat", {**fence(alice), "running": []})
    finally:
        worker.close()
    assert status == 200, answer
    assert set(statuses) <= {0, 200, 503}, statuses
    assert dump(plane.db)["attempts"] == snapshot["attempts"]


def test_reopening_sessions_never_holds_more_leases_than_the_registered_capacity(plane):
    """Alice (capacity 1) could claim, open a new session (the next generation), claim again and
    so on: each claim counted only the current session's Attempts, while the earlier sessions'
    stayed leased until their leases ran out. One token could so take the whole queue, every
    Run's payload and env secrets with it, and hold it for the lease (up to ten minutes, again
    and again) while every other worker idled. Earlier generations' live leases now count."""
    runs = [admit(plane.db, publish_task(plane.db, f"reopen-{n}", {"command": py_job("pass"),
                                                                   "labels": ["linux"]}))
            for n in range(3)]
    session = plane.open(plane.alice)
    claim_one(plane, plane.alice, session)
    for _ in range(2):
        session = plane.open(plane.alice)
        snapshot = dump(plane.db)
        status, answer = plane.alice.call("claim", {**fence(session), "tokens": [b64(new_lease_token())],
                                                    "wait_ms": 0})
        assert (status, answer) == (200, {"claimed": []})
        assert dump(plane.db) == snapshot
    held = plane.db.sql("SELECT count(*) FROM qinglong.attempts WHERE worker_id = 'alice' "
                        "AND state IN ('dispatching', 'running')")
    assert held == [(1,)]
    assert sorted(run_state(plane.db, r) for r in runs) == ["dispatching", "queued", "queued"]


def test_malformed_ids_and_out_of_range_numbers_are_refused_as_bad_calls(plane):
    """A session id, Attempt id or number the store cannot even cast (``"x"`` for a uuid, 2**70
    for a bigint) failed inside the database, so the gateway took it for a broken store: it
    dropped its pooled connection, warned the operator that the store was unavailable and told
    the worker to retry (503). Any one token could so keep the gateway reconnecting and the
    operator chasing a store outage that is not there. Each is now a 400 naming the field, with
    the store unchanged and no store warning."""
    trigger = publish_task(plane.db, "shapes", {"command": py_job("pass"), "labels": ["linux"]})
    admit(plane.db, trigger)
    session = plane.open(plane.alice)
    claimed = claim_one(plane, plane.alice, session)
    lease = claimed["lease"]
    outcome = {"state": "succeeded", "exit_code": 0, "signal": None, "log_bytes": 0, "log_dropped_bytes": 0,
               "reason": None}
    huge = 2 ** 70
    calls = [
        ("heartbeat", {"session_id": "x", "generation": session["generation"], "running": []}),
        ("heartbeat", {**fence(session), "generation": huge, "running": []}),
        ("heartbeat", {**fence(session), "running": ["not-an-attempt-id"]}),
        ("claim", {"session_id": "x", "generation": 1, "tokens": [b64(new_lease_token())], "wait_ms": 0}),
        ("started", {**fence(session), "lease": {**lease, "attempt_id": "x"}}),
        ("started", {**fence(session), "lease": {**lease, "lease_version": huge}}),
        ("append_log", {**fence(session), "lease": lease, "offset": huge, "data": b64(b"x")}),
        ("complete", {**fence(session), "lease": lease, "outcome": {**outcome, "exit_code": huge},
                      "started": True, "log_missing_bytes": 0}),
        ("complete", {**fence(session), "lease": lease, "outcome": outcome, "started": True,
                      "log_missing_bytes": huge}),
        ("complete_late", {"lease": {**lease, "attempt_id": "x"}, "outcome": outcome}),
        ("close_session", {"session_id": "x", "generation": 1}),
        ("open_session", {"lease_ms": huge}),
    ]
    snapshot = dump(plane.db)
    for name, body in calls:
        status, answer = plane.alice.call(name, body)
        assert (status, answer["error"]["code"]) == (400, "bad_worker_call"), (name, body, answer)
    assert dump(plane.db) == snapshot
    assert "gateway.store_unavailable" not in plane.api.text()
    assert plane.alice.call("started", {**fence(session), "lease": lease})[0] == 200
