"""An independent HTTP/3 client (aioquic) for `yardmaster serve`.

Usage: h3_infer.py HOST PORT CERT.pem PATH [BODY-FILE]
Connects over QUIC with ALPN h3, trusting CERT, sends GET PATH (or POST with the body
file's bytes as application/json) and prints one JSON line: {"status": ..., "body": ...}.
"""
import asyncio
import json
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration


class Http3(QuicConnectionProtocol):
    """Collects each stream's headers and body and wakes the request waiting on it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.http = H3Connection(self._quic)
        self.replies = {}
        self.waiting = {}

    def quic_event_received(self, event):
        for http_event in self.http.handle_event(event):
            if not isinstance(http_event, (HeadersReceived, DataReceived)):
                continue
            reply = self.replies.setdefault(http_event.stream_id, {"headers": [], "body": b""})
            if isinstance(http_event, HeadersReceived):
                reply["headers"].extend(http_event.headers)
            else:
                reply["body"] += http_event.data
            if http_event.stream_ended and http_event.stream_id in self.waiting:
                self.waiting.pop(http_event.stream_id).set_result(reply)

    async def request(self, authority: str, path: str, body: bytes):
        stream = self._quic.get_next_available_stream_id()
        headers = [
            (b":method", b"POST" if body else b"GET"),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
            (b"content-type", b"application/json"),
        ]
        self.http.send_headers(stream, headers, end_stream=not body)
        if body:
            self.http.send_data(stream, body, end_stream=True)
        waiter = asyncio.get_running_loop().create_future()
        self.waiting[stream] = waiter
        self.transmit()
        return await asyncio.wait_for(waiter, 60)


async def main() -> None:
    host, port, cert, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    body = open(sys.argv[5], "rb").read() if len(sys.argv) > 5 else b""
    configuration = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    configuration.load_verify_locations(cert)
    async with connect(host, port, configuration=configuration, create_protocol=Http3) as client:
        reply = await client.request(f"{host}:{port}", path, body)
    status = next(int(v) for k, v in reply["headers"] if k == b":status")
    print(json.dumps({"status": status, "body": reply["body"].decode()}))


if __name__ == "__main__":
    asyncio.run(main())
