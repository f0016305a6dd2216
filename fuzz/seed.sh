#!/usr/bin/env bash
# Turns the wire test vectors (testdata/vectors/*.json, format in testdata/vectors/README.md)
# into libFuzzer seed corpora:
#   fuzz/corpus/frame_decoder/     every frame vector's bytes, and every session's received
#                                  bytes (after the preface) as one stream
#   fuzz/corpus/connection_input/  every session's received bytes after the peer's preface and
#                                  SETTINGS, behind the target's two option bytes (role: the
#                                  session's; application: passive and answering), and every
#                                  frame vector as a one-frame stream for both roles
#   fuzz/corpus/grpc_wire/         a few gRPC message streams (layout: topspin::fuzzing::
#                                  grpc_wire): messages split over chunks, a gzip one, one over
#                                  the limit, one cut off (written whether or not vectors exist)
# Idempotent: files are named after the vectors and rewritten. Needs python3.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
vectors="${VECTORS_DIR:-$here/../testdata/vectors}"
corpus="${CORPUS_DIR:-$here/corpus}"
mkdir -p "$corpus/frame_decoder" "$corpus/connection_input" "$corpus/grpc_wire"
python3 - "$corpus/grpc_wire" <<'PY'
import gzip, os, sys


def msg(body, flag=0):
    return bytes([flag]) + len(body).to_bytes(4, "big") + body


def seed(name, opts, cuts, timeout, body):
    data = bytes([opts]) + bytes(cuts) + bytes([len(timeout)]) + timeout + body
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(data)


big = bytes(range(256)) * 40  # 10 KiB: split over chunks under the 16 KiB limit
seed("split-messages", 3 << 2, [0, 1, 2, 3, 40, 200, 255, 255], b"100m",
     msg(b"hello") + msg(b"") + msg(b"x-user: ann\n") + msg(big) + msg(b"tail"))
seed("gzip-message", 1 | (3 << 2), [2, 9, 0, 0, 0, 0, 0, 0], b"1S",
     msg(gzip.compress(big), 1) + msg(b"plain"))
seed("over-the-limit", 0, [0, 0, 0, 0, 0, 0, 0, 0], b"", msg(b"x" * 17))
seed("cut-off", 1 << 2, [1, 0, 0, 0, 0, 0, 0, 0], b"5u", msg(b"whole") + msg(b"y" * 100)[:50])
print("seed.sh: 4 grpc_wire seeds in " + sys.argv[1])
PY
shopt -s nullglob
files=("$vectors"/*.json)
if [ ${#files[@]} -eq 0 ]; then
    echo "seed.sh: no vectors in $vectors; nothing to seed" >&2
    exit 0
fi
python3 - "$corpus" "${files[@]}" <<'PY'
import json, os, sys

corpus, files = sys.argv[1], sys.argv[2:]
PREFACE_LEN = 8
HEADER_LEN = 12


def unhex(v):
    """A hex value: a string, or a list of strings and {"repeat": hex, "count": n}."""
    if isinstance(v, str):
        return bytes.fromhex(v)
    out = bytearray()
    for part in v:
        if isinstance(part, str):
            out += bytes.fromhex(part)
        else:
            out += bytes.fromhex(part["repeat"]) * int(part["count"])
    return bytes(out)


def write(target, name, data):
    with open(os.path.join(corpus, target, name), "wb") as f:
        f.write(data)


counts = {"frame_decoder": 0, "connection_input": 0}
for path in files:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("version") != 1:
        sys.exit(f"seed.sh: {path}: unknown vectors version {doc.get('version')!r}")
    stem = os.path.splitext(os.path.basename(path))[0]
    for v in doc.get("vectors", []):
        name = f"{stem}-{v['name']}"
        if v.get("kind") == "frame" and "hex" in v:
            frame = unhex(v["hex"])
            write("frame_decoder", name, frame)
            counts["frame_decoder"] += 1
            for role, opts in (("server", 0b110), ("client", 0b111)):
                write("connection_input", f"{name}-{role}", bytes([opts, 0]) + frame)
                counts["connection_input"] += 1
        elif v.get("kind") == "session":
            stream = b"".join(unhex(s["recv_hex"]) for s in v.get("steps", []) if "recv_hex" in s)
            if len(stream) < PREFACE_LEN:
                continue
            after_preface = stream[PREFACE_LEN:]
            write("frame_decoder", name, after_preface)
            counts["frame_decoder"] += 1
            # Skip the peer's SETTINGS (the target sends its own); keep the rest.
            if len(after_preface) >= HEADER_LEN and after_preface[4] == 0x01:
                length = int.from_bytes(after_preface[:4], "little")
                rest = after_preface[HEADER_LEN + length:]
            else:
                rest = after_preface
            role_bit = 1 if v.get("role") == "client" else 0
            for suffix, opts in (("", role_bit), ("-answering", role_bit | 0b110)):
                write("connection_input", name + suffix, bytes([opts, 0]) + rest)
                counts["connection_input"] += 1
print(f"seed.sh: {counts['frame_decoder']} frame_decoder and "
      f"{counts['connection_input']} connection_input seeds in {corpus}")
PY
