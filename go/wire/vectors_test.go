package wire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vectorDir is testdata/vectors at the repository's root.
var vectorDir = filepath.Join("..", "..", "testdata", "vectors")

type vectorFile struct {
	Version int              `json:"version"`
	Vectors []map[string]any `json:"vectors"`
}

func loadVectors(t testing.TB, name string) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(vectorDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var f vectorFile
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&f); err != nil {
		t.Fatal(err)
	}
	if f.Version != 1 {
		t.Fatalf("%s: unknown version %d", name, f.Version)
	}
	if len(f.Vectors) == 0 {
		t.Fatalf("%s: no vectors", name)
	}
	return f.Vectors
}

// hexValue decodes the hex forms of the README: a string or a list of parts.
func hexValue(t testing.TB, v any) []byte {
	t.Helper()
	switch x := v.(type) {
	case string:
		b, err := hex.DecodeString(x)
		if err != nil {
			t.Fatalf("bad hex %q: %v", x, err)
		}
		return b
	case []any:
		var out []byte
		for _, p := range x {
			if m, ok := p.(map[string]any); ok {
				r := hexValue(t, m["repeat"])
				out = append(out, bytes.Repeat(r, int(num(m["count"])))...)
			} else {
				out = append(out, hexValue(t, p)...)
			}
		}
		return out
	}
	t.Fatalf("bad hex value %v", v)
	return nil
}

// normalize turns every *_hex field of expected values into a plain hex string.
func normalize(t testing.TB, v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			if k == "hex" || strings.HasSuffix(k, "_hex") {
				out[k] = hex.EncodeToString(hexValue(t, val))
			} else {
				out[k] = normalize(t, val)
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = normalize(t, x[i])
		}
		return out
	}
	return v
}

// generic round-trips v through JSON so that it compares with decoded expectations.
func generic(v any) any {
	b, _ := json.Marshal(v)
	var out any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	_ = dec.Decode(&out)
	return out
}

var typeNames = map[uint8]string{TypeSettings: "SETTINGS", TypeCall: "CALL", TypeMessage: "MESSAGE",
	TypeContinuation: "CONTINUATION", TypeHeaders: "HEADERS", TypeHalfClose: "HALF_CLOSE",
	TypeEnd: "END", TypeCancel: "CANCEL", TypeCredit: "CREDIT", TypePing: "PING",
	TypeGoAway: "GOAWAY", TypeError: "ERROR"}

func mdJSON(md Metadata) []any {
	out := []any{}
	for _, e := range md {
		if IsBinaryKey(e.Key) {
			out = append(out, map[string]any{"key": e.Key, "value_hex": hex.EncodeToString([]byte(e.Value))})
		} else {
			out = append(out, map[string]any{"key": e.Key, "value": e.Value})
		}
	}
	return out
}

func mdFromJSON(t testing.TB, v any) Metadata {
	md := Metadata{}
	list, _ := v.([]any)
	for _, x := range list {
		m := x.(map[string]any)
		e := MetadataEntry{Key: m["key"].(string)}
		if s, ok := m["value"].(string); ok {
			e.Value = s
		} else {
			e.Value = string(hexValue(t, m["value_hex"]))
		}
		md = append(md, e)
	}
	return md
}

func statusName(c uint16) any {
	return Code(c).Known().String()
}

func errName(c uint16) any {
	if int(c) < len(errNames) {
		return ErrCode(c).String()
	}
	return c
}

func frameJSON(f *Frame) map[string]any {
	m := map[string]any{"flags": f.Flags, "call_id": f.CallID}
	name, ok := typeNames[f.Type]
	if !ok {
		name = "EXTENSION"
		m["ext_type"] = f.Type
		m["payload_hex"] = hex.EncodeToString(f.Payload)
	}
	m["type"] = name
	switch f.Type {
	case TypeSettings:
		es := []any{}
		for _, e := range f.Entries {
			es = append(es, map[string]any{"id": e.ID, "value": e.Value})
		}
		m["entries"] = es
		s, _ := DefaultSettings().Apply(f.Entries)
		m["settings"] = map[string]any{"MAX_FRAME_SIZE": s.MaxFrameSize, "MAX_CONCURRENT_CALLS": s.MaxConcurrentCalls,
			"INITIAL_CALL_WINDOW": s.InitialCallWindow, "MAX_MESSAGE_SIZE": s.MaxMessageSize, "MAX_METADATA_SIZE": s.MaxMetadataSize}
	case TypeCall:
		m["method_id"] = f.MethodID
		if f.Named() {
			m["method_name"] = f.MethodName
		} else {
			m["method_name"] = nil
		}
		m["codec"] = f.Codec
		m["timeout_us"] = f.TimeoutUs
		m["metadata"] = mdJSON(f.Metadata)
	case TypeMessage:
		m["end_stream"] = f.EndStream()
		if f.Split() {
			m["total_len"] = f.TotalLen
		} else {
			m["total_len"] = nil
		}
		m["chunk_hex"] = hex.EncodeToString(f.Chunk)
	case TypeContinuation:
		m["chunk_hex"] = hex.EncodeToString(f.Chunk)
	case TypeHeaders:
		m["metadata"] = mdJSON(f.Metadata)
	case TypeEnd:
		m["code"] = statusName(f.Code)
		m["message"] = f.Message
		m["trailers"] = mdJSON(f.Metadata)
	case TypeCancel:
		m["code"] = statusName(f.Code)
	case TypeCredit:
		m["increment"] = f.Increment
	case TypePing:
		m["ack"] = f.Ack()
		m["data_hex"] = hex.EncodeToString(f.Data[:])
	case TypeGoAway:
		m["last_call_id"] = f.LastCallID
		m["code"] = errName(f.Code)
		m["reason"] = f.Message
	case TypeError:
		m["code"] = errName(f.Code)
		m["reason"] = f.Message
	}
	return generic(m).(map[string]any)
}

func num(v any) uint64 {
	n, _ := v.(json.Number)
	u, _ := strconv.ParseUint(string(n), 10, 64)
	return u
}

func statusFromJSON(t testing.TB, v any) uint16 {
	if s, ok := v.(string); ok {
		c, ok := ParseCode(s)
		if !ok {
			t.Fatalf("unknown status %q", s)
		}
		return uint16(c)
	}
	return uint16(num(v))
}

func errFromJSON(t testing.TB, v any) uint16 {
	if s, ok := v.(string); ok {
		c, ok := ParseErrCode(s)
		if !ok {
			t.Fatalf("unknown error code %q", s)
		}
		return uint16(c)
	}
	return uint16(num(v))
}

func frameFromJSON(t testing.TB, m map[string]any) *Frame {
	f := &Frame{Flags: uint8(num(m["flags"])), CallID: uint32(num(m["call_id"]))}
	name := m["type"].(string)
	for k, v := range typeNames {
		if v == name {
			f.Type = k
		}
	}
	switch name {
	case "EXTENSION":
		f.Type = uint8(num(m["ext_type"]))
		f.Payload = hexValue(t, m["payload_hex"])
	case "SETTINGS":
		for _, e := range m["entries"].([]any) {
			em := e.(map[string]any)
			f.Entries = append(f.Entries, SettingEntry{ID: uint16(num(em["id"])), Value: uint32(num(em["value"]))})
		}
	case "CALL":
		f.MethodID = uint16(num(m["method_id"]))
		if s, ok := m["method_name"].(string); ok {
			f.MethodName = s
		}
		f.Codec = uint8(num(m["codec"]))
		f.TimeoutUs = num(m["timeout_us"])
		f.Metadata = mdFromJSON(t, m["metadata"])
	case "MESSAGE":
		if m["total_len"] != nil {
			f.TotalLen = uint32(num(m["total_len"]))
		}
		f.Chunk = hexValue(t, m["chunk_hex"])
	case "CONTINUATION":
		f.Chunk = hexValue(t, m["chunk_hex"])
	case "HEADERS":
		f.Metadata = mdFromJSON(t, m["metadata"])
	case "END":
		f.Code = statusFromJSON(t, m["code"])
		f.Message = m["message"].(string)
		f.Metadata = mdFromJSON(t, m["trailers"])
	case "CANCEL":
		f.Code = statusFromJSON(t, m["code"])
	case "CREDIT":
		f.Increment = uint32(num(m["increment"]))
	case "PING":
		copy(f.Data[:], hexValue(t, m["data_hex"]))
	case "GOAWAY":
		f.LastCallID = uint32(num(m["last_call_id"]))
		f.Code = errFromJSON(t, m["code"])
		f.Message = m["reason"].(string)
	case "ERROR":
		f.Code = errFromJSON(t, m["code"])
		f.Message = m["reason"].(string)
	}
	return f
}

func maxFrame(v map[string]any) uint32 {
	if x, ok := v["max_frame_size"]; ok {
		return uint32(num(x))
	}
	return 16777216
}

func TestFramesValid(t *testing.T) {
	for _, v := range loadVectors(t, "frames_valid.json") {
		name := v["name"].(string)
		t.Run(name, func(t *testing.T) {
			in := hexValue(t, v["hex"])
			f, n, err := Decode(in, maxFrame(v))
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if n != len(in) {
				t.Fatalf("consumed %d of %d bytes", n, len(in))
			}
			want := normalize(t, v["frame"]).(map[string]any)
			got := frameJSON(&f)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded\n got %v\nwant %v", got, want)
			}
			if rt, ok := v["roundtrip"].(bool); ok && !rt {
				return
			}
			out := Append(nil, frameFromJSON(t, v["frame"].(map[string]any)))
			if !bytes.Equal(out, in) {
				t.Fatalf("encoded\n got %x\nwant %x", out, in)
			}
		})
	}
}

func TestFramesInvalid(t *testing.T) {
	for _, v := range loadVectors(t, "frames_invalid.json") {
		name := v["name"].(string)
		t.Run(name, func(t *testing.T) {
			in := hexValue(t, v["hex"])
			_, _, err := Decode(in, maxFrame(v))
			if err == nil {
				t.Fatalf("decoded without error")
			}
			if want := v["error"].(string); err.Code.String() != want {
				t.Fatalf("error %v, want %s", err, want)
			}
		})
	}
}

func settingsFromJSON(t testing.TB, v any) Settings {
	s := DefaultSettings()
	m, _ := v.(map[string]any)
	for k, x := range m {
		val := uint32(num(x))
		switch k {
		case "MAX_FRAME_SIZE":
			s.MaxFrameSize = val
		case "MAX_CONCURRENT_CALLS":
			s.MaxConcurrentCalls = val
		case "INITIAL_CALL_WINDOW":
			s.InitialCallWindow = val
		case "MAX_MESSAGE_SIZE":
			s.MaxMessageSize = val
		case "MAX_METADATA_SIZE":
			s.MaxMetadataSize = val
		default:
			t.Fatalf("unknown setting %s", k)
		}
	}
	return s
}

var eventNames = map[EventType]string{EvEstablished: "Established", EvCallStarted: "CallStarted",
	EvHeaders: "Headers", EvMessage: "Message", EvHalfClosed: "HalfClosed", EvEnded: "Ended",
	EvCancelled: "Cancelled", EvWritable: "Writable", EvPong: "Pong", EvGoAway: "GoAway", EvClosed: "Closed"}

func eventJSON(e *Event) map[string]any {
	m := map[string]any{"type": eventNames[e.Type]}
	switch e.Type {
	case EvCallStarted:
		m["call_id"], m["method"], m["codec"], m["timeout_us"], m["metadata"] = e.CallID, e.Method, e.Codec, e.TimeoutUs, mdJSON(e.Metadata)
	case EvHeaders:
		m["call_id"], m["metadata"] = e.CallID, mdJSON(e.Metadata)
	case EvMessage:
		m["call_id"], m["message_hex"] = e.CallID, hex.EncodeToString(e.Message)
	case EvHalfClosed, EvWritable:
		m["call_id"] = e.CallID
	case EvEnded:
		m["call_id"], m["code"], m["message"], m["trailers"] = e.CallID, e.Code.String(), e.Text, mdJSON(e.Metadata)
	case EvCancelled:
		m["call_id"], m["code"], m["message"] = e.CallID, e.Code.String(), e.Text
	case EvPong:
		m["data_hex"] = hex.EncodeToString(e.Data[:])
	case EvGoAway:
		m["last_call_id"], m["code"], m["reason"] = e.LastCall, errName(uint16(e.ErrCode)), e.Text
	case EvClosed:
		if e.Err != nil {
			m["error"] = errName(uint16(e.Err.Code))
		} else {
			m["error"] = nil
		}
	}
	return generic(m).(map[string]any)
}

// partialMatch: every field of want is in got with the same value.
func partialMatch(got, want map[string]any) bool {
	for k, w := range want {
		if !reflect.DeepEqual(got[k], w) {
			return false
		}
	}
	return true
}

func matchList(t *testing.T, what string, got []map[string]any, want []any, unordered bool) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d, want %d\n got %v\nwant %v", what, len(got), len(want), got, want)
	}
	used := make([]bool, len(got))
	for i, w := range want {
		wm := w.(map[string]any)
		if !unordered {
			if !partialMatch(got[i], wm) {
				t.Fatalf("%s %d:\n got %v\nwant %v", what, i, got[i], wm)
			}
			continue
		}
		found := false
		for j := range got {
			if !used[j] && partialMatch(got[j], wm) {
				used[j], found = true, true
				break
			}
		}
		if !found {
			t.Fatalf("%s: no match for %v in %v", what, wm, got)
		}
	}
}

func TestSessions(t *testing.T) {
	for _, file := range []string{"sessions_valid.json", "sessions_invalid.json"} {
		for _, v := range loadVectors(t, file) {
			name := v["name"].(string)
			for _, bytewise := range []bool{false, true} {
				mode := "whole"
				if bytewise {
					mode = "bytewise"
				}
				t.Run(name+"/"+mode, func(t *testing.T) { runSession(t, normalize(t, v).(map[string]any), bytewise) })
			}
		}
	}
}

func limitsFromJSON(v any) Limits {
	l := DefaultLimits()
	m, _ := v.(map[string]any)
	for k, x := range m {
		switch k {
		case "PING_BURST":
			l.PingBurst = int(num(x))
		case "RAPID_RESET_BURST":
			l.RapidResetBurst = int(num(x))
		case "REFUSED_CALL_BURST":
			l.RefusedCallBurst = int(num(x))
		}
	}
	return l
}

func runSession(t *testing.T, v map[string]any, bytewise bool) {
	role := Server
	if v["role"] == "client" {
		role = Client
	}
	c, err := NewConn(role, settingsFromJSON(t, v["local_settings"]), limitsFromJSON(v["local_limits"]))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	c.TakeOutput(nil, nil) // our preface and SETTINGS
	var sent []map[string]any
	var events []map[string]any
	var pending []byte
	var recvErr error
	collectSent := func() {
		bufs, _ := c.TakeOutput(nil, nil)
		pending = append(pending, bytes.Join(bufs, nil)...)
		for {
			f, n, err := Decode(pending, MaxWindow)
			if err != nil {
				t.Fatalf("engine sent an undecodable frame: %v (%x)", err, pending)
			}
			if n == 0 {
				break
			}
			sent = append(sent, frameJSON(&f))
			pending = pending[n:]
		}
	}
	collectEvents := func() {
		for {
			e, ok := c.PollEvent()
			if !ok {
				return
			}
			events = append(events, eventJSON(&e))
		}
	}
	steps := v["steps"].([]any)
	for i, s := range steps {
		step := s.(map[string]any)
		if recvErr != nil {
			if _, ok := step["expect_error"]; !ok {
				if _, ok := step["expect_sent"]; !ok {
					if _, ok := step["expect_events"]; !ok {
						t.Fatalf("step %d after a receive error %v", i, recvErr)
					}
				}
			}
		}
		switch {
		case step["recv_hex"] != nil:
			data := hexValue(t, step["recv_hex"])
			if bytewise {
				for j := range data {
					if recvErr = c.Receive(data[j:j+1], now); recvErr != nil {
						break
					}
				}
			} else {
				recvErr = c.Receive(data, now)
			}
			next := map[string]any{}
			if i+1 < len(steps) {
				next = steps[i+1].(map[string]any)
			}
			if _, ok := next["expect_error"]; !ok && recvErr != nil {
				t.Fatalf("step %d: unexpected error %v", i, recvErr)
			}
		case step["expect_error"] != nil:
			var pe *Error
			if !errors.As(recvErr, &pe) {
				t.Fatalf("step %d: expected error %v, got %v", i, step["expect_error"], recvErr)
			}
			if pe.Code.String() != step["expect_error"].(string) {
				t.Fatalf("step %d: error %v, want %v", i, pe, step["expect_error"])
			}
		case step["expect_sent"] != nil:
			collectSent()
			got := []map[string]any{}
			for _, f := range sent {
				if f["type"] != "CREDIT" || step["include_credit"] == true {
					got = append(got, f)
				}
			}
			sent = nil
			matchList(t, fmt.Sprintf("step %d sent", i), got, step["expect_sent"].([]any), false)
		case step["expect_events"] != nil:
			collectEvents()
			got := []map[string]any{}
			for _, e := range events {
				if e["type"] != "Writable" {
					got = append(got, e)
				}
			}
			events = nil
			unordered, _ := step["unordered"].(bool)
			matchList(t, fmt.Sprintf("step %d events", i), got, step["expect_events"].([]any), unordered)
		case step["command"] != nil:
			collectSent() // keep the output order independent of when it is read
			runCommand(t, c, i, step)
		default:
			t.Fatalf("step %d: unknown step %v", i, step)
		}
	}
}

func runCommand(t *testing.T, c *Conn, i int, s map[string]any) {
	id := uint32(num(s["call_id"]))
	var err error
	switch s["command"] {
	case "start_call":
		var got uint32
		got, err = c.StartCall(s["method"].(string), uint8(num(s["codec"])), num(s["timeout_us"]), mdFromJSON(t, s["metadata"]))
		if s["refused"] == true {
			if err == nil {
				t.Fatalf("step %d: call was not refused", i)
			}
			return
		}
		if err == nil && got != id {
			t.Fatalf("step %d: call id %d, want %d", i, got, id)
		}
	case "send_headers":
		err = c.SendHeaders(id, mdFromJSON(t, s["metadata"]))
	case "send_message":
		end, _ := s["end_stream"].(bool)
		err = c.SendMessage(id, hexValue(t, s["message_hex"]), end)
		if s["blocked"] == true {
			if !errors.Is(err, ErrBlocked) {
				t.Fatalf("step %d: want ErrBlocked, got %v", i, err)
			}
			return
		}
	case "half_close":
		err = c.HalfClose(id)
	case "end_call":
		msg, _ := s["message"].(string)
		err = c.EndCall(id, Code(statusFromJSON(t, s["code"])), msg, mdFromJSON(t, s["trailers"]))
	case "cancel":
		err = c.Cancel(id, Code(statusFromJSON(t, s["code"])))
	case "grant_credit":
		err = c.GrantCredit(id, uint32(num(s["increment"])))
	case "ping":
		var d [8]byte
		copy(d[:], hexValue(t, s["data_hex"]))
		err = c.Ping(d)
	case "go_away":
		reason, _ := s["reason"].(string)
		err = c.GoAway(ErrCode(errFromJSON(t, s["code"])), reason)
	default:
		t.Fatalf("step %d: unknown command %v", i, s["command"])
	}
	if err != nil {
		t.Fatalf("step %d: %v: %v", i, s["command"], err)
	}
}
