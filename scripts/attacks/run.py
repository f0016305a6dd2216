#!/usr/bin/env python3
"""Runs attacks against a fresh default topspin server each (a kvstore server: Rust, Go or
Node), watching the server's RSS (VmRSS, VmHWM from /proc every 100 ms) and a well-behaved
client making a unary call every 200 ms. Prints a table (markdown) and writes JSON if asked.

  python3 scripts/attacks/run.py [--lang rust|go|node] [--server PATH] [--server-cmd CMD]
                                 [--only a,b] [--json out.json]

--lang rust (the default): --server defaults to the release kvstore-server of this checkout
  (target/release/, or under $CARGO_TARGET_DIR): cargo build --release -p kvstore --bin kvstore-server.
--lang go: go/tools/cmd/kvstore-go-server, built once with `go build` into a temporary
  directory (--server PATH: use that binary instead).
--lang node: `node bindings/typescript/dist/examples/kvstore.js` (build it first: cd
  bindings/typescript && npx tsc; --server PATH: another kvstore.js).
--server-cmd CMD: the whole command (split as a shell would, run without one; the address is
  appended; it must exec the server itself, whose RSS is measured); --lang then only says
  which transports it has and which bounds it claims.
Attacks on a transport the server lacks (shm:// on Go and Node, ws:// on Go) are reported
"not applicable". The good client of ws:// and shm:// attacks is the Rust kvstore-client
(--client; default next to the Rust server).
"""
import argparse, atexit, json, os, shlex, shutil, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import *
import grpc_attacks, native_attacks, ws_attacks, idle, shm_attacks

MiB = 1 << 20
# The repository root: two directories above this script.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATTACKS = [
    # name, function, transport, claimed bound (crates/topspin/README.md, docs/hardening.md)
    ("1-grpc-zstd-window0", grpc_attacks.attack_grpc_zstd_never_read, "tcp",
     "decompressed msgs charged to memory_budget 1 GiB; max_send_buffer 4 MiB; write_timeout 60 s"),
    ("2-grpc-partial-60MiB", grpc_attacks.attack_grpc_partial_messages, "tcp",
     "msg buffers grow only by what memory_budget (1 GiB) grants; window withheld past it"),
    ("2b-grpc-announce-only", grpc_attacks.attack_grpc_announce_only, "tcp",
     "reserved whole only within memory_budget (1 GiB), else grows as bytes arrive"),
    ("3-grpc-apply-bombs", grpc_attacks.attack_grpc_stream_bombs, "tcp",
     "decompression stops at max_message_size 64 MiB; charged to budget while held"),
    ("4-native-pipeline-noread", native_attacks.attack_native_pipeline_never_read, "tcp",
     "max_send_buffer 4 MiB (+1 msg); reading stops; write_timeout 60 s"),
    ("5-native-zstd-bombs", native_attacks.attack_native_zstd_bombs, "tcp",
     "max_message_size 64 MiB; decompressed charged to memory_budget 1 GiB"),
    ("6-websocket", ws_attacks.attack_ws, "ws",
     "Origin 403; msg > 1 MiB -> 1009; partial msg charged past 64 KiB, frame_timeout 30 s -> 1008"),
    ("7-idle-handshakes", idle.attack_idle, "tcp",
     "handshake_timeout 10 s; idle_timeout 1 h"),
    ("8-shm-silent", shm_attacks.attack_shm, "shm",
     "handshake_timeout 10 s; rings 4 MiB+4 KiB charged to memory_budget at accept"),
    ("x-native-announced-frames", native_attacks.attack_native_announced_frames, "tcp",
     "frame reserved whole only within memory_budget; frame_timeout 30 s"),
    ("x-native-floods", native_attacks.attack_native_floods, "tcp",
     "ping_rate 20+10/s; rapid_reset_rate 1000+1/ms; refused_call_rate 100+1/10ms; max_concurrent_calls 1024"),
    ("x-grpc-partial-over-budget", grpc_attacks.attack_grpc_partial_over_budget, "tcp",
     "memory_budget 1 GiB: past it windows withheld, new calls RESOURCE_EXHAUSTED"),
    ("x-native-split-over-budget", native_attacks.attack_native_split_over_budget, "tcp",
     "memory_budget 1 GiB: past it chunk credit withheld, new calls RESOURCE_EXHAUSTED"),
    ("x-h2-floods", grpc_attacks.attack_h2_floods, "tcp",
     "h2 Rapid Reset limits; header list max_metadata_size+4 KiB; ping_rate"),
    # Run by default on Go and Node only (the Rust runs recorded in README.md had none of
    # these, and `--only x-` still means what it did); on Rust they run when an --only prefix
    # matches nothing else (e.g. --only x-native-gzip,x-grpc-gzip,x-native-zstd-big,x-native-pipeline-1000).
    ("x-native-gzip-bombs", native_attacks.attack_native_gzip_bombs, "tcp",
     "max_message_size 64 MiB; decompressed charged to memory_budget 1 GiB"),
    ("x-grpc-gzip-window0", grpc_attacks.attack_grpc_gzip_window0, "tcp",
     "decompressed msgs charged to memory_budget 1 GiB; write_timeout 60 s"),
    ("x-grpc-gzip-apply-bombs", grpc_attacks.attack_grpc_gzip_stream_bombs, "tcp",
     "decompression stops at max_message_size 64 MiB; charged to budget while held"),
    ("x-native-zstd-big-window", native_attacks.attack_native_zstd_big_window, "tcp",
     "zstd window over 8 MiB refused from the frame header"),
    ("x-native-pipeline-1000-noread", native_attacks.attack_native_pipeline_1000_never_read, "tcp",
     "max_send_buffer 4 MiB (+1 msg); reading stops; write_timeout 60 s"),
]
EXTRA_NOT_RUST = {"x-native-gzip-bombs", "x-grpc-gzip-window0", "x-grpc-gzip-apply-bombs", "x-native-zstd-big-window",
                  "x-native-pipeline-1000-noread"}

# Per server: the transports its kvstore example serves and the bounds its documentation
# claims where they differ from the Rust server's (go/README.md "Bounds" and "gRPC on the same
# port"; bindings/typescript/README.md "Server bounds" and "gRPC face").
LANGS = {
    "rust": {"transports": {"tcp", "ws", "shm"}, "claims": {}},
    "go": {
        "transports": {"tcp"},
        "claims": {
            "1-grpc-zstd-window0": "zstd inflated in 256 KiB pieces charged to memory budget 1 GiB; write timeout 60 s (no send buffer bound on the gRPC face)",
            "2-grpc-partial-60MiB": "msgs under way charged to the conn's share (1/8 of 1 GiB); past it + the largest msg, or no byte for frame timeout 30 s: conn closed",
            "2b-grpc-announce-only": "msgs under way charged as bytes arrive; no byte for frame timeout 30 s with window open: conn closed",
            "x-grpc-partial-over-budget": "share 1/8 of memory budget 1 GiB: past it + the largest msg the conn is closed",
            "x-native-split-over-budget": "share 1/8 of memory budget 1 GiB: past it chunk credit withheld; frame timeout 30 s",
            "x-h2-floods": "grpc-go's own flood defences; header list max_metadata_size+4 KiB; PINGs < 100 ms apart: GOAWAY",
            "x-grpc-gzip-window0": "the bridge inflates gzip charged to memory budget 1 GiB; write timeout 60 s",
            "x-grpc-gzip-apply-bombs": "gzip inflated charged to memory budget 1 GiB, capped at max message size 64 MiB",
        },
    },
    "node": {
        "transports": {"tcp", "ws"},
        "claims": {
            "1-grpc-zstd-window0": "zstd not decoded on the gRPC face (grpc-js): refused; write timeout 60 s",
            "2-grpc-partial-60MiB": "msgs over 64 KiB charged as bytes arrive; share 1/8 of 1 GiB: past it windows withheld; no byte for 30 s: RST_STREAM",
            "2b-grpc-announce-only": "charged as bytes arrive (never to the announced size); no byte for 30 s: RST_STREAM",
            "3-grpc-apply-bombs": "zstd not decoded on the gRPC face (grpc-js): refused",
            "4-native-pipeline-noread": "maxSendBuffer 4 MiB (+1 answer); reading stops; writeTimeout 60 s",
            "x-native-pipeline-1000-noread": "maxSendBuffer 4 MiB (+1 answer); reading stops; writeTimeout 60 s",
            "5-native-zstd-bombs": "zstd not decoded by default (nodeServerCodecs: gzip): UNIMPLEMENTED",
            "6-websocket": "Origin 403; msg > 4 MiB -> 1009; partial msg charged past 64 KiB, frameTimeoutMs 30 s -> 1008",
            "x-native-announced-frames": "buffers grow as bytes arrive, charged past 64 KiB; frameTimeoutMs 30 s",
            "x-grpc-partial-over-budget": "share 1/8 of memory budget 1 GiB: past it windows withheld, one stream goes on; 30 s: RST",
            "x-native-split-over-budget": "share 1/8 of memory budget 1 GiB: past it chunk credit withheld; frameTimeoutMs 30 s",
            "x-h2-floods": "nghttp2's own defences; header list maxMetadataSize+4 KiB (no flood limits or frame timeout outside request msgs)",
            "x-native-gzip-bombs": "gzip decoded never past maxMessageSize 64 MiB",
            "x-grpc-gzip-window0": "gzip inflated when the handler takes it, never past 64 MiB, charged to memory budget 1 GiB before it grows (ISIZE); write timeout 60 s",
            "x-grpc-gzip-apply-bombs": "gzip inflated one msg at a time as the handler takes it, never past 64 MiB, charged to memory budget 1 GiB until it takes the next",
            "x-native-zstd-big-window": "zstd not decoded by default: UNIMPLEMENTED (opt-in: window over 8 MiB refused from the header)",
        },
    },
}
NOT_APPLICABLE = {"ws": "no ws:// listener", "shm": "no shm:// transport"}

def cli_good_client(client, address):
    def fn(i):
        r = subprocess.run([client, address, "put", "good", "v%d" % i], capture_output=True, text=True, timeout=10)
        return "OK" if r.returncode == 0 else "exit %d %s" % (r.returncode, (r.stderr or r.stdout).strip()[:60])
    return fn

def not_applicable(name, transport, claim, lang):
    return {"attack": name, "claim": claim, "not_applicable": True,
            "notes": "not applicable: the %s server has %s" % (lang, NOT_APPLICABLE[transport])}

def run_one(name, fn, transport, claim, server_cmd, client_bin):
    addr = {"tcp": "tcp://127.0.0.1:0", "ws": "ws://127.0.0.1:0/", "shm": "shm://attack%d" % os.getpid()}[transport]
    srv = Server(server_cmd, addr)
    time.sleep(0.3)
    if transport == "tcp":
        c = NativeClient(srv.host, srv.port, timeout=10)
        code, msg, _ = c.call("/kv.v1.Store/Put", put_request("big", "b" * MiB))
        assert code == 0, (code, msg)
        c.close()
        good = GoodClient(srv)
    else:
        good = GoodClient(srv, fn=cli_good_client(client_bin, srv.address))
    time.sleep(1.0)
    base_rss = srv.rss_now()
    base_hwm = srv.samples[-1][2] if srv.samples else 0
    t_start = time.monotonic()
    err = None
    try:
        res = fn(srv)
    except Exception as e:  # noqa
        import traceback; traceback.print_exc()
        res = {"notes": "attack raised %r" % e, "t0": t_start}
    t_attack_end = time.monotonic()
    rss_end = srv.rss_now()
    time.sleep(2.0)  # attackers' sockets are closed by now: does the server give memory back?
    good.stop()
    rss_after = srv.rss_now()
    samples = [x for x in srv.samples if x[0] >= t_start]
    hwm = max((x[2] for x in srv.samples), default=0)
    peak_rss = max((x[1] for x in samples), default=0)
    alive = srv.p.poll() is None
    killed = srv.killed
    srv.stop()
    return {
        "attack": name, "claim": claim, "notes": res.get("notes", ""),
        "rss_base_MiB": round(base_rss / 1024, 1), "vmhwm_base_MiB": round(base_hwm / 1024, 1), "peak_rss_MiB": round(peak_rss / 1024, 1),
        "vmhwm_MiB": round(hwm / 1024, 1), "rss_end_MiB": round(rss_end / 1024, 1),
        "rss_after_close_MiB": round(rss_after / 1024, 1),
        "good": good.summary(since=t_start), "duration_s": round(t_attack_end - t_start, 1),
        "server_alive": alive and not killed, "killed_over_3GiB": killed,
    }

def build_go_server():
    """Builds go/tools/cmd/kvstore-go-server once into a temporary directory (removed at exit),
    so that the process measured is the server, not `go run`."""
    d = tempfile.mkdtemp(prefix="attack-go-")
    atexit.register(shutil.rmtree, d, True)
    out = os.path.join(d, "kvstore-go-server")
    print("building %s (go build)" % out, flush=True)
    subprocess.run(["go", "build", "-o", out, "./cmd/kvstore-go-server"], cwd=os.path.join(ROOT, "go", "tools"), check=True)
    return out

def server_command(a, target):
    if a.server_cmd:
        return shlex.split(a.server_cmd)
    if a.lang == "go":
        return [a.server or build_go_server()]
    if a.lang == "node":
        js = a.server or os.path.join(ROOT, "bindings", "typescript", "dist", "examples", "kvstore.js")
        if not os.path.exists(js):
            sys.exit("%s is missing: build it with `cd bindings/typescript && npx tsc`" % js)
        return ["node", js]
    return [a.server or os.path.join(target, "release", "kvstore-server")]

def main():
    ap = argparse.ArgumentParser()
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    ap.add_argument("--lang", choices=sorted(LANGS), default="rust",
                    help="which kvstore server: rust (default), go or node")
    ap.add_argument("--server", help="rust: the kvstore-server binary (default %s); go: a built "
                    "kvstore-go-server (default: go build); node: kvstore.js" % os.path.join(target, "release", "kvstore-server"))
    ap.add_argument("--server-cmd", help="the whole server command, the address appended (replaces --server)")
    ap.add_argument("--client", help="the Rust kvstore-client, the good client of ws:// and shm:// "
                    "attacks (default: next to --server for rust, else %s)" % os.path.join(target, "release", "kvstore-client"))
    ap.add_argument("--only", default="", help="comma-separated attack name prefixes")
    ap.add_argument("--json")
    a = ap.parse_args()
    want = [w for w in a.only.split(",") if w]
    lang = LANGS[a.lang]
    if a.client:
        client = a.client
    elif a.lang == "rust" and a.server and not a.server_cmd:
        client = os.path.join(os.path.dirname(a.server), "kvstore-client")
    else:
        client = os.path.join(target, "release", "kvstore-client")
    cmd = None
    rows = []
    for name, fn, tr, claim in ATTACKS:
        if want and not any(name.startswith(w) for w in want):
            continue
        if a.lang == "rust" and name in EXTRA_NOT_RUST and not any(
                name.startswith(w) and all(n in EXTRA_NOT_RUST for n, _, _, _ in ATTACKS if n.startswith(w)) for w in want):
            continue  # on Rust only when an --only prefix names nothing but these
        claim = lang["claims"].get(name, claim)
        print("== %s" % name, flush=True)
        if tr not in lang["transports"]:
            r = not_applicable(name, tr, claim, a.lang)
        else:
            if cmd is None:
                cmd = server_command(a, target)
            r = run_one(name, fn, tr, claim, cmd, client)
        print(json.dumps(r, indent=1), flush=True)
        rows.append(r)
    print()
    print("| attack | VmHWM / RSS peak / RSS end / RSS 2 s after (MiB) | claimed bound | good client | attackers / notes |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r.get("not_applicable"):
            print("| %s | - | %s | - | %s |" % (r["attack"], r["claim"], r["notes"]))
            continue
        print("| %s | %s / %s / %s / %s (base %s)%s | %s | %s | %s |" % (
            r["attack"], r["vmhwm_MiB"], r["peak_rss_MiB"], r["rss_end_MiB"], r["rss_after_close_MiB"],
            "%s, HWM %s" % (r["rss_base_MiB"], r["vmhwm_base_MiB"]), "" if r["server_alive"] else " SERVER DIED/KILLED", r["claim"], r["good"], r["notes"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)

if __name__ == "__main__":
    main()
