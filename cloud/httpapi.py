"""The cloud's HTTP side (aiohttp): health, readiness, Prometheus metrics, the plans served, and
the WebRTC signalling endpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from .metrics import CONTENT_TYPE_LATEST

if TYPE_CHECKING:  # pragma: no cover
    from .service import CloudService

__all__ = ["make_app"]


def make_app(service: "CloudService", webrtc: Any = None) -> web.Application:
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

    app = web.Application(client_max_size=1 << 20)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/plans", plans)
    app.router.add_post("/v1/webrtc/offer", webrtc.aiohttp_handler if webrtc is not None else no_webrtc)
    return app
