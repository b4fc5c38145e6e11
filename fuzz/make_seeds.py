#!/usr/bin/env python3
"""Writes the handwritten seeds of fuzz/corpus-seeds/ (run from anywhere).

The machine targets read their input as a program for the harness in
src/fuzzing.rs: a configuration byte (plus parameters), then operations, each
a tag byte and its parameters. This script spells out conversations in that
encoding so each seed starts the fuzzer from a meaningful state. If the
encoding in src/fuzzing.rs changes, update the helpers here and re-run; stale
seeds are still valid inputs, only less to the point.

frame_decode's seeds are the golden vectors of tests/vectors/frames.json
(text and hex ones; the huge generated ones are skipped).
"""
import json
import os
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(ROOT, "corpus-seeds")


def u16(n):
    return list(struct.pack(">H", n))


def u32(n):
    return list(struct.pack(">I", n))


# ---- values (the generators of src/fuzzing.rs)

METHODS = ["GET", "POST", "PUT", "DELETE", "HEAD"]
PATHS = ["/health", "/v1/execute", "/v1/notebook-execute", "/v1/execute-manifest",
         "/v1/executions/b1/cancel", "/", "/a%2Fb"]
HEADER_NAMES = ["content-type", "content-length", "Content-Length", "authorization",
                "connection", "Keep-Alive", "transfer-encoding", "Proxy-Authorization", "te",
                "x-private", "x-strata-executor-protocol"]
HEADER_VALUES = ["0", "3", "5", "16", "1, 1", "4x", "", "keep-alive, X-Private",
                 "Bearer t0k", "application/json", "caf\u00e9", "tab\there"]


def headers(pairs):
    out = [len(pairs)]
    for name, value in pairs:
        out += [1, HEADER_NAMES.index(name), 1, HEADER_VALUES.index(value)]
    return out


def request_head(method="GET", path="/health", query="", hdrs=()):
    out = [1, METHODS.index(method), 1, PATHS.index(path)]
    out += [1] if query == "trace=1" else [2]
    assert query in ("", "trace=1")
    return out + headers(list(hdrs))


def response_head(status=200, hdrs=()):
    if status == 200:
        out = [2]
    elif status == 500:
        out = [1]
    else:
        out = [0] + u16(status - 100)
    return out + headers(list(hdrs))


def pool_id(i=0):
    """The i-th id of the harness's pool (ids in flight)."""
    return [0, i]


def small_id(n):
    """Id n (1..=8) whatever the pool holds."""
    return [5, n - 1]


def body(n):
    if n == 0:
        return [0]
    if n < 64:
        return [1, n]
    if n % 4 == 0 and n <= 1020:
        return [5, n // 4]
    return [7] + u16(n)


def duration(ms):
    table = {0: 0, 1: 1, 999: 2, 1000: 3, 5000: 4, 19_999: 5, 20_000: 6, 20_001: 7,
             40_000: 8, 3_600_000: 9}
    if ms in table:
        return [table[ms], 1]  # then "do not jump to the timer"
    return [10] + u16(ms) + [1]


def key(i=0):
    """The i-th stream the application holds."""
    return [i]


# ---- worker_machine operations

class W:
    def __init__(self, small=None, keepalive=None):
        flags = 0
        cfg = []
        if small:
            flags |= 1
            streams, chunks, unread, per_stream, queued, chunk = small
            cfg += [streams - 1, chunks - 1] + u16(unread - 1) + u16(per_stream) + u16(queued)
            cfg += u16(chunk)
        if keepalive is not None:
            flags |= 2
            cfg += keepalive
        self.b = [flags] + cfg

    def request(self, n=1, **head):
        self.b += [0, n - 1] + request_head(**head)
        return self

    def chunk(self, n, ident=None):
        self.b += [3] + (ident or pool_id()) + body(n)
        return self

    def end(self, ident=None):
        self.b += [6] + (ident or pool_id())
        return self

    def abort(self, ident=None):
        self.b += [7] + (ident or pool_id())
        return self

    def misc(self, which, extra=(), ident=None):
        self.b += [8] + (ident or pool_id()) + [2, which] + list(extra)
        return self

    def respond(self, k=0, **head):
        self.b += [9] + key(k) + response_head(**head)
        return self

    def send(self, n, k=0):
        self.b += [11] + key(k) + body(n)
        return self

    def finish(self, k=0):
        self.b += [14] + key(k)
        return self

    def fail(self, k=0):
        self.b += [15] + key(k)
        return self

    def read(self, times=20, k=0):
        self.b += [16] + key(k) + [times - 1]
        return self

    def discard(self, k=0):
        self.b += [18] + key(k)
        return self

    def close(self):
        self.b += [19, 0, 0]
        return self

    def lost(self):
        self.b += [19, 1]
        return self

    def advance(self, ms):
        self.b += [20] + duration(ms)
        return self

    def transmit(self, n=None):
        self.b += [21] + ([255] if n is None else [0, n - 1])
        return self


# ---- relay_machine operations

class R:
    def __init__(self, small=None, keepalive=None, wrap=False):
        flags = 0
        cfg = []
        if small:
            flags |= 1
            streams, chunks, unread, per_stream, queued, chunk = small
            cfg += [streams - 1, chunks - 1] + u16(unread - 1) + u16(per_stream) + u16(queued)
            cfg += u16(chunk)
        if keepalive is not None:
            flags |= 2
            cfg += keepalive
        if wrap:
            flags |= 4
            cfg += [3]  # first id 2^32 - 4
        self.b = [flags] + cfg

    def open(self, **head):
        self.b += [0] + request_head(**head)
        return self

    def send(self, n, k=0):
        self.b += [4] + key(k) + body(n)
        return self

    def finish(self, k=0):
        self.b += [7] + key(k)
        return self

    def abort(self, k=0):
        self.b += [9] + key(k)
        return self

    def read(self, times=20, k=0):
        self.b += [10] + key(k) + [times - 1]
        return self

    def response(self, ident=None, **head):
        self.b += [12] + (ident or pool_id()) + response_head(**head)
        return self

    def chunk(self, n, ident=None):
        self.b += [14] + (ident or pool_id()) + body(n)
        return self

    def end(self, ident=None):
        self.b += [17] + (ident or pool_id())
        return self

    def worker_abort(self, ident=None):
        self.b += [18] + (ident or pool_id())
        return self

    def misc(self, which, extra=(), ident=None):
        self.b += [19] + (ident or pool_id()) + [1, which] + list(extra)
        return self

    def close(self):
        self.b += [20, 0, 0]
        return self

    def lost(self):
        self.b += [20, 1]
        return self

    def advance(self, ms):
        self.b += [21] + duration(ms)
        return self

    def transmit(self, n=None):
        self.b += [22] + ([255] if n is None else [0, n - 1])
        return self


SMALL = (4, 4, 4096, 256, 512, 64)


def worker_seeds():
    yield "get_health", (W().request(path="/health").end().transmit()
                         .respond(hdrs=[("content-type", "application/json")])
                         .send(15).finish().transmit().read())
    yield "post_body_read_in_pieces", (W(small=SMALL)
                                       .request(method="POST", path="/v1/execute",
                                                hdrs=[("content-length", "16")])
                                       .chunk(5).chunk(5).read(1).chunk(6).end().read()
                                       .respond(hdrs=[("content-length", "5")]).send(5)
                                       .finish().transmit())
    yield "backpressure_16_unread", (W(small=(4, 16, 65535, 256, 512, 16)).request(method="POST")
                                     .chunk(10).chunk(10).chunk(10).chunk(10).chunk(10)
                                     .chunk(10).chunk(10).chunk(10).chunk(10).chunk(10)
                                     .chunk(10).chunk(10).chunk(10).chunk(10).chunk(10)
                                     .chunk(10).chunk(10).read(3).chunk(10).end().read())
    yield "relay_aborts_mid_body", (W().request(method="POST").chunk(40).abort()
                                    .respond().send(10).transmit())
    yield "fail_before_response_500", (W().request().end().fail().transmit().read())
    yield "fail_after_response_abort", (W(small=SMALL).request().end().respond().send(200)
                                        .transmit(2).fail().transmit())
    yield "short_content_length", (W().request().end()
                                   .respond(hdrs=[("content-length", "16")]).send(5)
                                   .finish().transmit())
    yield "answer_without_reading", (W(small=SMALL).request(method="POST").chunk(30)
                                     .respond(status=401).finish().chunk(30).end()
                                     .transmit())
    yield "two_streams_interleaved", (W(small=SMALL).request(1, path="/v1/execute")
                                      .request(2, path="/v1/executions/b1/cancel")
                                      .end(pool_id(1)).respond(k=1).finish(k=1)
                                      .respond(k=0).send(300, k=0).transmit(1)
                                      .finish(k=0).transmit())
    yield "max_streams_503", (W(small=(1, 16, 4096, 256, 512, 64))
                              .request(1).request(2).end(pool_id(1)).transmit())
    yield "malformed_request_400", W().misc(8, [0], ident=small_id(3)).transmit()
    yield "keepalive_ping_pong", (W(keepalive=[1]).advance(20_000).transmit()
                                  .misc(4).advance(20_000).transmit().advance(40_000))
    yield "keepalive_timeout", W(keepalive=[1]).advance(20_000).transmit().advance(20_001)
    yield "oversize_message_1009", W().request().misc(7, [0]).transmit()
    yield "app_close", W().request().respond().close().transmit()
    yield "connection_lost", W().request().chunk(10).lost().read()
    # One request takes the only slot; the next 66 are refused with 503
    # while the relay reads nothing: reading pauses at 64 pending refusals.
    refusals = W(small=(1, 16, 4096, 256, 512, 64)).request(1)
    for _ in range(66):
        refusals.request(1)
    yield "refusals_pause_reading", refusals.transmit()


def relay_seeds():
    yield "get_health", (R().open(path="/health").finish().transmit()
                         .response(hdrs=[("content-type", "application/json")])
                         .chunk(15).end().read())
    yield "post_with_body", (R(small=SMALL)
                             .open(method="POST", path="/v1/execute",
                                   hdrs=[("content-length", "16"), ("connection", "keep-alive, X-Private"),
                                         ("x-private", "3")])
                             .send(16).finish().transmit().response().chunk(5).end().read())
    yield "body_queue_full", (R(small=(4, 16, 65535, 128, 256, 16)).open(method="POST")
                              .send(1000).transmit(3).send(1000).transmit().finish()
                              .transmit())
    yield "caller_goes_away", (R().open(method="POST").send(100).transmit().abort()
                               .transmit().response().end())
    yield "abort_before_head_sent", R().open().abort().transmit()
    yield "worker_aborts_after_response", (R().open().finish().transmit().response()
                                           .chunk(10).worker_abort().read())
    yield "protocol_error_chunk_before_response", (R().open().finish().transmit()
                                                   .chunk(4).transmit())
    yield "second_response", R().open().transmit().response().response().transmit().read()
    yield "complete_by_length_then_let_go", (R().open().finish().transmit()
                                             .response(hdrs=[("content-length", "5")])
                                             .chunk(5).abort().end().transmit())
    yield "response_backpressure", (R(small=(4, 2, 65535, 256, 512, 64)).open().finish()
                                    .transmit().response().chunk(10).chunk(10).chunk(10)
                                    .read(1).chunk(10).end().read())
    yield "ids_wrap", (R(wrap=True).open().open().open().open().open().finish(0)
                       .transmit().end().transmit())
    yield "max_streams", R(small=(2, 16, 4096, 256, 512, 64)).open().open().open().transmit()
    yield "keepalive_on_relay", (R(keepalive=[1]).advance(20_000).transmit().misc(4)
                                 .advance(20_000).advance(20_001))
    yield "oversize_message_1009", R().open().transmit().misc(7, [0]).transmit()
    yield "connection_lost_mid_response", (R().open().finish().transmit().response()
                                           .chunk(10).lost().read())


def handshake_seeds():
    # Table: entries (id choice, token choice), then headers, then the verdict
    # status, backoff, URL map and target (see handshake_and_url).
    def table(*entries):
        out = [len(entries)]
        for wid, tok in entries:
            out += [1, wid, 1, tok]
        return out

    def hdrs(*pairs):
        out = [len(pairs)]
        for name_sel, token_sel, value_sel in pairs:
            out += [name_sel, 1, token_sel, value_sel]
        return out

    # Status 101; backoff 1 s to 60 s, doubling, one wait; the default URL
    # map and the target /w/abc/x?a=1/../ (dots in a query are fine).
    tail = u16(101) + u16(1000) + u32(60_000) + [2, 1] + u32(1 << 31) + [0, 1]
    tail += [2, 1, 0, 2, 6, 11]
    yield "accepted", table((0, 0), (1, 1)) + hdrs((0, 0, 0), (2, 0, 3)) + tail
    yield "no_subprotocol_400", table((0, 0)) + hdrs((2, 0, 3)) + tail
    yield "unknown_token_401", table((0, 0)) + hdrs((0, 0, 1), (2, 2, 4)) + tail
    yield "two_authorizations", table((0, 0)) + hdrs((0, 0, 0), (2, 0, 3), (3, 0, 3)) + tail
    yield "basic_scheme", table((0, 0)) + hdrs((1, 0, 7), (2, 0, 5)) + tail
    # No table, no headers, status 200, a 1 ms backoff; /w/abc/../x.
    yield "url_dot_segment", [0, 0] + u16(200) + [0] * 8 + [2, 1, 0, 2, 3, 6]
    # The prefix /r/ and the target /r/w-1/x?.
    yield "url_custom_prefix", [0, 0] + u16(503) + [0] * 8 + [0, 3] + list(b"/r/") + [1, 2, 2, 6, 10]


def main():
    doc = json.load(open(os.path.join(ROOT, "..", "tests", "vectors", "frames.json")))
    out = os.path.join(SEEDS, "frame_decode")
    os.makedirs(out, exist_ok=True)
    for v in doc["vectors"]:
        if "text" in v:
            data = v["text"].encode("utf-8")
        elif "hex" in v:
            data = bytes.fromhex(v["hex"])
        else:
            continue  # text_fill / fill: around 1 MiB each
        with open(os.path.join(out, "vector-" + v["name"]), "wb") as f:
            f.write(data)
    for target, seeds in [("worker_machine", worker_seeds()), ("relay_machine", relay_seeds()),
                          ("handshake_and_url", handshake_seeds())]:
        out = os.path.join(SEEDS, target)
        os.makedirs(out, exist_ok=True)
        for name, prog in seeds:
            data = bytes(prog.b if hasattr(prog, "b") else prog)
            with open(os.path.join(out, "hand-" + name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
