#!/usr/bin/env python3
"""Probes of the shaped-link harness (benches/slow_link.sh): run inside the
caller's namespace (`ip netns exec wrl-a-PID python3 ...`).

For one link rate, against the floor (the worker's app served directly, across
the link) and the relay path (relay here, worker across the link):

- download / upload: one bulk transfer (GET /bytes?n=N, or POST /sha256 with a
  chunked body), 0.5 s for it to get going, then PROBES x GET /health 100 ms
  apart on a kept-alive connection of their own (opened, and used once, before
  the bulk starts, so no probe pays a TCP handshake). The bulk runs until the
  probes are done (a download is then closed by the caller, an upload gets its
  last chunk), so every probe is measured while the bulk is in flight.
- fair: two bulk downloads at once; each one's rate over a window (as
  bulk_mbps below), and its share of their sum.

One line per result on stdout:

  RESULT rate=10 path=relay dir=download p50_ms=.. p99_ms=.. bulk_mbps=.. probes=30 fail=0 unrun=0 ...
  RESULT rate=10 path=relay dir=fair a_mbps=.. b_mbps=.. min_share=.. window_s=..

p99 is nearest-rank: of 30 probes, the largest. A probe that fails (status
other than 200, a connection error, or no answer within --probe-timeout) is
counted in fail= and enters the percentiles with the time it took (for a
timeout, at least --probe-timeout): failures are never dropped. Probes still to run when the probe
phase hits --phase-limit are counted in unrun= (and are not in probes=).

bulk_mbps: download, the caller's receive rate while the probes ran (the
steady part; the slope of a least-squares line through its byte count sampled
every 20 ms, see Sampler; bulk_whole_mbps: all the bytes over the request's
whole life); upload, all the bytes sent over the time from the
request's start to the worker's answer (which it sends once it has read the
whole body, so buffers on the way cannot inflate it).

--strata-upload MIB (the harness's --strata: the app is strata-worker, which
has no /bytes or /sha256): per path, idle (the probes on an idle link), then
upload: POST /v1/execute, multipart (a metadata part, and an input part
blob.json: a JSON string of MIB MiB of hex digits, sent with Content-Length),
whose cell computes the string's length and SHA-256; the answer, a tar, must
hold both as sent (bulk_ok=1 also needs every probe to have ended while the
body was still crossing the link: in_upload=30). Its rates come from the
link, --link-dev (the caller's end of the veth: its tx_bytes, which carries
every byte A sends B, sampled every 20 ms):

  bulk_mbps  the body's bytes sent over body_s: from the request's start until
             the link went quiet before the answer (within 16 KiB of its count
             at the answer: the cell runs in between, and nothing else of size
             crosses A -> B then), so the body's goodput, not counting the cell
  link_mbps  the link's tx rate while the probes ran (least squares, as below:
             all bytes, headers included)
  answer_s   the request's start to the answer's head (body_s + the cell)
  answer_ok  the cell's answer holds the length and SHA-256 sent

Python 3 standard library only. The bearer token comes from $WRL_TOKEN.
"""

import argparse
import hashlib
import http.client
import io
import json
import math
import os
import socket
import ssl
import sys
import tarfile
import threading
import time
import urllib.parse

CHUNK = 64 * 1024


def log(msg):
    print(f"slow_link_probe: {msg}", file=sys.stderr, flush=True)


class Target:
    """A base URL (http://host:port/prefix or https://...)."""

    def __init__(self, url, cafile=None):
        u = urllib.parse.urlsplit(url)
        self.https = u.scheme == "https"
        self.host = u.hostname
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.ctx = None
        if self.https:
            self.ctx = ssl.create_default_context(cafile=cafile)
            self.ctx.set_alpn_protocols(["http/1.1"])

    def conn(self, timeout):
        if self.https:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self.ctx
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def path(self, p):
        return self.prefix + p


def headers(extra=None):
    h = {"Authorization": "Bearer " + os.environ.get("WRL_TOKEN", "")}
    if extra:
        h.update(extra)
    return h


def nearest_rank(sorted_values, q):
    if not sorted_values:
        return float("nan")
    k = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[k - 1]


def mbps(nbytes, secs):
    return nbytes * 8 / secs / 1e6 if secs > 0 else 0.0


class Prober:
    """GET /health on one kept-alive connection; reconnects after a failure."""

    def __init__(self, target, timeout):
        self.target = target
        self.timeout = timeout
        self.c = None

    def once(self):
        """(ok, seconds, why)."""
        t0 = time.monotonic()
        try:
            if self.c is None:
                self.c = self.target.conn(self.timeout)
            self.c.request("GET", self.target.path("/health"), headers=headers())
            r = self.c.getresponse()
            body = r.read()
            dt = time.monotonic() - t0
            if r.status != 200:
                return False, dt, f"status {r.status}: {body[:80]!r}"
            if r.will_close:
                self.close()
            return True, dt, ""
        except Exception as e:  # timeout, reset, refused...
            dt = time.monotonic() - t0
            self.close()
            return False, dt, f"{type(e).__name__}: {e}"

    def close(self):
        if self.c is not None:
            try:
                self.c.close()
            except Exception:
                pass
            self.c = None


def quiesce(targets, timeout, limit=30.0, threshold=0.05, need=3):
    """Waits (at most `limit` s) until /health answers within `threshold` s
    `need` times in a row on each target: the link and the relay are idle."""
    start = time.monotonic()
    end = start + limit
    for t in targets:
        p = Prober(t, min(timeout, 5.0))
        good = 0
        while good < need:
            if time.monotonic() > end:
                log(f"warning: {t.host}:{t.port}{t.prefix} not idle after {limit:.0f} s")
                p.close()
                return False
            ok, dt, _ = p.once()
            good = good + 1 if ok and dt < threshold else 0
            time.sleep(0.05)
        p.close()
    waited = time.monotonic() - start
    if waited > 1.0:
        log(f"waited {waited:.1f} s for the link and the relay to go idle")
    return True


class Download(threading.Thread):
    """GET /bytes?n=N read until its end or until stop(); counts the bytes."""

    def __init__(self, target, n, timeout):
        super().__init__(daemon=True)
        self.target, self.n, self.timeout = target, n, timeout
        self.got = 0
        self.first_byte = threading.Event()
        self.done = threading.Event()
        self.stopping = False
        self.error = None
        self.status = None
        self.t_start = self.t_end = None
        self.c = None

    def run(self):
        self.t_start = time.monotonic()
        try:
            self.c = self.target.conn(self.timeout)
            self.c.request("GET", self.target.path(f"/bytes?n={self.n}"), headers=headers())
            r = self.c.getresponse()
            self.status = r.status
            if r.status != 200:
                self.error = f"status {r.status}"
                return
            while not self.stopping:
                b = r.read1(CHUNK)
                if not b:
                    break
                self.got += len(b)
                self.first_byte.set()
        except Exception as e:
            if not self.stopping:
                self.error = f"{type(e).__name__}: {e}"
        finally:
            self.t_end = time.monotonic()
            self.first_byte.set()
            self.done.set()

    def stop(self):
        """Closes the connection (unblocking a read in progress)."""
        self.stopping = True
        c = self.c
        if c is not None and c.sock is not None:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.join(10)
        if c is not None:
            try:
                c.close()
            except Exception:
                pass


class Sampler(threading.Thread):
    """The byte counts of downloads every 20 ms: a rate is then the slope of a
    least-squares line through them over a window. A relay that delivers in
    bursts (a whole 256 KiB piece of the worker's at once) makes the count a
    staircase, and bytes-at-the-ends over a window of a few seconds would be
    off by up to a piece (at 2 Mbit/s, a piece is a second of the link)."""

    def __init__(self, downloads, period=0.02):
        super().__init__(daemon=True)
        self.downloads, self.period = downloads, period
        self.samples = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            self.samples.append((time.monotonic(), [d.got for d in self.downloads]))
            self.halt.wait(self.period)

    def stop(self):
        self.halt.set()
        self.join(2)

    def mbps(self, i, t0, t1):
        return slope_mbps([(t, got[i]) for t, got in self.samples if t0 <= t <= t1])


def slope_mbps(pts):
    """Mbit/s: the slope of a least-squares line through (time, bytes)."""
    if len(pts) < 2:
        return 0.0
    mt = sum(t for t, _ in pts) / len(pts)
    mb = sum(b for _, b in pts) / len(pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    num = sum((t - mt) * (b - mb) for t, b in pts)
    return num / den * 8 / 1e6 if den > 0 else 0.0


class LinkSampler(threading.Thread):
    """A device's tx_bytes (in this namespace's sysfs) every 20 ms."""

    def __init__(self, dev, period=0.02):
        super().__init__(daemon=True)
        self.path = f"/sys/class/net/{dev}/statistics/tx_bytes"
        self.period = period
        self.samples = []
        self.halt = threading.Event()

    def read(self):
        with open(self.path) as f:
            return int(f.read())

    def run(self):
        while not self.halt.is_set():
            self.samples.append((time.monotonic(), self.read()))
            self.halt.wait(self.period)

    def stop(self):
        self.halt.set()
        self.join(2)

    def mbps(self, t0, t1):
        return slope_mbps([(t, b) for t, b in self.samples if t0 <= t <= t1])

    def settled(self, until, slack=16384):
        """The first time the counter came within `slack` bytes of where it
        stood at `until` (None: no samples by then): when a transfer that
        ended before `until`, with the link quiet after it, had crossed."""
        before = [(t, b) for t, b in self.samples if t <= until]
        if not before:
            return None
        last = before[-1][1]
        for t, b in before:
            if b >= last - slack:
                return t
        return None


class Upload(threading.Thread):
    """POST /sha256 with a chunked body made until stop(); the worker answers
    `<hex> <n>` once it has read it all."""

    def __init__(self, target, timeout):
        super().__init__(daemon=True)
        self.target, self.timeout = target, timeout
        self.sent = 0
        self.stopping = threading.Event()
        self.done = threading.Event()
        self.error = None
        self.answer = None
        self.t_start = self.t_end = None

    def body(self):
        piece = bytes(range(256)) * (CHUNK // 256)
        while not self.stopping.is_set():
            self.sent += len(piece)
            yield piece

    def run(self):
        self.t_start = time.monotonic()
        c = None
        try:
            c = self.target.conn(self.timeout)
            c.request(
                "POST",
                self.target.path("/sha256"),
                body=self.body(),
                headers=headers({"Content-Type": "application/octet-stream"}),
                encode_chunked=True,
            )
            r = c.getresponse()
            text = r.read().decode("ascii", "replace").strip()
            self.t_end = time.monotonic()
            if r.status != 200:
                self.error = f"status {r.status}: {text[:80]}"
                return
            self.answer = text
            parts = text.split()
            if len(parts) != 2 or int(parts[1]) != self.sent:
                self.error = f"the worker read {text!r}, {self.sent} bytes were sent"
        except Exception as e:
            self.t_end = time.monotonic()
            self.error = f"{type(e).__name__}: {e}"
        finally:
            if c is not None:
                c.close()
            self.done.set()

    def stop(self, wait):
        self.stopping.set()
        self.join(wait)


class StrataUpload(threading.Thread):
    """POST /v1/execute to strata-worker with an input part of `mib` MiB that
    the cell hashes; the answer (a tar) must hold the length and SHA-256."""

    SOURCE = "import hashlib\nn = len(blob)\nh = hashlib.sha256(blob.encode()).hexdigest()\n"

    def __init__(self, target, mib, timeout, cell_timeout):
        super().__init__(daemon=True)
        self.target, self.timeout = target, timeout
        blob = os.urandom(mib << 19).hex().encode()  # mib MiB of [0-9a-f]
        self.want_n = len(blob)
        self.want_h = hashlib.sha256(blob).hexdigest()
        boundary = "slow-link-" + os.urandom(8).hex()
        meta = json.dumps({
            "protocol_version": "v1",
            "build_id": "slow-link-" + os.urandom(4).hex(),
            "transform": {
                "ref": "notebook_cell@v1",
                "params": {"source": self.SOURCE, "timeout_seconds": cell_timeout},
            },
            "inputs": [{"name": "blob", "format": "json/object", "file": "blob.json"}],
        }).encode()

        def part(name, filename, ctype):
            return (
                f"--{boundary}\r\n"
                f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                f"Content-Type: {ctype}\r\n\r\n"
            ).encode()

        head = part("metadata", "metadata.json", "application/json") + meta + b"\r\n"
        head += part("blob.json", "blob.json", "application/octet-stream") + b'"'
        tail = f'"\r\n--{boundary}--\r\n'.encode()
        self.parts = [head, blob, tail]
        self.total = sum(len(x) for x in self.parts)
        self.ctype = f"multipart/form-data; boundary={boundary}"
        self.sent = 0
        self.done = threading.Event()
        self.error = None
        self.ok = False
        self.status = None
        self.t_start = self.t_sent = self.t_answer = self.t_end = None

    def run(self):
        self.t_start = time.monotonic()
        c = None
        try:
            c = self.target.conn(self.timeout)
            c.putrequest("POST", self.target.path("/v1/execute"), skip_accept_encoding=True)
            h = headers({
                "Content-Type": self.ctype,
                "Content-Length": str(self.total),
                "X-Strata-Executor-Protocol": "v1",
            })
            for k, v in h.items():
                c.putheader(k, v)
            c.endheaders()
            try:
                for x in self.parts:
                    mv = memoryview(x)
                    for off in range(0, len(mv), CHUNK):
                        piece = mv[off:off + CHUNK]
                        c.send(piece)
                        self.sent += len(piece)
            except OSError as e:  # an early answer: read it below
                self.error = f"sending: {type(e).__name__}: {e} after {self.sent} bytes"
            self.t_sent = time.monotonic()
            r = c.getresponse()
            self.t_answer = time.monotonic()
            self.status = r.status
            body = r.read()
            self.t_end = time.monotonic()
            if r.status != 200:
                self.error = f"status {r.status}: {body[:200]!r}"
                return
            if self.error:
                return
            self.check(body)
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
        finally:
            if self.t_answer is None:
                self.t_answer = time.monotonic()
            if c is not None:
                c.close()
            self.done.set()

    def check(self, body):
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            def member(name):
                f = tar.extractfile(name)
                return json.loads(f.read())
            manifest = member("manifest.json")
            if manifest.get("success") is not True:
                self.error = f"the cell failed: {json.dumps(manifest)[:300]}"
                return
            got = {k: member(manifest["variables"][k]["file"]) for k in ("n", "h")}
        if got["n"] != self.want_n or got["h"] != self.want_h:
            self.error = f"the cell read n={got['n']} h={got['h'][:16]}..., sent n={self.want_n} h={self.want_h[:16]}..."
            return
        self.ok = True


def run_probes(target, args):
    """Opens the probe connection and uses it once (not counted)."""
    p = Prober(target, args.probe_timeout)
    ok, _, why = p.once()
    if not ok:
        log(f"warning: the warm-up probe failed: {why}")
    return p


def probe_phase(p, args, ends=None):
    """args.probes probes, args.interval apart (the next starts at once if one
    overruns), within args.phase_limit s. Returns (latencies, fails, unrun);
    with `ends` (a list), appends each probe's end time to it."""
    lat, fails, whys = [], 0, []
    t0 = time.monotonic()
    end = t0 + args.phase_limit
    for i in range(args.probes):
        due = t0 + i * args.interval
        now = time.monotonic()
        if now >= end:
            return lat, fails, args.probes - i, whys
        if due > now:
            time.sleep(due - now)
        ok, dt, why = p.once()
        lat.append(dt)
        if ends is not None:
            ends.append(time.monotonic())
        if not ok:
            fails += 1
            whys.append(why)
    return lat, fails, 0, whys


def ready(targets, limit):
    """Waits (at most `limit` s) until each target answers /health 200."""
    end = time.monotonic() + limit
    for t in targets:
        why = ""
        while True:
            p = Prober(t, 2.0)
            ok, _, why = p.once()
            p.close()
            if ok:
                break
            if time.monotonic() > end:
                log(f"{t.host}:{t.port}{t.prefix}/health did not answer 200 within {limit:.0f} s: {why}")
                return False
            time.sleep(0.2)
    return True


def result(fields):
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields), flush=True)


def summary(rate, path, direction, lat, fails, unrun, whys, extra):
    s = sorted(lat)
    fields = [
        ("rate", rate),
        ("path", path),
        ("dir", direction),
        ("p50_ms", f"{nearest_rank(s, 0.50) * 1000:.1f}"),
        ("p99_ms", f"{nearest_rank(s, 0.99) * 1000:.1f}"),
    ]
    fields += extra
    fields += [("probes", len(lat)), ("fail", fails), ("unrun", unrun)]
    result(fields)
    for w in sorted(set(whys))[:5]:
        log(f"{path} {direction}: a probe failed: {w}")


def measure_download(rate, name, target, idle, args):
    quiesce(idle, args.probe_timeout)
    p = run_probes(target, args)
    # Big enough to outlast the probe phase; closed as soon as it is over.
    n = int(args.rate * 1e6 / 8 * (args.phase_limit + args.warmup + 20))
    bulk = Download(target, n, timeout=60)
    bulk.start()
    sampler = Sampler([bulk])
    sampler.start()
    bulk.first_byte.wait(20)
    time.sleep(args.warmup)
    a_t = time.monotonic()
    lat, fails, unrun, whys = probe_phase(p, args)
    b_t = time.monotonic()
    ended_early = bulk.done.is_set()
    sampler.stop()
    bulk.stop()
    p.close()
    if bulk.error:
        log(f"{name} download: the bulk failed: {bulk.error}")
    whole = mbps(bulk.got, (bulk.t_end or b_t) - bulk.t_start)
    summary(
        rate, name, "download", lat, fails, unrun, whys,
        [
            ("bulk_mbps", f"{sampler.mbps(0, a_t, b_t):.2f}"),
            ("bulk_whole_mbps", f"{whole:.2f}"),
            ("bulk_bytes", bulk.got),
            ("bulk_ok", int(bulk.error is None and not ended_early)),
        ],
    )


def measure_upload(rate, name, target, idle, args):
    quiesce(idle, args.probe_timeout)
    p = run_probes(target, args)
    bulk = Upload(target, timeout=120)
    bulk.start()
    time.sleep(args.warmup)
    lat, fails, unrun, whys = probe_phase(p, args)
    ended_early = bulk.done.is_set()
    bulk.stop(wait=150)
    p.close()
    if bulk.error:
        log(f"{name} upload: the bulk failed: {bulk.error}")
    secs = (bulk.t_end or time.monotonic()) - bulk.t_start
    summary(
        rate, name, "upload", lat, fails, unrun, whys,
        [
            ("bulk_mbps", f"{mbps(bulk.sent, secs):.2f}"),
            ("bulk_bytes", bulk.sent),
            ("bulk_ok", int(bulk.error is None and bulk.answer is not None and not ended_early)),
        ],
    )


def measure_idle(rate, name, target, idle, args):
    """The probes alone, on an idle link: the app's own /health time."""
    quiesce(idle, args.probe_timeout)
    p = run_probes(target, args)
    lat, fails, unrun, whys = probe_phase(p, args)
    p.close()
    summary(rate, name, "idle", lat, fails, unrun, whys, [])


def measure_strata_upload(rate, name, target, idle, args):
    quiesce(idle, args.probe_timeout)
    p = run_probes(target, args)
    # At the link's rate the body takes about `at_rate` s: the request may
    # take 1.5 times that and 120 s more (the cell, Python), and no longer.
    at_rate = args.strata_upload * 8 * 1048576 / (args.rate * 1e6)
    limit = at_rate * 1.5 + 120
    bulk = StrataUpload(target, args.strata_upload, timeout=limit, cell_timeout=int(limit))
    link = LinkSampler(args.link_dev) if args.link_dev else None
    if link:
        link.start()
        time.sleep(0.05)
    bulk.start()
    time.sleep(args.warmup)
    a_t = time.monotonic()
    ends = []
    lat, fails, unrun, whys = probe_phase(p, args, ends)
    b_t = time.monotonic()
    p.close()
    bulk.join(max(1.0, (bulk.t_start or a_t) + limit - time.monotonic()))
    if link:
        link.stop()
    if bulk.is_alive():
        bulk.error = bulk.error or f"no answer within {limit:.0f} s ({bulk.sent} bytes sent)"
    if bulk.error:
        log(f"{name} upload: {bulk.error}")
    # The body has crossed once the link goes quiet before the answer (the
    # cell runs in between, and nothing else of size goes A -> B then).
    t_body = link.settled(bulk.t_answer) if link and bulk.status else None
    if t_body is None:  # no counter, or no answer: up to the end
        t_body = bulk.t_answer or time.monotonic()
    body_s = t_body - bulk.t_start
    in_upload = sum(1 for t in ends if t <= t_body)
    answer_s = (bulk.t_answer - bulk.t_start) if bulk.t_answer and bulk.status else float("nan")
    summary(
        rate, name, "upload", lat, fails, unrun, whys,
        [
            ("bulk_mbps", f"{mbps(bulk.sent, body_s):.2f}"),
            ("link_mbps", f"{link.mbps(a_t, b_t):.2f}" if link else "-"),
            ("body_s", f"{body_s:.1f}"),
            ("answer_s", f"{answer_s:.1f}"),
            ("bulk_bytes", bulk.sent),
            ("answer_ok", int(bulk.ok)),
            ("in_upload", in_upload),
            ("bulk_ok", int(bulk.ok and in_upload == args.probes)),
        ],
    )


# The worker's /bytes makes its body in pieces of 256 KiB, and a relay may
# deliver each piece whole: a fairness window spans at least 16 of them at the
# link's rate (at 2 Mbit/s, 17 s), so that neither stream's share moves by a
# piece at the window's ends.
PIECE = 256 * 1024


def measure_fair(rate, name, target, idle, args):
    quiesce(idle, args.probe_timeout)
    window = max(args.fair_window, 16 * PIECE * 8 / (args.rate * 1e6))
    n = int(args.rate * 1e6 / 8 * (window + args.warmup + 20))
    a, b = Download(target, n, 60), Download(target, n, 60)
    a.start()
    b.start()
    sampler = Sampler([a, b])
    sampler.start()
    a.first_byte.wait(20)
    b.first_byte.wait(20)
    time.sleep(args.warmup)
    t0 = time.monotonic()
    time.sleep(window)
    t1 = time.monotonic()
    early = a.done.is_set() or b.done.is_set()
    sampler.stop()
    a.stop()
    b.stop()
    for label, d in (("a", a), ("b", b)):
        if d.error:
            log(f"{name} fair: stream {label} failed: {d.error}")
    am, bm = sampler.mbps(0, t0, t1), sampler.mbps(1, t0, t1)
    total = am + bm
    share_a = am / total if total > 0 else 0.0
    share_b = bm / total if total > 0 else 0.0
    result(
        [
            ("rate", rate),
            ("path", name),
            ("dir", "fair"),
            ("a_mbps", f"{am:.2f}"),
            ("b_mbps", f"{bm:.2f}"),
            ("a_share", f"{share_a:.3f}"),
            ("b_share", f"{share_b:.3f}"),
            ("min_share", f"{min(share_a, share_b):.3f}"),
            ("sum_mbps", f"{total:.2f}"),
            ("window_s", f"{t1 - t0:.1f}"),
            ("ok", int(not early and a.error is None and b.error is None)),
        ]
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, required=True, help="the link's Mbit/s (for sizes, labels)")
    ap.add_argument("--floor", required=True, help="base URL of the app served directly")
    ap.add_argument("--relay", required=True, help="base URL of the worker through the relay (.../w/<id>)")
    ap.add_argument("--cafile", help="CA for an https:// relay URL")
    ap.add_argument("--probes", type=int, default=30)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--probe-timeout", type=float, default=10.0)
    ap.add_argument("--phase-limit", type=float, default=45.0,
                    help="the longest the probes of one measurement may take, s")
    ap.add_argument("--fair-window", type=float, default=5.0,
                    help="s, at least (longer at low rates: see PIECE)")
    ap.add_argument("--floor-fair", action="store_true", help="also two bulk downloads on the floor")
    ap.add_argument("--only", default="download,upload,fair",
                    help="comma-separated subset of download,upload,fair")
    ap.add_argument("--strata-upload", type=int, metavar="MIB",
                    help="the app is strata-worker: idle probes, then probes during an upload of MIB MiB to /v1/execute")
    ap.add_argument("--link-dev", help="the caller's end of the link (its tx_bytes gives the upload's rate)")
    ap.add_argument("--ready", type=float, metavar="SECS",
                    help="only wait (at most SECS) until both URLs answer /health 200; exit 0 if they do")
    args = ap.parse_args()

    label = f"{args.rate:g}"
    floor = Target(args.floor)
    relay = Target(args.relay, args.cafile)
    idle = [floor, relay]
    if args.ready is not None:
        return 0 if ready(idle, args.ready) else 1
    if args.strata_upload:
        for name, t in (("floor", floor), ("relay", relay)):
            measure_idle(label, name, t, idle, args)
            measure_strata_upload(label, name, t, idle, args)
        return 0
    only = set(args.only.split(","))
    if "download" in only:
        measure_download(label, "floor", floor, idle, args)
        measure_download(label, "relay", relay, idle, args)
    if "upload" in only:
        measure_upload(label, "floor", floor, idle, args)
        measure_upload(label, "relay", relay, idle, args)
    if "fair" in only:
        if args.floor_fair:
            measure_fair(label, "floor", floor, idle, args)
        measure_fair(label, "relay", relay, idle, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
