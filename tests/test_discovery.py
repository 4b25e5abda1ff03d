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
