"""Shared pieces of the attack clients: server process, resource monitor, a well-behaved
native client, and hand-built encoders (protobuf, zstd RLE frames, HTTP/2 + HPACK literals,
native topspin frames). Python 3.11 standard library only."""
import os, socket, struct, subprocess, threading, time, select, zlib

# ---------------------------------------------------------------- protobuf
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)

def pb_bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint((field << 3) | 2) + varint(len(data)) + data

def get_request(key):
    return pb_bytes(1, key)

def put_request(key, value):
    return pb_bytes(1, key) + pb_bytes(2, value)

def padded_prefix(msg, total, pad_field=15):
    """Return (prefix, fill_len): msg + tag/len of an unknown bytes field so that
    prefix + fill_len bytes of filler is a valid message of exactly `total` bytes."""
    tag = varint((pad_field << 3) | 2)
    for vl in range(1, 6):
        fill = total - len(msg) - len(tag) - vl
        if len(varint(fill)) == vl:
            return msg + tag + varint(fill), fill
    raise ValueError("no fit")

# ---------------------------------------------------------------- zstd (RFC 8878)
def zstd_bomb(prefix, fill_len, fill=b"a", window_log=20):
    """A zstd frame (no content size, window 2^window_log) whose output is
    prefix + fill*fill_len: one Raw block for the prefix, then RLE blocks of 128 KiB."""
    assert 10 <= window_log <= 41
    out = bytearray(b"\x28\xb5\x2f\xfd")
    out.append(0x00)                       # FHD: no FCS, not single segment, no checksum, no dict
    out.append((window_log - 10) << 3)     # Window_Descriptor, mantissa 0
    blocks = []
    if prefix:
        blocks.append((0, len(prefix), prefix))
    bmax = min(1 << window_log, 128 * 1024)
    left = fill_len
    while left > 0:
        n = min(bmax, left)
        blocks.append((1, n, fill[:1]))
        left -= n
    for i, (typ, size, body) in enumerate(blocks):
        last = 1 if i == len(blocks) - 1 else 0
        out += (last | (typ << 1) | (size << 3)).to_bytes(3, "little") + body
    return bytes(out)

def pb_bomb(msg, total):
    prefix, fill = padded_prefix(msg, total)
    return zstd_bomb(prefix, fill)

_gzip_cache = {}

def gzip_bomb(prefix, fill_len, fill=b"a"):
    """A gzip member (RFC 1952, deflate level 9) whose output is prefix + fill*fill_len:
    60 MiB of one byte compresses to about 61 KB (deflate's ratio tops out near 1:1030)."""
    key = (prefix, fill_len, fill)
    if key not in _gzip_cache:
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        out = [c.compress(prefix)]
        chunk = fill[:1] * (1 << 20)
        left = fill_len
        while left > 0:
            n = min(left, len(chunk))
            out.append(c.compress(chunk[:n])); left -= n
        out.append(c.flush())
        _gzip_cache[key] = b"".join(out)
    return _gzip_cache[key]

def pb_gzip_bomb(msg, total):
    prefix, fill = padded_prefix(msg, total)
    return gzip_bomb(prefix, fill)

# ---------------------------------------------------------------- native topspin
PREFACE = b"TOPSPIN\x01"
T_SETTINGS, T_CALL, T_MESSAGE, T_CONT, T_HEADERS, T_HALF, T_END, T_CANCEL, T_CREDIT, T_PING, T_GOAWAY, T_ERROR = range(1, 13)

def nframe(typ, flags, call_id, payload=b""):
    return struct.pack("<IBBHI", len(payload), typ, flags, 0, call_id) + payload

def nsettings(entries=()):
    return nframe(T_SETTINGS, 0, 0, b"".join(struct.pack("<HI", i, v) for i, v in entries))

def metadata(pairs=()):
    out = struct.pack("<H", len(pairs))
    for k, v in pairs:
        k = k.encode(); v = v.encode() if isinstance(v, str) else v
        out += struct.pack("<BH", len(k), len(v)) + k + v
    return out

def ncall(call_id, name=None, method_id=0, md=(), timeout_us=0, codec=0):
    p = struct.pack("<HBBQ", method_id, codec, 0, timeout_us)
    flags = 0
    if name is not None:
        n = name.encode(); p += struct.pack("<H", len(n)) + n; flags = 1
    return nframe(T_CALL, flags, call_id, p + metadata(md))

def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        c = s.recv(n - len(buf))
        if not c:
            raise ConnectionError("eof")
        buf += c
    return bytes(buf)

def read_nframe(s):
    h = recv_exact(s, 12)
    ln, typ, flags, _, cid = struct.unpack("<IBBHI", h)
    return typ, flags, cid, recv_exact(s, ln) if ln else b""

def native_connect(host, port, settings=(), timeout=5.0, read_settings=True):
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(PREFACE + nsettings(settings))
    if read_settings:
        pre = recv_exact(s, 8)
        if pre != PREFACE:
            raise ConnectionError("bad preface %r" % pre)
        typ, _, _, _ = read_nframe(s)
        if typ != T_SETTINGS:
            raise ConnectionError("no settings")
    return s

class NativeClient:
    """A small blocking native client: one call at a time on one connection."""
    def __init__(self, host, port, timeout=5.0):
        self.s = native_connect(host, port, timeout=timeout)
        self.s.settimeout(timeout)
        self.next_id = 1

    def call(self, method, payload, md=()):
        cid = self.next_id; self.next_id += 2
        self.s.sendall(ncall(cid, method, 0, md) + nframe(T_MESSAGE, 1, cid, payload))
        msg = b""
        while True:
            typ, flags, fcid, p = read_nframe(self.s)
            if typ == T_PING and not flags & 1:
                self.s.sendall(nframe(T_PING, 1, 0, p))
            elif typ in (T_GOAWAY, T_ERROR):
                raise ConnectionError("server sent %s %r" % ("GOAWAY" if typ == T_GOAWAY else "ERROR", p[:80]))
            elif fcid == cid and typ == T_MESSAGE:
                msg += p
                self.s.sendall(nframe(T_CREDIT, 0, cid, struct.pack("<I", max(1, len(p) + 12))))
            elif fcid == cid and typ == T_END:
                code, ml = struct.unpack_from("<HH", p)
                return code, p[4:4 + ml].decode("utf-8", "replace"), msg

    def close(self):
        try: self.s.close()
        except OSError: pass

# ---------------------------------------------------------------- HTTP/2
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_DATA, H2_HEADERS, H2_PRIORITY, H2_RST, H2_SETTINGS, H2_PUSH, H2_PING, H2_GOAWAY, H2_WU, H2_CONT = range(10)

def h2frame(typ, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([typ, flags]) + struct.pack(">I", sid) + payload

def h2settings(entries=()):
    return h2frame(H2_SETTINGS, 0, 0, b"".join(struct.pack(">HI", i, v) for i, v in entries))

def hp_int(v, prefix_bits, first=0):
    m = (1 << prefix_bits) - 1
    if v < m:
        return bytes([first | v])
    out = bytearray([first | m]); v -= m
    while v >= 128:
        out.append((v & 0x7F) | 0x80); v >>= 7
    out.append(v)
    return bytes(out)

def hp_lit(name, value):
    """Literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    name = name.encode() if isinstance(name, str) else name
    value = value.encode() if isinstance(value, str) else value
    return b"\x00" + hp_int(len(name), 7) + name + hp_int(len(value), 7) + value

def grpc_headers(path, authority="127.0.0.1", extra=()):
    hs = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
          ("content-type", "application/grpc"), ("te", "trailers")] + list(extra)
    return b"".join(hp_lit(n, v) for n, v in hs)

def grpc_msg(payload, compressed=False, announced=None):
    ln = len(payload) if announced is None else announced
    return bytes([1 if compressed else 0]) + struct.pack(">I", ln) + payload

def read_h2frame(s):
    h = recv_exact(s, 9)
    ln = int.from_bytes(h[:3], "big")
    return h[3], h[4], int.from_bytes(h[5:9], "big") & 0x7FFFFFFF, recv_exact(s, ln) if ln else b""

def h2_connect(host, port, settings=(), read_server_settings=True, timeout=5.0):
    """Opens an h2c connection; reads the server's SETTINGS and ACKs it (then the caller
    may stop reading)."""
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(H2_PREFACE + h2settings(settings))
    if read_server_settings:
        while True:
            typ, flags, sid, p = read_h2frame(s)
            if typ == H2_SETTINGS and not flags & 1:
                s.sendall(h2frame(H2_SETTINGS, 1, 0))
                break
    return s

# ---------------------------------------------------------------- liveness of sockets
def tcp_state(s):
    """Linux TCP state of a client socket (1 ESTABLISHED, 7 CLOSE, 8 CLOSE_WAIT ...)."""
    try:
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return -1

def peer_closed(s):
    """True once the peer closed or reset (for sockets whose buffered data we may discard)."""
    try:
        if s.fileno() < 0:
            return False
        s.setblocking(False)
        r, _, _ = select.select([s], [], [], 0)
        if not r:
            return tcp_state(s) not in (1,)
        while True:
            d = s.recv(1 << 20, socket.MSG_DONTWAIT)
            if not d:
                return True
    except BlockingIOError:
        return tcp_state(s) not in (1,)
    except OSError:
        return True

class CutWatcher:
    """Polls a set of attacker sockets every 100 ms; records when each was cut (closed by the
    server). mode 'state' looks at the TCP state only (keeps unread data unread); mode 'drain'
    reads and discards what arrives."""
    def __init__(self, socks, t0, mode="drain"):
        self.socks = list(socks); self.t0 = t0; self.mode = mode
        self.cut = [None] * len(self.socks); self.stop = False
        self.th = threading.Thread(target=self.run, daemon=True); self.th.start()

    def run(self):
        while not self.stop:
            for i, s in enumerate(self.socks):
                if self.cut[i] is None:
                    dead = peer_closed(s) if self.mode == "drain" else tcp_state(s) != 1
                    if dead:
                        self.cut[i] = time.monotonic() - self.t0
            time.sleep(0.1)

    def summary(self):
        self.stop = True; self.th.join(1)
        c = [x for x in self.cut if x is not None]
        if not c:
            return "0/%d cut" % len(self.socks)
        return "%d/%d cut, %.1f-%.1f s" % (len(c), len(self.socks), min(c), max(c))

    def close_all(self):
        for s in self.socks:
            try: s.close()
            except OSError: pass

# ---------------------------------------------------------------- server + monitor
class Server:
    """A server process started as `cmd + [address]` (cmd: a path or an argument list; the
    process Popen starts is the one measured, so cmd must exec the server itself, not a shell
    or a launcher that forks it). It must print `listening on ADDRESS` as its first line."""
    def __init__(self, cmd, address="tcp://127.0.0.1:0", rss_limit_kib=3 * 1024 * 1024, cwd=None):
        argv = [cmd] if isinstance(cmd, str) else list(cmd)
        self.p = subprocess.Popen(argv + [address], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=cwd)
        line = self.p.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise RuntimeError("server said %r" % line)
        self.address = line[len("listening on "):]
        self.host, self.port = None, None
        if self.address.startswith(("tcp://", "ws://")):
            hp = self.address.split("://", 1)[1].split("/", 1)[0]
            self.host, port = hp.rsplit(":", 1); self.port = int(port)
        self.rss_limit = rss_limit_kib
        self.samples = []; self.killed = False; self._stop = False
        self.th = threading.Thread(target=self._monitor, daemon=True); self.th.start()

    def _status(self):
        d = {}
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith(("VmRSS", "VmHWM")):
                    k, v = line.split(":"); d[k] = int(v.split()[0])
        return d

    def _estab(self):
        if self.port is None:
            return -1
        n = 0
        for fn in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(fn) as f:
                    next(f)
                    for line in f:
                        parts = line.split()
                        if int(parts[1].split(":")[1], 16) == self.port and parts[3] == "01":
                            n += 1
            except FileNotFoundError:
                pass
        return n

    def _monitor(self):
        while not self._stop and self.p.poll() is None:
            try:
                st = self._status()
                nfd = len(os.listdir("/proc/%d/fd" % self.p.pid))
            except (FileNotFoundError, ProcessLookupError):
                break
            self.samples.append((time.monotonic(), st.get("VmRSS", 0), st.get("VmHWM", 0), self._estab(), nfd))
            if st.get("VmRSS", 0) > self.rss_limit:
                self.killed = True; self.p.kill(); break
            time.sleep(0.1)

    def rss_now(self):
        return self.samples[-1][1] if self.samples else 0

    def stop(self):
        self._stop = True
        final = self.samples[-1] if self.samples else None
        if self.p.poll() is None:
            self.p.terminate()
            try: self.p.wait(5)
            except subprocess.TimeoutExpired: self.p.kill(); self.p.wait()
        return final

class GoodClient:
    """Makes a native unary Put every 200 ms on one connection (reconnecting after a failure);
    records every call's outcome and latency. `fn` may replace the call (e.g. a subprocess)."""
    def __init__(self, server, fn=None, period=0.2):
        self.server = server; self.fn = fn; self.period = period
        self.results = []; self._stop = False; self.cli = None
        self.th = threading.Thread(target=self.run, daemon=True); self.th.start()

    def one(self, i):
        if self.fn:
            return self.fn(i)
        if self.cli is None:
            self.cli = NativeClient(self.server.host, self.server.port, timeout=5.0)
        code, msg, _ = self.cli.call("/kv.v1.Store/Put", put_request("good", "v%d" % i))
        return "OK" if code == 0 else "status %d %s" % (code, msg[:60])

    def run(self):
        i = 0
        while not self._stop:
            t = time.monotonic()
            try:
                r = self.one(i)
            except Exception as e:  # noqa
                r = "error %s" % e
                if self.cli: self.cli.close(); self.cli = None
            dt = time.monotonic() - t
            self.results.append((t, r, dt))
            i += 1
            time.sleep(max(0, self.period - dt))

    def stop(self):
        self._stop = True; self.th.join(10)
        if self.cli: self.cli.close()

    def summary(self, since=0):
        rs = [r for r in self.results if r[0] >= since]
        ok = [r for r in rs if r[1] == "OK"]
        bad = {}
        for r in rs:
            if r[1] != "OK":
                k = r[1][:70]; bad[k] = bad.get(k, 0) + 1
        worst = max((r[2] for r in rs), default=0)
        s = "%d/%d ok, worst %.0f ms" % (len(ok), len(rs), worst * 1000)
        if bad:
            s += "; failures: " + "; ".join("%dx %s" % (v, k) for k, v in bad.items())
        return s
