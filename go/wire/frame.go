package wire

import "fmt"

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
