"""Attacks on the WebSocket face (RFC 6455 upgrade on the tcp:// port, first byte 'G')."""
import base64, os, select, socket, struct, time
from common import *

MiB = 1 << 20

def upgrade(host, port, origin=None, path="/", timeout=5.0):
    s = socket.create_connection((host, port), timeout=timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    req = ("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: topspin.v1\r\n" % (path, host, port, key))
    if origin:
        req += "Origin: %s\r\n" % origin
    s.sendall((req + "\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(4096)
        if not c:
            break
        head += c
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    return s, status

def ws_header(opcode, fin, length, mask=b"\0\0\0\0"):
    b0 = (0x80 if fin else 0) | opcode
    if length < 126:
        h = bytes([b0, 0x80 | length])
    elif length < 65536:
        h = bytes([b0, 0x80 | 126]) + struct.pack(">H", length)
    else:
        h = bytes([b0, 0x80 | 127]) + struct.pack(">Q", length)
    return h + mask  # zero mask key: payload bytes go unchanged

def attack_ws(srv, dur=40):
    """#6: Origin: https://evil.example (expect 403); 16 connections each announce a
    1,000,000-byte binary message and send 900,000 B of it; 4 announce 2^40 bytes; 4 send a
    fragmented message growing past 1 MiB; all then go quiet (still reading)."""
    t0 = time.monotonic(); notes = []
    s, st = upgrade(srv.host, srv.port, origin="https://evil.example"); s.close()
    notes.append("evil Origin -> %r" % st[:60])
    s, st = upgrade(srv.host, srv.port, origin="http://%s:%d" % (srv.host, srv.port)); s.close()
    notes.append("same Origin -> %r" % st[:60])
    stream = PREFACE + nsettings() + ncall(1, "/kv.v1.Store/Put")
    groups = {"partial 1e6": [], "huge 2^40": [], "fragmented": []}
    for i in range(24):
        s, st = upgrade(srv.host, srv.port)
        if not st.startswith("HTTP/1.1 101"):
            notes.append("upgrade %d refused %r" % (i, st[:60])); s.close(); continue
        if i < 16:
            payload = stream + struct.pack("<IBBHI", 10 ** 6, T_MESSAGE, 1, 0, 1)
            s.sendall(ws_header(2, True, 10 ** 6) + payload + b"x" * (900000 - len(payload)))
            groups["partial 1e6"].append(s)
        elif i < 20:
            s.sendall(ws_header(2, True, 1 << 40) + stream + b"x" * 1000)
            groups["huge 2^40"].append(s)
        else:
            s.sendall(ws_header(2, False, len(stream)) + stream)
            try:
                for k in range(40):   # 40 x 64 KiB = 2.5 MiB in one unfinished message
                    s.sendall(ws_header(0, False, 65536) + b"y" * 65536)
            except OSError:
                pass
            groups["fragmented"].append(s)
    watchers = {k: CutWatcher(v, t0, mode="drain") for k, v in groups.items()}
    time.sleep(dur - (time.monotonic() - t0))
    for k, w in watchers.items():
        notes.append("%s: %s" % (k, w.summary()))
    for w in watchers.values(): w.close_all()
    return {"notes": "; ".join(notes), "t0": t0}
