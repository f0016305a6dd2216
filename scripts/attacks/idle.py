"""#7: handshakes that never complete and idle connections, native and HTTP/2."""
import socket, time
from common import *

def attack_idle(srv, dur=20):
    """200 connections: 40 silent, 40 native preface without SETTINGS, 40 HTTP/2 preface
    without SETTINGS, 40 native full handshake then idle, 40 HTTP/2 full handshake then idle."""
    t0 = time.monotonic()
    g = {"silent": [], "native preface only": [], "h2 preface only": [], "native idle": [], "h2 idle": []}
    for i in range(40):
        g["silent"].append(socket.create_connection((srv.host, srv.port)))
        s = socket.create_connection((srv.host, srv.port)); s.sendall(PREFACE); g["native preface only"].append(s)
        s = socket.create_connection((srv.host, srv.port)); s.sendall(H2_PREFACE); g["h2 preface only"].append(s)
        g["native idle"].append(native_connect(srv.host, srv.port))
        g["h2 idle"].append(h2_connect(srv.host, srv.port))
    ws = {k: CutWatcher(v, t0, mode="drain") for k, v in g.items()}
    time.sleep(max(0, dur - (time.monotonic() - t0)))
    notes = []
    for k, w in ws.items():
        notes.append("%s: %s" % (k, w.summary()))
    for w in ws.values(): w.close_all()
    return {"notes": "; ".join(notes), "t0": t0}
