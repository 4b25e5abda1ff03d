"""Zero-configuration discovery: the cloud advertises ``_splitinfer._tcp.local.`` with TXT records
(protocol version, plan hashes served, TCP port, WebRTC signalling URL, whether a token is
required); the edge browses and keeps the services that serve its plan.

>>> adv = await Advertiser.start("cloud-a", port=7000, plans=[plan.hash])      # doctest: +SKIP
>>> [s.tcp_url for s in await discover(plan_hash=plan.hash)]                     # doctest: +SKIP
['tcp://192.168.1.20:7000']
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .wire import PROTOCOL_VERSION

__all__ = ["SERVICE_TYPE", "Service", "Advertiser", "discover"]

SERVICE_TYPE = "_splitinfer._tcp.local."
_MAX_PLANS = 12  # TXT records stay well under one packet


@dataclass(frozen=True)
class Service:
    name: str
    host: str
    port: int
    protocol: int
    plans: tuple[str, ...]
    webrtc_url: str | None = None
    token_required: bool = False
    tls: bool = False
    properties: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def tcp_url(self) -> str:
        return f"{'tls' if self.tls else 'tcp'}://{self.host}:{self.port}"

    def serves(self, plan_hash: str) -> bool:
        return plan_hash in self.plans


def _txt(port: int, plans: Sequence[str], webrtc_url: str | None, token_required: bool, tls: bool) -> dict[str, str]:
    if len(plans) > _MAX_PLANS:
        raise ValueError(f"at most {_MAX_PLANS} plans can be advertised, got {len(plans)}")
    props = {"proto": str(PROTOCOL_VERSION), "tcp": str(port), "token": "1" if token_required else "0",
             "tls": "1" if tls else "0"}
    if webrtc_url:
        props["webrtc"] = webrtc_url
    for i, h in enumerate(plans):
        props[f"p{i}"] = h
    return props


def _service(info: object) -> Service | None:
    from zeroconf import ServiceInfo

    assert isinstance(info, ServiceInfo)
    props = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else (v or ""))
             for k, v in (info.properties or {}).items()}
    addrs = info.parsed_addresses()
    if not addrs or not props.get("proto", "").isdigit():
        return None
    plans = tuple(v for k, v in sorted(props.items()) if k.startswith("p") and k[1:].isdigit())
    return Service(name=info.name.removesuffix("." + SERVICE_TYPE), host=addrs[0],
                   port=int(props.get("tcp") or info.port or 0), protocol=int(props["proto"]), plans=plans,
                   webrtc_url=props.get("webrtc") or None, token_required=props.get("token") == "1",
                   tls=props.get("tls") == "1", properties=props)


class Advertiser:
    """Advertise one cloud service until :meth:`aclose`."""

    def __init__(self) -> None:
        self._zc: object = None
        self._info: object = None

    @classmethod
    async def start(cls, name: str, *, port: int, plans: Sequence[str], host: str = "127.0.0.1",
                    webrtc_url: str | None = None, token_required: bool = False, tls: bool = False,
                    interfaces: Sequence[str] | None = None) -> "Advertiser":
        from zeroconf import InterfaceChoice, IPVersion
        from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

        self = cls()
        props = _txt(port, plans, webrtc_url, token_required, tls)  # validate before opening sockets
        chosen: Any = list(interfaces) if interfaces else ["127.0.0.1"] if host.startswith("127.") \
            else InterfaceChoice.All  # (None raises TypeError in zeroconf 0.154)
        zc = AsyncZeroconf(interfaces=chosen, ip_version=IPVersion.V4Only)
        info = AsyncServiceInfo(SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", port=port,
                                addresses=[socket.inet_aton(host)],
                                properties=props,
                                server=f"{name}.local.")
        await zc.async_register_service(info, allow_name_change=True)
        self._zc, self._info = zc, info
        return self

    async def aclose(self) -> None:
        zc, self._zc = self._zc, None
        if zc is not None:
            await zc.async_unregister_service(self._info)  # type: ignore[attr-defined]
            await zc.async_close()  # type: ignore[attr-defined]


async def discover(*, timeout: float = 3.0, plan_hash: str | None = None, interfaces: Sequence[str] | None = None,
                   first: bool = False) -> list[Service]:
    """Browse for ``timeout`` seconds (or until the first match with ``first``) and return the
    services found, only those serving ``plan_hash`` when given."""
    from zeroconf import InterfaceChoice, IPVersion, ServiceStateChange
    from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

    # (zeroconf 0.154 raises TypeError for interfaces=None: name the choice)
    zc = AsyncZeroconf(interfaces=list(interfaces) if interfaces else InterfaceChoice.All,
                       ip_version=IPVersion.V4Only)
    found: dict[str, Service] = {}
    pending: set[asyncio.Task[None]] = set()
    matched = asyncio.Event()

    async def resolve(name: str) -> None:
        info = AsyncServiceInfo(SERVICE_TYPE, name)
        if await info.async_request(zc.zeroconf, 1500):
            svc = _service(info)
            if svc is not None and (plan_hash is None or svc.serves(plan_hash)) and svc.protocol == PROTOCOL_VERSION:
                found[name] = svc
                matched.set()

    def on_change(zeroconf: object, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change in (ServiceStateChange.Added, ServiceStateChange.Updated):
            task = asyncio.ensure_future(resolve(name))
            pending.add(task)
            task.add_done_callback(pending.discard)

    browser = AsyncServiceBrowser(zc.zeroconf, [SERVICE_TYPE], handlers=[on_change])
    try:
        if first:
            try:
                await asyncio.wait_for(matched.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        else:
            await asyncio.sleep(timeout)
    finally:
        await browser.async_cancel()
        for t in list(pending):
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await zc.async_close()
    return sorted(found.values(), key=lambda s: s.name)
