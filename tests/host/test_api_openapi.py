"""The API document served at /api/v1/openapi.json: valid OpenAPI 3.1 (checked by
openapi-spec-validator), every route of the application in it and every documented route served."""

from __future__ import annotations

import asyncio

from openapi_spec_validator import validate

from api_helpers import Client, api_settings, cli, make_token
from qinglong.host.http.app import SIGNED_PATHS


def test_the_openapi_document_is_valid_and_matches_the_routes_both_ways(tmp_path):
    """A route missing from the document is one no client or reviewer knows to protect or call; a
    documented route that does not exist sends clients into 404s; an invalid document breaks every
    generated client."""
    from qinglong.host.containers import build_container
    from qinglong.host.settings import load_settings

    settings = api_settings(tmp_path)
    cli(settings, "project", "create", "ops")
    read = make_token(settings, "reader", "read")

    async def scenario() -> tuple[dict, list]:
        lifecycle = build_container(load_settings(settings)).lifecycle()
        await lifecycle.start()
        try:
            (surface,) = [c for c in lifecycle._started if c.name == "http"]
            loop = asyncio.get_running_loop()

            def fetch() -> dict:
                client = Client(surface.port, read)
                try:
                    status, body, _ = client.request("GET", "/api/v1/openapi.json")
                    assert status == 200
                    return body
                finally:
                    client.close()

            return await loop.run_in_executor(None, fetch), [r.app.qinglong_route for r in surface.app.routes]
        finally:
            await lifecycle.stop()

    doc, specs = asyncio.run(scenario())
    validate(doc)  # raises on an invalid OpenAPI 3.1 document
    assert doc["openapi"] == "3.1.0"
    served = {(spec.path, method.lower()) for spec in specs if spec.path.startswith("/api/") for method in spec.methods}
    documented = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert served == documented, (served ^ documented)
    assert all(spec.api for spec in specs if spec.path.startswith("/api/"))
    assert len(served) >= 25
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            if path in SIGNED_PATHS:  # proven by a signature: the document must not ask a token
                assert operation["security"] == [] and operation["x-qinglong-scope"] == "signed", (path, method)
                continue
            assert operation["security"] == [{"bearer": []}] and operation["x-qinglong-scope"] in (
                "read", "run", "write", "admin"), (path, method)
