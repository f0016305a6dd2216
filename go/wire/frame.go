// Package wire implements the topspin wire protocol v1 (docs/protocol.md): the frame codec
// and a sans-IO connection engine that turns received bytes into events and application
// commands into bytes to send. It does no I/O and starts no goroutine.
package wire

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// Preface is the 8-byte connection preface of protocol version 1 (§2).
var Preface = [8]byte{'T', 'O', 'P', 'S', 'P', 'I', 'N', 1}

// HeaderLen is the size of a frame header (§3).
const HeaderLen = 12

// Frame types (§5).
const (
	TypeSettings     uint8 = 0x01
	TypeCall         uint8 = 0x02
	TypeMessage      uint8 = 0x03
	TypeContinuation uint8 = 0x04
	TypeHeaders      uint8 = 0x05
	TypeHalfClose    uint8 = 0x06
	TypeEnd          uint8 = 0x07
	TypeCancel       uint8 = 0x08
	TypeCredit       uint8 = 0x09
	TypePing         uint8 = 0x0A
	TypeGoAway       uint8 = 0x0B
	TypeError        uint8 = 0x0C
)

// Frame flags.
const (
	FlagNamed     uint8 = 0x01 // CALL
	FlagEndStream uint8 = 0x01 // MESSAGE
	FlagSplit     uint8 = 0x02 // MESSAGE
	FlagAck       uint8 = 0x01 // PING
)

// Limits of the protocol.
const (
	MaxMethodID   = 1023
	MaxMethodName = 1024
	MaxText       = 65535
	MaxWindow     = 1<<31 - 1
)

// ErrCode is a protocol (connection) error code (§10).
type ErrCode uint16

// Connection error codes (§10).
const (
	NoError               ErrCode = 0
	BadPreface            ErrCode = 1
	UnsupportedVersion    ErrCode = 2
	SettingsError         ErrCode = 3
	FrameTooLarge         ErrCode = 4
	UnknownFrameType      ErrCode = 5
	MalformedFrame        ErrCode = 6
	IllegalFrame          ErrCode = 7
	UnknownCall           ErrCode = 8
	DuplicateCall         ErrCode = 9
	MethodIDError         ErrCode = 10
	FlowControl           ErrCode = 11
	MessageLengthMismatch ErrCode = 12
	Timeout               ErrCode = 13
	InternalError         ErrCode = 14
	EnhanceYourCalm       ErrCode = 15
)

var errNames = [...]string{"NO_ERROR", "BAD_PREFACE", "UNSUPPORTED_VERSION", "SETTINGS_ERROR",
	"FRAME_TOO_LARGE", "UNKNOWN_FRAME_TYPE", "MALFORMED_FRAME", "ILLEGAL_FRAME", "UNKNOWN_CALL",
	"DUPLICATE_CALL", "METHOD_ID_ERROR", "FLOW_CONTROL", "MESSAGE_LENGTH_MISMATCH", "TIMEOUT",
	"INTERNAL_ERROR", "ENHANCE_YOUR_CALM"}

// String is the code's name in protocol.md, or its number for an unknown one.
func (c ErrCode) String() string {
	if int(c) < len(errNames) {
		return errNames[c]
	}
	return fmt.Sprint(uint16(c))
}

// ParseErrCode is the inverse of String.
func ParseErrCode(s string) (ErrCode, bool) {
	for i, n := range errNames {
		if n == s {
			return ErrCode(i), true
		}
	}
	return 0, false
}

// Error is a connection error: a code and a reason for people.
type Error struct {
	Code   ErrCode
	Reason string
}

func (e *Error) Error() string { return e.Code.String() + ": " + e.Reason }

func perr(code ErrCode, format string, args ...any) *Error {
	return &Error{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// Setting ids (§4).
const (
	SettingMaxFrameSize       uint16 = 1
	SettingMaxConcurrentCalls uint16 = 2
	SettingInitialCallWindow  uint16 = 3
	SettingMaxMessageSize     uint16 = 4
	SettingMaxMetadataSize    uint16 = 5
)

// Settings are one side's receive limits (§4).
type Settings struct {
	MaxFrameSize       uint32
	MaxConcurrentCalls uint32
	InitialCallWindow  uint32
	MaxMessageSize     uint32
	MaxMetadataSize    uint32
}

// DefaultSettings are the values of settings not sent.
func DefaultSettings() Settings {
	return Settings{MaxFrameSize: 16 << 20, MaxConcurrentCalls: 1024, InitialCallWindow: 1 << 20,
		MaxMessageSize: 64 << 20, MaxMetadataSize: 16 << 10}
}

// SettingEntry is one entry of a SETTINGS frame.
type SettingEntry struct {
	ID    uint16
	Value uint32
}

// Apply applies entries in order to s (unknown ids ignored) and checks the ranges.
func (s Settings) Apply(entries []SettingEntry) (Settings, *Error) {
	for _, e := range entries {
		switch e.ID {
		case SettingMaxFrameSize:
			s.MaxFrameSize = e.Value
		case SettingMaxConcurrentCalls:
			s.MaxConcurrentCalls = e.Value
		case SettingInitialCallWindow:
			s.InitialCallWindow = e.Value
		case SettingMaxMessageSize:
			s.MaxMessageSize = e.Value
		case SettingMaxMetadataSize:
			s.MaxMetadataSize = e.Value
		}
	}
	return s, s.Validate()
}

// Validate checks every value against its valid range (§4).
func (s Settings) Validate() *Error {
	switch {
	case s.MaxFrameSize < 16384 || s.MaxFrameSize > MaxWindow:
		return perr(SettingsError, "MAX_FRAME_SIZE %d outside 16384..=2147483647", s.MaxFrameSize)
	case s.MaxConcurrentCalls > MaxWindow:
		return perr(SettingsError, "MAX_CONCURRENT_CALLS %d above 2147483647", s.MaxConcurrentCalls)
	case s.InitialCallWindow > MaxWindow:
		return perr(SettingsError, "INITIAL_CALL_WINDOW %d above 2147483647", s.InitialCallWindow)
	case s.MaxMetadataSize < 4:
		return perr(SettingsError, "MAX_METADATA_SIZE %d below 4", s.MaxMetadataSize)
	}
	return nil
}

// Entries lists all five settings in id order.
func (s Settings) Entries() []SettingEntry {
	return []SettingEntry{{SettingMaxFrameSize, s.MaxFrameSize},
		{SettingMaxConcurrentCalls, s.MaxConcurrentCalls},
		{SettingInitialCallWindow, s.InitialCallWindow},
		{SettingMaxMessageSize, s.MaxMessageSize},
		{SettingMaxMetadataSize, s.MaxMetadataSize}}
}

// MetadataEntry is one key/value pair; a key ending in "-bin" has a binary value.
type MetadataEntry struct {
	Key   string
	Value string
}

// Metadata is a metadata block: entries in wire order, keys may repeat (§5.1).
type Metadata []MetadataEntry

// Get returns the first value of key.
func (m Metadata) Get(key string) (string, bool) {
	for _, e := range m {
		if e.Key == key {
			return e.Value, true
		}
	}
	return "", false
}

// Size is the block's encoded length: 2 + Σ(3 + key + value).
func (m Metadata) Size() int {
	n := 2
	for _, e := range m {
		n += 3 + len(e.Key) + len(e.Value)
	}
	return n
}

// ValidKey reports whether k is a legal metadata key (1..=255 bytes of 0-9 a-z - _ .).
func ValidKey(k string) bool {
	if len(k) == 0 || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// IsBinaryKey reports whether k's value is binary (the key ends in "-bin").
func IsBinaryKey(k string) bool { return len(k) >= 4 && k[len(k)-4:] == "-bin" }

// Validate checks keys and text values as a receiver would.
func (m Metadata) Validate() error {
	if len(m) > 65535 {
		return fmt.Errorf("metadata: %d entries, at most 65535", len(m))
	}
	for _, e := range m {
		if !ValidKey(e.Key) {
			return fmt.Errorf("metadata: invalid key %q (1..=255 bytes of 0-9 a-z - _ .)", e.Key)
		}
		if len(e.Value) > 65535 {
			return fmt.Errorf("metadata: value of %q is %d bytes, at most 65535", e.Key, len(e.Value))
		}
		if !IsBinaryKey(e.Key) && !utf8.ValidString(e.Value) {
			return fmt.Errorf("metadata: text value of %q is not UTF-8", e.Key)
		}
	}
	return nil
}

// Frame is one decoded frame. Only the fields of its type are set. Byte slices may point
// into the decoder's input.
type Frame struct {
	Type   uint8
	Flags  uint8
	CallID uint32

	Entries []SettingEntry // SETTINGS

	MethodID   uint16   // CALL
	MethodName string   // CALL, when NAMED
	Codec      uint8    // CALL
	TimeoutUs  uint64   // CALL
	Metadata   Metadata // CALL, HEADERS; END's trailers

	TotalLen uint32 // MESSAGE with SPLIT
	Chunk    []byte // MESSAGE, CONTINUATION

	Code       uint16  // END, CANCEL (status); GOAWAY, ERROR (error code)
	Message    string  // END's message; GOAWAY's and ERROR's reason
	Increment  uint32  // CREDIT
	Data       [8]byte // PING
	LastCallID uint32  // GOAWAY
	Payload    []byte  // extension types 0x80..=0xFF
}

// Named reports a CALL's NAMED flag.
func (f *Frame) Named() bool { return f.Flags&FlagNamed != 0 }

// EndStream reports a MESSAGE's END_STREAM flag.
func (f *Frame) EndStream() bool { return f.Flags&FlagEndStream != 0 }

// Split reports a MESSAGE's SPLIT flag.
func (f *Frame) Split() bool { return f.Flags&FlagSplit != 0 }

// Ack reports a PING's ACK flag.
func (f *Frame) Ack() bool { return f.Flags&FlagAck != 0 }

// IsConnectionFrame reports whether type t must use call id 0.
func IsConnectionFrame(t uint8) bool {
	return t == TypeSettings || t == TypePing || t == TypeGoAway || t == TypeError
}

// CheckHeader checks a 12-byte header on its own (§3): FRAME_TOO_LARGE, UNKNOWN_FRAME_TYPE,
// and the call id 0 rules. It returns the payload length.
func CheckHeader(h []byte, maxFrameSize uint32) (uint32, *Error) {
	length := binary.LittleEndian.Uint32(h[0:])
	typ := h[4]
	callID := binary.LittleEndian.Uint32(h[8:])
	if length > maxFrameSize {
		return 0, perr(FrameTooLarge, "frame of %d bytes above MAX_FRAME_SIZE %d", length, maxFrameSize)
	}
	if typ == 0 || (typ >= 0x0D && typ <= 0x7F) {
		return 0, perr(UnknownFrameType, "unknown frame type 0x%02x", typ)
	}
	if typ < 0x80 {
		if IsConnectionFrame(typ) && callID != 0 {
			return 0, perr(IllegalFrame, "connection frame type 0x%02x on call %d", typ, callID)
		}
		if !IsConnectionFrame(typ) && callID == 0 {
			return 0, perr(IllegalFrame, "call frame type 0x%02x on call id 0", typ)
		}
	}
	return length, nil
}

// Decode decodes one frame from the start of buf. It returns n == 0 and no error when buf
// does not yet hold the whole frame (a FRAME_TOO_LARGE header is an error from its 12 bytes).
func Decode(buf []byte, maxFrameSize uint32) (f Frame, n int, err *Error) {
	if len(buf) < HeaderLen {
		return f, 0, nil
	}
	length, err := CheckHeader(buf, maxFrameSize)
	if err != nil {
		return f, 0, err
	}
	if uint64(len(buf)) < HeaderLen+uint64(length) {
		return f, 0, nil
	}
	f.Type, f.Flags, f.CallID = buf[4], buf[5], binary.LittleEndian.Uint32(buf[8:])
	err = decodePayload(&f, buf[HeaderLen:HeaderLen+int(length)])
	return f, HeaderLen + int(length), err
}

type reader struct {
	b   []byte
	bad bool
}

func (r *reader) u8() uint8 {
	if len(r.b) < 1 {
		r.bad = true
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}
func (r *reader) u16() uint16 {
	if len(r.b) < 2 {
		r.bad = true
		r.b = nil
		return 0
	}
	v := binary.LittleEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}
func (r *reader) u32() uint32 {
	if len(r.b) < 4 {
		r.bad = true
		r.b = nil
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}
func (r *reader) u64() uint64 {
	if len(r.b) < 8 {
		r.bad = true
		r.b = nil
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}
func (r *reader) bytes(n int) []byte {
	if len(r.b) < n {
		r.bad = true
		r.b = nil
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func malformed(t uint8, what string) *Error {
	return perr(MalformedFrame, "frame type 0x%02x: %s", t, what)
}

func (r *reader) text(t uint8, what string) (string, *Error) {
	n := r.u16()
	b := r.bytes(int(n))
	if r.bad {
		return "", malformed(t, what+" runs past the payload")
	}
	if !utf8.Valid(b) {
		return "", malformed(t, what+" is not UTF-8")
	}
	return string(b), nil
}

func (r *reader) metadata(t uint8) (Metadata, *Error) {
	count := r.u16()
	if r.bad {
		return nil, malformed(t, "no metadata block")
	}
	var md Metadata
	if count > 0 {
		md = make(Metadata, 0, min(int(count), len(r.b)/3+1))
	} else {
		md = Metadata{}
	}
	for i := 0; i < int(count); i++ {
		kl := r.u8()
		vl := r.u16()
		k := r.bytes(int(kl))
		v := r.bytes(int(vl))
		if r.bad {
			return nil, malformed(t, "metadata entry runs past the payload")
		}
		ks := string(k)
		if !ValidKey(ks) {
			return nil, malformed(t, fmt.Sprintf("invalid metadata key %q", ks))
		}
		if !IsBinaryKey(ks) && !utf8.Valid(v) {
			return nil, malformed(t, fmt.Sprintf("metadata value of %q is not UTF-8", ks))
		}
		md = append(md, MetadataEntry{Key: ks, Value: string(v)})
	}
	return md, nil
}

func decodePayload(f *Frame, p []byte) *Error {
	r := reader{b: p}
	t := f.Type
	var err *Error
	switch t {
	case TypeSettings:
		if len(p)%6 != 0 {
			return malformed(t, fmt.Sprintf("SETTINGS length %d not a multiple of 6", len(p)))
		}
		f.Entries = make([]SettingEntry, 0, len(p)/6)
		for len(r.b) > 0 {
			id := r.u16()
			f.Entries = append(f.Entries, SettingEntry{ID: id, Value: r.u32()})
		}
		if _, err := DefaultSettings().Apply(f.Entries); err != nil {
			return err
		}
		return nil
	case TypeCall:
		f.MethodID = r.u16()
		f.Codec = r.u8()
		r.u8()
		f.TimeoutUs = r.u64()
		if r.bad {
			return malformed(t, "CALL shorter than its 12 fixed bytes")
		}
		if f.Named() {
			if f.MethodName, err = r.text(t, "method name"); err != nil {
				return err
			}
			if len(f.MethodName) == 0 || len(f.MethodName) > MaxMethodName {
				return malformed(t, fmt.Sprintf("method name of %d bytes (1..=1024)", len(f.MethodName)))
			}
		}
		if f.Metadata, err = r.metadata(t); err != nil {
			return err
		}
	case TypeMessage:
		if f.Split() {
			f.TotalLen = r.u32()
			if r.bad {
				return malformed(t, "SPLIT MESSAGE without room for total_len")
			}
		}
		f.Chunk = r.b
		r.b = nil
	case TypeContinuation:
		f.Chunk = r.b
		r.b = nil
	case TypeHeaders:
		if f.Metadata, err = r.metadata(t); err != nil {
			return err
		}
	case TypeHalfClose:
	case TypeEnd:
		f.Code = r.u16()
		if r.bad {
			return malformed(t, "END shorter than its code")
		}
		if f.Message, err = r.text(t, "status message"); err != nil {
			return err
		}
		if f.Metadata, err = r.metadata(t); err != nil {
			return err
		}
	case TypeCancel:
		if len(p) != 2 {
			return malformed(t, "CANCEL payload is not 2 bytes")
		}
		f.Code = r.u16()
	case TypeCredit:
		if len(p) != 4 {
			return malformed(t, "CREDIT payload is not 4 bytes")
		}
		f.Increment = r.u32()
		if f.Increment == 0 || f.Increment > MaxWindow {
			return malformed(t, fmt.Sprintf("CREDIT increment %d outside 1..=2147483647", f.Increment))
		}
	case TypePing:
		if len(p) != 8 {
			return malformed(t, "PING payload is not 8 bytes")
		}
		copy(f.Data[:], p)
		r.b = nil
	case TypeGoAway:
		f.LastCallID = r.u32()
		f.Code = r.u16()
		if r.bad {
			return malformed(t, "GOAWAY shorter than its fixed fields")
		}
		if f.Message, err = r.text(t, "reason"); err != nil {
			return err
		}
	case TypeError:
		f.Code = r.u16()
		if r.bad {
			return malformed(t, "ERROR shorter than its code")
		}
		if f.Message, err = r.text(t, "reason"); err != nil {
			return err
		}
	default: // extension 0x80..=0xFF
		f.Payload = p
		r.b = nil
	}
	if len(r.b) != 0 {
		return malformed(t, fmt.Sprintf("%d bytes left over after the last field", len(r.b)))
	}
	return nil
}

// AppendHeader appends a frame header.
func AppendHeader(dst []byte, length uint32, typ, flags uint8, callID uint32) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, length)
	dst = append(dst, typ, flags, 0, 0)
	return binary.LittleEndian.AppendUint32(dst, callID)
}

// CutText cuts s at the last UTF-8 character boundary at or before max bytes.
func CutText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

func appendText(dst []byte, s string) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// AppendMetadata appends a metadata block.
func AppendMetadata(dst []byte, md Metadata) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(md)))
	for _, e := range md {
		dst = append(dst, uint8(len(e.Key)))
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(e.Value)))
		dst = append(dst, e.Key...)
		dst = append(dst, e.Value...)
	}
	return dst
}

// Append encodes f (its header with the length computed) to dst. Texts longer than 65535
// bytes are cut at a character boundary.
func Append(dst []byte, f *Frame) []byte {
	start := len(dst)
	dst = AppendHeader(dst, 0, f.Type, f.Flags, f.CallID)
	switch f.Type {
	case TypeSettings:
		for _, e := range f.Entries {
			dst = binary.LittleEndian.AppendUint16(dst, e.ID)
			dst = binary.LittleEndian.AppendUint32(dst, e.Value)
		}
	case TypeCall:
		dst = binary.LittleEndian.AppendUint16(dst, f.MethodID)
		dst = append(dst, f.Codec, 0)
		dst = binary.LittleEndian.AppendUint64(dst, f.TimeoutUs)
		if f.Named() {
			dst = appendText(dst, CutText(f.MethodName, MaxText))
		}
		dst = AppendMetadata(dst, f.Metadata)
	case TypeMessage:
		if f.Split() {
			dst = binary.LittleEndian.AppendUint32(dst, f.TotalLen)
		}
		dst = append(dst, f.Chunk...)
	case TypeContinuation:
		dst = append(dst, f.Chunk...)
	case TypeHeaders:
		dst = AppendMetadata(dst, f.Metadata)
	case TypeHalfClose:
	case TypeEnd:
		dst = binary.LittleEndian.AppendUint16(dst, f.Code)
		dst = appendText(dst, CutText(f.Message, MaxText))
		dst = AppendMetadata(dst, f.Metadata)
	case TypeCancel:
		dst = binary.LittleEndian.AppendUint16(dst, f.Code)
	case TypeCredit:
		dst = binary.LittleEndian.AppendUint32(dst, f.Increment)
	case TypePing:
		dst = append(dst, f.Data[:]...)
	case TypeGoAway:
		dst = binary.LittleEndian.AppendUint32(dst, f.LastCallID)
		dst = binary.LittleEndian.AppendUint16(dst, f.Code)
		dst = appendText(dst, CutText(f.Message, MaxText))
	case TypeError:
		dst = binary.LittleEndian.AppendUint16(dst, f.Code)
		dst = appendText(dst, CutText(f.Message, MaxText))
	default:
		dst = append(dst, f.Payload...)
	}
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start-HeaderLen))
	return dst
}
