"""splitinfer.transport: everything that crosses the network between edge and cloud.

Wire format and codecs (``wire``, ``codecs``), channels behind one small base (``channel``:
``tcp``, ``webrtc``, ``memory``), the bandwidth monitor and active prober (``bandwidth``), the
link emulator (``netem``) and zeroconf discovery (``discovery``). Imports nothing of edge/,
cloud/ or splitter/; aiortc/aiohttp (``webrtc``) and zeroconf are imported only when used.
"""

from __future__ import annotations

from .bandwidth import BandwidthMonitor
from .prober import ActiveProber
from .channel import Channel
from ..codecs import CODEC_NAMES, Codec, Encoded, decode_tensor, encode_tensor
from .memory import MemoryChannel, memory_pair
from .netem import LinkEmulator, RateSchedule, load_trace, parse_rate
from .tcp import TcpChannel, TcpServer, client_ssl_context, server_ssl_context
from .wire import (
    PROTOCOL_VERSION,
    Bye,
    Error,
    FrameInfo,
    Hello,
    InferRequest,
    Limits,
    Message,
    Ping,
    Pong,
    Refusal,
    Result,
    ServerTimings,
    Welcome,
    decode,
    encode,
)

__all__ = [
    "PROTOCOL_VERSION", "Message", "Hello", "Welcome", "Refusal", "InferRequest", "Result", "Error", "Ping",
    "Pong", "Bye", "ServerTimings", "FrameInfo", "Limits", "encode", "decode",
    "CODEC_NAMES", "Codec", "Encoded", "encode_tensor", "decode_tensor",
    "Channel", "TcpChannel", "TcpServer", "server_ssl_context", "client_ssl_context", "MemoryChannel", "memory_pair",
    "BandwidthMonitor", "ActiveProber", "LinkEmulator", "RateSchedule", "load_trace", "parse_rate",
]
