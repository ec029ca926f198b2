"""The worker protocol on the wire: ``/worker/v1/...`` of the API tier, JSON both ways.

One rule, shared by the gateway (the host) and the worker's HTTP client: the paths, how each
message becomes JSON and back (bytes as base64, the store's times as integers), and which answer
means which refusal. A worker never names its own id: the gateway takes it from the token.

Answers: 200 with the reply; 409 ``session_fenced`` (``reason``: replaced, expired, closed) or
``lease_fenced``; 400 ``bad_worker_call``; 507 ``log_refused``; 503 ``store_unavailable`` (try the
same call again); 503 ``schema_not_ready`` (a worker function missing or its EXECUTE revoked) and
500 ``store_failed`` or ``internal`` (a defect of the store or the gateway): the worker reports
each as an error and tries again only after a growing pause; 401 an unknown,
revoked or missing token; 429 too many failed authentications.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any, Mapping

from .errors import StoreFailed, StoreNotReady, StoreUnavailable
from .execution import AttemptOutcome, AttemptState, CancelReason, RunState
from .worker import (
    OWN_STOP_REASONS,
    BadWorkerCall,
    ClaimedAttempt,
    CompletionReply,
    CompletionResult,
    FenceRefused,
    HeartbeatReply,
    LeaseFence,
    LeaseFenced,
    LogRefused,
    OwnStop,
    Session,
    SessionFence,
    SessionFenced,
    StartedReply,
    StopOrder,
    bounded_event_payload,
)

PREFIX = "/worker/v1"
PATHS = {name: f"{PREFIX}/{name}" for name in (
    "open_session", "heartbeat", "claim", "started", "append_log", "complete", "complete_and_claim",
    "complete_late", "close_session")}
#: The realm of the gateway's 401 (``WWW-Authenticate``): a refusal of the worker's token, told
#: apart from a 401 of anything else at the URL (an API tier without the gateway, a proxy).
GATEWAY_REALM = "qinglong-worker"
#: The longest a claim may wait for a Run to become claimable, ms (the gateway bounds it lower).
MAX_CLAIM_WAIT_MS = 60_000


class WireError(BadWorkerCall):
    """A message that is not what the protocol says (a field missing or of the wrong type)."""


def b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def unb64(text: Any, name: str) -> bytes:
    if not isinstance(text, str):
        raise WireError(f"{name}: expected base64 text")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise WireError(f"{name}: expected base64 text") from None


def field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], *, optional: bool = False,
          bits: int = 64) -> Any:
    """``body[name]`` if it is a ``kind``; an integer must fit in ``bits`` signed bits (the
    store's column), so a number it cannot cast is refused here, naming the field."""
    value = body.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise WireError(f"{name}: expected {getattr(kind, '__name__', kind)}")
    if isinstance(value, int) and not isinstance(value, bool) and not -(1 << bits - 1) <= value < 1 << bits - 1:
        raise WireError(f"{name}: expected an integer of at most {bits} bits")
    return value


def uuid_text(value: Any, name: str) -> str:
    """``value`` as a canonical UUID (a session or Attempt id), or a WireError naming ``name``."""
    if not isinstance(value, str) or len(value) > 64:
        raise WireError(f"{name}: expected a UUID")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise WireError(f"{name}: expected a UUID") from None


# ------------------------------------------------------------------------------ fences


def fence_json(fence: SessionFence) -> dict[str, Any]:
    return {"session_id": fence.session_id, "generation": fence.generation}


def fence_of(body: Mapping[str, Any], worker_id: str) -> SessionFence:
    """The session fence a request names, under the worker id its token authenticated."""
    return SessionFence(worker_id, field(body, "session_id", str), field(body, "generation", int))


def lease_json(lease: LeaseFence) -> dict[str, Any]:
    return {"attempt_id": lease.attempt_id, "lease_version": lease.lease_version, "token": b64(lease.token)}


def lease_of(body: Mapping[str, Any]) -> LeaseFence:
    lease = field(body, "lease", dict)
    return LeaseFence(field(lease, "attempt_id", str), field(lease, "lease_version", int),
                      unb64(lease.get("token"), "lease.token"))


def outcome_json(outcome: AttemptOutcome) -> dict[str, Any]:
    return {"state": outcome.state.value, "exit_code": outcome.exit_code, "signal": outcome.signal,
            "log_bytes": outcome.log_bytes, "log_dropped_bytes": outcome.log_dropped_bytes,
            "reason": outcome.reason}


def outcome_of(body: Mapping[str, Any]) -> AttemptOutcome:
    data = field(body, "outcome", dict)
    try:
        state = AttemptState(field(data, "state", str))
    except ValueError:
        raise WireError("outcome.state: expected an Attempt state") from None
    return AttemptOutcome(state, field(data, "exit_code", int, optional=True, bits=32),
                          field(data, "signal", int, optional=True, bits=32),
                          log_bytes=field(data, "log_bytes", int, optional=True),
                          log_dropped_bytes=field(data, "log_dropped_bytes", int, optional=True) or 0,
                          reason=field(data, "reason", str, optional=True))


def own_stop_json(stop: OwnStop) -> dict[str, Any]:
    """A completion's ``own_stop``: ``{"reason": "timeout", "age_ms": 1200}``."""
    return {"reason": CancelReason(stop.reason).value, "age_ms": max(0, int(stop.age_ms))}


def own_stop_of(body: Mapping[str, Any]) -> OwnStop | None:
    """The completion's ``own_stop``, or None where the body has none (a worker of an earlier
    build sends none: its completion is taken as before)."""
    data = field(body, "own_stop", dict, optional=True)
    if data is None:
        return None
    try:
        reason = CancelReason(field(data, "reason", str))
    except ValueError:
        reason = None
    if reason not in OWN_STOP_REASONS:
        raise WireError("own_stop.reason: expected " + " or ".join(r.value for r in OWN_STOP_REASONS))
    age_ms = field(data, "age_ms", int)
    if age_ms < 0:
        raise WireError("own_stop.age_ms: expected an integer >= 0")
    return OwnStop(reason, age_ms)


def exit_age_of(body: Mapping[str, Any]) -> int | None:
    """The completion's ``exit_age_ms`` (how long before the call the job exited, on the worker's
    clock), or None where the body has none (a worker of an earlier build: the end is the call's)."""
    age_ms = field(body, "exit_age_ms", int, optional=True)
    if age_ms is not None and age_ms < 0:
        raise WireError("exit_age_ms: expected an integer >= 0")
    return age_ms


# ------------------------------------------------------------------------------ replies


def session_json(session: Session) -> dict[str, Any]:
    return {**fence_json(session.fence), "worker_id": session.fence.worker_id, "lease_ms": session.lease_ms,
            "capacity": session.capacity, "labels": list(session.labels),
            "lease_expires_at_ms": session.lease_expires_at_ms, "db_now_ms": session.db_now_ms}


def session_of(data: Mapping[str, Any]) -> Session:
    fence = SessionFence(field(data, "worker_id", str), field(data, "session_id", str), field(data, "generation", int))
    return Session(fence, field(data, "lease_ms", int), field(data, "capacity", int),
                   tuple(field(data, "labels", list)), field(data, "lease_expires_at_ms", int),
                   field(data, "db_now_ms", int))


def heartbeat_json(reply: HeartbeatReply) -> dict[str, Any]:
    return {"lease_expires_at_ms": reply.lease_expires_at_ms, "db_now_ms": reply.db_now_ms,
            "stop": [[s.attempt_id, s.reason] for s in reply.stop]}


def heartbeat_of(data: Mapping[str, Any]) -> HeartbeatReply:
    stops = tuple(StopOrder(str(a), str(r)) for a, r in field(data, "stop", list))
    return HeartbeatReply(field(data, "lease_expires_at_ms", int), field(data, "db_now_ms", int), stops)


def claimed_json(claimed: ClaimedAttempt) -> dict[str, Any]:
    return {"run_id": claimed.run_id, "attempt_no": claimed.attempt_no, "project_id": claimed.project_id,
            "task_id": claimed.task_id, "task_revision": claimed.task_revision,
            "scheduled_for_ms": claimed.scheduled_for_ms, "payload": dict(claimed.payload),
            "lease": lease_json(claimed.lease), "lease_expires_at_ms": claimed.lease_expires_at_ms,
            "db_now_ms": claimed.db_now_ms, "event_payload": claimed.event_payload}


def claimed_of(data: Mapping[str, Any]) -> ClaimedAttempt:
    lease = lease_of(data)
    return ClaimedAttempt(field(data, "run_id", str), lease.attempt_id, field(data, "attempt_no", int),
                          field(data, "project_id", str), field(data, "task_id", str),
                          field(data, "task_revision", int), field(data, "scheduled_for_ms", int),
                          field(data, "payload", dict), lease, field(data, "lease_expires_at_ms", int),
                          field(data, "db_now_ms", int),
                          bounded_event_payload(field(data, "event_payload", str, optional=True)))


def started_json(reply: StartedReply) -> dict[str, Any]:
    return {"deadline_ms": reply.deadline_ms, "db_now_ms": reply.db_now_ms}


def started_of(data: Mapping[str, Any]) -> StartedReply:
    return StartedReply(field(data, "deadline_ms", int), field(data, "db_now_ms", int))


def completion_json(reply: CompletionReply) -> dict[str, Any]:
    return {"result": reply.result.value, "run_state": reply.run_state.value,
            "log_bytes_stored": reply.log_bytes_stored, "next_attempt_no": reply.next_attempt_no,
            "next_not_before_ms": reply.next_not_before_ms}


def completion_of(data: Mapping[str, Any]) -> CompletionReply:
    return CompletionReply(CompletionResult(field(data, "result", str)), RunState(field(data, "run_state", str)),
                           field(data, "log_bytes_stored", int), field(data, "next_attempt_no", int, optional=True),
                           field(data, "next_not_before_ms", int, optional=True))


def completion_and_claims_of(data: Mapping[str, Any]) -> tuple[CompletionReply, list[ClaimedAttempt]]:
    """``complete_and_claim``'s answer: ``{"completion": ..., "claimed": [...]}``."""
    return (completion_of(field(data, "completion", dict)),
            [claimed_of(item) for item in field(data, "claimed", list)])


# ------------------------------------------------------------------------------ refusals


def refusal_json(exc: BaseException) -> tuple[int, dict[str, Any]] | None:
    """The status and body of a refusal of the protocol, or None for anything else."""
    if isinstance(exc, SessionFenced):
        return 409, {"error": {"code": "session_fenced", "reason": exc.reason, "message": exc.message}}
    if isinstance(exc, LeaseFenced):
        return 409, {"error": {"code": "lease_fenced", "reason": exc.reason, "message": exc.message}}
    if isinstance(exc, LogRefused):
        return 507, {"error": {"code": "log_refused", "message": str(exc)}}
    if isinstance(exc, BadWorkerCall):
        return 400, {"error": {"code": "bad_worker_call", "message": str(exc)}}
    if isinstance(exc, StoreFailed):
        return 500, {"error": {"code": "store_failed", "message": str(exc)}}
    if isinstance(exc, StoreUnavailable):
        return 503, {"error": {"code": "store_unavailable", "message": str(exc)}}
    return None


def refusal_of(status: int, body: Mapping[str, Any]) -> Exception:
    """The exception a refusal answer stands for (a client raises it)."""
    error = body.get("error") if isinstance(body, Mapping) else None
    error = error if isinstance(error, Mapping) else {}
    code, message = str(error.get("code", "")), str(error.get("message", f"HTTP {status}"))
    reason = str(error.get("reason") or code)
    if code == "session_fenced":
        return SessionFenced(reason, message)
    if code == "lease_fenced":
        return LeaseFenced(reason, message)
    if code == "log_refused":
        return LogRefused(message)
    if code == "bad_worker_call" or status == 400:
        return BadWorkerCall(message)
    if code == "schema_not_ready":
        # the store is not what this version expects: it stays so until an operator acts
        return StoreNotReady(f"the gateway answered {status}: {message}")
    if code == "store_failed" or status == 500:
        # a defect behind the gateway: the same call fails the same way, so it is no outage
        return StoreFailed(f"the gateway answered {status}: {message}")
    return StoreUnavailable(f"the gateway answered {status}: {message}")


__all__ = [name for name in dir() if not name.startswith("_")] + ["FenceRefused"]
