package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
)

// Every vector of compression.json (kind "compression", protocol.md §15).
func TestCompressionVectors(t *testing.T) {
	n := 0
	for _, v := range loadVectors(t, "compression.json") {
		if v["kind"] != "compression" {
			continue
		}
		n++
		name := v["name"].(string)
		t.Run(name, func(t *testing.T) {
			limit, err := strconv.ParseUint(string(v["limit"].(json.Number)), 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decompress(v["encoding"].(string), hexValue(t, v["payload"]), uint32(limit))
			if want, ok := v["message"]; ok {
				if err != nil {
					t.Fatalf("error %v, want message", err)
				}
				if w := hexValue(t, want); !bytes.Equal(got, w) {
					t.Fatalf("decoded %x, want %x", got, w)
				}
				return
			}
			want := statusFromJSON(t, v["code"])
			var ce *CallError
			if !errors.As(err, &ce) || uint16(ce.Code) != want {
				t.Fatalf("got %x, %v; want %v", got, err, want)
			}
		})
	}
	if n == 0 {
		t.Fatal("no compression vectors")
	}
}

// Compress and Decompress round-trip; small or incompressible messages go with flag 0.
func TestCompressRoundTrip(t *testing.T) {
	big := []byte(strings.Repeat("topspin compresses ", 200))
	for _, enc := range []string{EncodingZstd, EncodingGzip} {
		for _, msg := range [][]byte{nil, []byte("hi"), big} {
			p, err := Compress(enc, msg)
			if err != nil {
				t.Fatal(err)
			}
			if wantFlag := byte(0); len(msg) >= CompressMin {
				wantFlag = 1
				if p[0] != wantFlag || len(p) >= len(msg) {
					t.Fatalf("%s: flag %d, %d bytes for %d", enc, p[0], len(p), len(msg))
				}
			} else if p[0] != wantFlag {
				t.Fatalf("%s: small message with flag %d", enc, p[0])
			}
			got, err := Decompress(enc, p, uint32(len(msg)))
			if err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("%s: round trip %d bytes: %v", enc, len(msg), err)
			}
		}
	}
	if _, err := Compress("br", []byte("x")); err == nil {
		t.Fatal("unknown encoding accepted")
	}
}
