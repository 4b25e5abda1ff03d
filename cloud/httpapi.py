"""The cloud's HTTP side (aiohttp): health, readiness, Prometheus metrics, the plans served, and
the WebRTC signalling endpoint.

With tokens set, everything but ``/healthz`` and ``/readyz`` needs one, as ``Authorization:
Bearer TOKEN`` (what Prometheus sends with ``authorization: credentials_file``): the metrics and
plans say what is served, and an offer costs the service a peer connection."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .metrics import CONTENT_TYPE_LATEST

if TYPE_CHECKING:  # pragma: no cover
    from .service import CloudService

__all__ = ["make_app"]


def make_app(service: "CloudService", webrtc: Any = None) -> web.Application:
    def authorized(request: web.Request) -> bool:
        if service.tokens is None:
            return True
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and any(hmac.compare_digest(token.strip().encode(), t.encode())
                                                  for t in service.tokens)

    def guarded(handler: Any) -> Any:
        async def run(request: web.Request) -> web.StreamResponse:
            if not authorized(request):
                service.metrics.errors.labels("http_unauthorized").inc()
                return web.json_response({"error": "this endpoint needs a token: Authorization: Bearer TOKEN"},
                                         status=401, headers={"WWW-Authenticate": "Bearer"})
            return await handler(request)  # type: ignore[no-any-return]

        return run

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "state": service.state})

    async def readyz(_: web.Request) -> web.Response:
        ready = service.state == "running"
        return web.json_response({"ready": ready, "state": service.state, "plans": len(service.plans)},
                                 status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        body = service.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def plans(_: web.Request) -> web.Response:
        return web.json_response({"plans": service.plans_json()})

    async def no_webrtc(_: web.Request) -> web.Response:
        return web.json_response({"error": "WebRTC needs the webrtc extra on the cloud"}, status=501)

    app = web.Application(client_max_size=128 << 10)  # an SDP offer is a few KiB
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", guarded(metrics))
    app.router.add_get("/v1/plans", guarded(plans))
    app.router.add_post("/v1/webrtc/offer", guarded(webrtc.aiohttp_handler if webrtc is not None else no_webrtc))
    return app
