"""zeroconf discovery on loopback: a real advertiser and a real browser."""

from __future__ import annotations

import pytest

from conftest import arun

pytest.importorskip("zeroconf")

from splitinfer.transport.discovery import Advertiser, discover  # noqa: E402

PLAN_A = "a" * 64
PLAN_B = "b" * 64


def test_advertise_and_find_by_plan():
    async def main():
        adv = await Advertiser.start("si-test-cloud", port=7123, plans=[PLAN_A], webrtc_url="http://127.0.0.1:8123/offer",
                                     token_required=True, interfaces=["127.0.0.1"])
        try:
            found = await discover(plan_hash=PLAN_A, interfaces=["127.0.0.1"], timeout=8, first=True)
            other = await discover(plan_hash=PLAN_B, interfaces=["127.0.0.1"], timeout=1.5)
        finally:
            await adv.aclose()
        return found, other
    found, other = arun(main())
    mine = [s for s in found if s.name.startswith("si-test-cloud")]
    assert mine, found
    s = mine[0]
    assert s.tcp_url == "tcp://127.0.0.1:7123" and s.token_required and s.protocol == 1
    assert s.webrtc_url == "http://127.0.0.1:8123/offer" and s.serves(PLAN_A)
    assert not [x for x in other if x.name.startswith("si-test-cloud")]


def test_too_many_plans_is_refused():
    async def main():
        with pytest.raises(ValueError, match="at most 12 plans"):
            await Advertiser.start("x", port=1, plans=[f"{i:064x}" for i in range(13)], interfaces=["127.0.0.1"])
    arun(main())


def test_the_default_auto_path_finds_the_cloud(yolo_plan):
    """What users run: `CloudService(advertise=True)` on loopback and `EdgeAgent(plan, "auto")`
    with no interfaces given (zeroconf 0.154 raised TypeError for interfaces=None and the agent
    silently ran edge-only)."""
    pytest.importorskip("aiohttp")
    from splitinfer.cloud import CloudService
    from splitinfer.edge import EdgeAgent
    from splitinfer.splitter import Plan
    from splitinfer.splitter.profiler import random_feeds

    plan = Plan.load(yolo_plan)

    async def main():
        async with CloudService([plan], listen=("127.0.0.1", 0), http=None, name="si-auto-test") as svc:
            assert (await discover(plan_hash=plan.hash, first=True, timeout=8))  # no interfaces given
            async with EdgeAgent(plan, "auto", candidate="cloud", connect_timeout_s=10) as agent:
                assert agent.connected, agent.last_error
                r = await agent.infer(random_feeds(plan.inputs))
                return r, svc.port

    r, _ = arun(main(), timeout=90)
    assert not r.fallback and r.placement == "cloud", r
