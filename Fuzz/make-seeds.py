#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (Fuzz/corpus/TARGET/NAME).

The HTTP/2 seeds are real exchanges made with the h2 library (`pip install h2`): what an APNs
server sends a client with three requests in flight (http2-client), and what a client sends a
server after the connection preface (simulator). The other seeds are written out as they are.
Run it from anywhere; it replaces the files it writes and leaves others alone.
"""
import os
import pathlib

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings

ROOT = pathlib.Path(__file__).resolve().parent / "corpus"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CUT = b"\xff\xfecut"  # where a target splits its input into separate reads
TOKEN = "a" * 64


def write(target, name, data):
    directory = ROOT / target
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data.encode() if isinstance(data, str) else data)


def request_headers(token=TOKEN, topic="com.example.app", extra=()):
    return [(":method", "POST"), (":scheme", "https"), (":authority", "api.push.apple.com"),
            (":path", f"/3/device/{token}"), ("apns-topic", topic), *extra]


def exchange(requests):
    """A client and a server connection; returns (client bytes after the preface, server conn,
    client conn) once the client's requests reached the server."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, validate_inbound_headers=False))
    client.initiate_connection()
    server.initiate_connection()
    for headers, body in requests:
        stream = client.get_next_available_stream_id()
        client.send_headers(stream, headers, end_stream=body is None)
        if body is not None:
            client.send_data(stream, body, end_stream=True)
    sent = client.data_to_send()
    server.receive_data(sent)
    assert sent.startswith(PREFACE)
    return sent[len(PREFACE):], server, client


BODY = b'{"aps":{"alert":"hi"}}'
three = [(request_headers(), BODY)] * 3


def server_seeds():
    # The client sends its requests only once the server's SETTINGS are in, and opens its third
    # stream only once one of the first two closed (it allows itself two): each answer comes in
    # a read of its own after what it answers, as from a real server.
    _, server, _ = exchange(three)
    settings = server.data_to_send()
    server.send_headers(1, [(":status", "200"), ("apns-id", "6f1f2d2e-0000-4000-8000-000000000001")], end_stream=True)
    server.send_headers(3, [(":status", "400"), ("content-type", "application/json")])
    server.send_data(3, b'{"reason":"BadDeviceToken"}', end_stream=True)
    first_two = server.data_to_send()
    server.send_headers(5, [(":status", "410")])
    server.send_data(5, b'{"reason":"Unregistered","timestamp":1700000000000}', end_stream=True)
    third = server.data_to_send()
    write("http2-client", "answers", settings + CUT + first_two + CUT + third)
    write("http2-client", "answers-in-pieces", settings + CUT + first_two[:20] + CUT + first_two[20:] + CUT + third[:30] + CUT + third[30:])

    _, server, _ = exchange(three)
    settings = server.data_to_send()
    server.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1})
    server.send_headers(1, [(":status", "429")])
    server.send_data(1, b'{"reason":"TooManyRequests"}', end_stream=True)
    server.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR, additional_data=b'{"reason":"Shutdown"}', last_stream_id=1)
    write("http2-client", "limit-then-goaway", settings + CUT + server.data_to_send())

    _, server, _ = exchange(three)
    settings = server.data_to_send()
    server.reset_stream(1, h2.errors.ErrorCodes.REFUSED_STREAM)
    server.ping(b"12345678")
    server.increment_flow_control_window(1 << 20)
    server.send_headers(3, [(":status", "500")], end_stream=False)
    server.send_data(3, b'{"reason":', end_stream=False)
    server.send_data(3, b'"InternalServerError"}', end_stream=True)
    write("http2-client", "reset-ping-split-body", settings + CUT + server.data_to_send())


def client_seeds():
    sent, _, _ = exchange(three)
    write("simulator", "three-requests", sent)
    sent, _, _ = exchange([(request_headers(extra=[("apns-push-type", "background"), ("apns-priority", "5"),
                                                   ("apns-expiration", "0"), ("apns-collapse-id", "c")]),
                            b'{"aps":{"content-available":1}}')])
    write("simulator", "background", sent)
    sent, _, _ = exchange([(request_headers(token="zz"), BODY), (request_headers(topic=""), None),
                           (request_headers(), b"{" * 5000)])
    write("simulator", "bad-requests", sent)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, request_headers(), end_stream=False)
    client.ping(b"abcdefgh")
    client.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
    client.close_connection()
    write("simulator", "ping-reset-goaway", client.data_to_send()[len(PREFACE):])


def intent_seeds():
    write("intent", "alert", '{"id":"o-1","token":"' + TOKEN + '","topic":"com.example.app",'
          '"payload":{"aps":{"alert":{"title":"Hi","body":"There"},"sound":"default"}}}')
    write("intent", "everything", '{"id":"o-2","token":"' + TOKEN.upper() + '","topic":"com.example.app.voip",'
          '"push_type":"voip","priority":10,"environment":"development","expiration":1700003600,'
          '"collapse_id":"c1","badge":{"increment":1},"payload":{"aps":{},"k":[1,2.5e3,true,null,"\\u00e9\\n"]}}')
    write("intent", "badge-set", '{"id":"o-3","token":"' + TOKEN + '","topic":"com.example.app",'
          '"badge":{"set":0},"payload":{"aps":{"badge":0}}}')
    write("intent", "missing-fields", '{"id":"","payload":[]}')
    write("intent", "invalid-utf8", b'{"id":"o-4","token":"' + TOKEN.encode() + b'","topic":"a","payload":{"\xc3\x28":1}}')
    write("intent", "not-json", "[1,2,3")
    # VoIP allows 5 KB: a 4.5 KB payload is valid.
    write("intent", "voip-large", '{"id":"o-5","token":"' + TOKEN + '","topic":"com.example.app.voip","push_type":"voip",'
          '"payload":{"aps":{},"blob":"' + "x" * 4500 + '"}}')
    write("intent", "channel", '{"id":"o-6","channel_id":"dHN0LTEyMzQ1Njc4OTAxMjM0NTY=","topic":"com.example.app",'
          '"message_storage_policy":0,"payload":{"aps":{"event":"update","timestamp":1732000000,"content-state":{"s":1}}}}')


def resp_seeds():
    write("resp", "simple", "+OK\r\n:42\r\n-ERR wrong\r\n$5\r\nhello\r\n$-1\r\n")
    write("resp", "arrays", "*3\r\n$1\r\na\r\n*2\r\n:1\r\n:-2\r\n*-1\r\n*0\r\n")
    write("resp", "in-pieces", b"*2\r\n$3\r\nfo" + CUT + b"o\r\n" + CUT + b":7\r\n")
    write("resp", "nested", "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n")


def configuration_seeds():
    examples = pathlib.Path(__file__).resolve().parent.parent / "config"
    write("configuration", "shipped", (examples / "apns-relay.yaml").read_bytes())
    write("configuration", "small", "kafka:\n  brokers: localhost:9092\n  config:\n    linger.ms: 5\n"
          "redis:\n  url: redis://127.0.0.1:6379/0\nlimits:\n  max_in_flight: 100\n")
    write("configuration", "wrong-types", "kafka: [1, 2]\napns:\n  endpoint: ftp://x\n  credentials: {a: b}\n"
          "limits:\n  max_in_flight: -1\n")


def trace_seeds():
    parent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    write("trace", "sampled", parent)
    write("trace", "sampled-with-state", parent + CUT + b"vendor=abc,other=t61rcWkgMzE")
    write("trace", "unsampled", parent[:-2] + b"00" + CUT + b"vendor=abc")
    write("trace", "state-of-joined-characters", parent + CUT + ("a\u200d" * 67 + "=x").encode())
    write("trace", "not-hex", b"00-zz-00f067aa0ba902b7-01")


if __name__ == "__main__":
    server_seeds()
    client_seeds()
    intent_seeds()
    resp_seeds()
    configuration_seeds()
    trace_seeds()
    for target in sorted(os.listdir(ROOT)):
        print(target, len(os.listdir(ROOT / target)), "seeds")
