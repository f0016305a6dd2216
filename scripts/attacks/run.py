#!/usr/bin/env python3
"""Runs attacks against a fresh default topspin server each (kvstore-server), watching the
server's RSS (VmRSS, VmHWM from /proc every 100 ms) and a well-behaved client making a unary
call every 200 ms. Prints a table (markdown) and writes JSON if asked.

  python3 scripts/attacks/run.py [--server PATH] [--only a,b] [--json out.json]

--server defaults to the release kvstore-server of this checkout (target/release/, or under
$CARGO_TARGET_DIR): cargo build --release -p kvstore --bin kvstore-server.
"""
import argparse, json, os, subprocess, sys, time
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
]

def cli_good_client(server_bin, address):
    client = os.path.join(os.path.dirname(server_bin), "kvstore-client")
    def fn(i):
        r = subprocess.run([client, address, "put", "good", "v%d" % i], capture_output=True, text=True, timeout=10)
        return "OK" if r.returncode == 0 else "exit %d %s" % (r.returncode, (r.stderr or r.stdout).strip()[:60])
    return fn

def run_one(name, fn, transport, claim, server_bin):
    addr = {"tcp": "tcp://127.0.0.1:0", "ws": "ws://127.0.0.1:0/", "shm": "shm://attack%d" % os.getpid()}[transport]
    srv = Server(server_bin, addr)
    time.sleep(0.3)
    if transport == "tcp":
        c = NativeClient(srv.host, srv.port, timeout=10)
        code, msg, _ = c.call("/kv.v1.Store/Put", put_request("big", "b" * MiB))
        assert code == 0, (code, msg)
        c.close()
        good = GoodClient(srv)
    else:
        good = GoodClient(srv, fn=cli_good_client(server_bin, srv.address))
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

def main():
    ap = argparse.ArgumentParser()
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    ap.add_argument("--server", default=os.path.join(target, "release", "kvstore-server"),
                    help="the kvstore-server binary (default: %(default)s)")
    ap.add_argument("--only", default="", help="comma-separated attack name prefixes")
    ap.add_argument("--json")
    a = ap.parse_args()
    want = [w for w in a.only.split(",") if w]
    rows = []
    for name, fn, tr, claim in ATTACKS:
        if want and not any(name.startswith(w) for w in want):
            continue
        print("== %s" % name, flush=True)
        r = run_one(name, fn, tr, claim, a.server)
        print(json.dumps(r, indent=1), flush=True)
        rows.append(r)
    print()
    print("| attack | VmHWM / RSS peak / RSS end / RSS 2 s after (MiB) | claimed bound | good client | attackers / notes |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s / %s / %s / %s (base %s)%s | %s | %s | %s |" % (
            r["attack"], r["vmhwm_MiB"], r["peak_rss_MiB"], r["rss_end_MiB"], r["rss_after_close_MiB"],
            "%s, HWM %s" % (r["rss_base_MiB"], r["vmhwm_base_MiB"]), "" if r["server_alive"] else " SERVER DIED/KILLED", r["claim"], r["good"], r["notes"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)

if __name__ == "__main__":
    main()
