"""The API document (OpenAPI 3.1), made from the route table itself: a route cannot exist without
being documented, nor be documented without existing."""

from __future__ import annotations

import re
from typing import Any

from .app import SIGNED, RouteSpec

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message", "field"],
    "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                   "field": {"type": ["string", "null"]}}}}}
ERRORS = {"401": "no valid bearer token", "403": "the token's scope or projects do not allow it",
          "404": "unknown (or outside the token's projects)", "409": "conflict", "422": "invalid input",
          "429": "too many failed authentications from this address (Retry-After)"}


def document(specs: list[RouteSpec], version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route of ``specs`` that belongs to the API."""
    paths: dict[str, Any] = {}
    for spec in specs:
        if not spec.api:
            continue
        item: dict[str, Any] = {}
        params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in re.findall(r"{(\w+)}", spec.path)]
        for method, declared in spec.methods.items():
            operation: dict[str, Any] = {
                "summary": declared.summary or f"{method} {spec.path}",
                "operationId": (method.lower() + re.sub(r"\W+", "_", spec.path)).rstrip("_"),
                "security": [] if declared.scope == SIGNED else [{"bearer": []}],
                "x-qinglong-scope": declared.scope,
                "parameters": params + [{"name": name, "in": "query", "required": False,
                                         "description": text, "schema": {"type": "string"}}
                                        for name, text in declared.query.items()],
                "responses": {
                    "200": {"description": "done", "content": {"application/json": {"schema": {}}}},
                    **{code: {"description": text, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Error"}}}} for code, text in ERRORS.items()},
                },
            }
            if method in ("POST", "PUT"):
                operation["responses"]["201"] = {"description": "created",
                                                 "content": {"application/json": {"schema": {}}}}
            if declared.body is not None:
                operation["requestBody"] = {"required": True,
                                            "content": {"application/json": {"schema": dict(declared.body)}}}
            if spec.path.endswith("/runs") and method == "POST":
                operation["parameters"].append({"name": "Idempotency-Key", "in": "header", "required": False,
                                                "schema": {"type": "string", "maxLength": 200}})
            item[method.lower()] = operation
        paths[spec.path] = item
    return {
        "openapi": "3.1.0",
        "info": {"title": "Qinglong management API", "version": version},
        "paths": paths,
        "components": {
            "schemas": {"Error": ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a token made with `qinglong token create`"}},
        },
        "security": [{"bearer": []}],
    }
