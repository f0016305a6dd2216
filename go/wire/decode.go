package wire

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

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

// decodePayload decodes the payload of f's type into f (§5, §6).
func decodePayload(f *Frame, p []byte) *Error {
	r := reader{b: p}
	t := f.Type
	var err *Error
	switch t {
	case TypeSettings:
		return decodeSettings(f, p)
	case TypeCall:
		err = r.call(f)
	case TypeMessage:
		if f.Split() {
			f.TotalLen = r.u32()
			if r.bad {
				return malformed(t, "SPLIT MESSAGE without room for total_len")
			}
		}
		f.Chunk, r.b = r.b, nil
	case TypeContinuation:
		f.Chunk, r.b = r.b, nil
	case TypeHeaders:
		f.Metadata, err = r.metadata(t)
	case TypeHalfClose:
	case TypeEnd:
		err = r.end(f)
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
	case TypeGoAway, TypeError:
		err = r.connectionError(f)
	default: // extension 0x80..=0xFF
		f.Payload, r.b = p, nil
	}
	if err != nil {
		return err
	}
	if len(r.b) != 0 {
		return malformed(t, fmt.Sprintf("%d bytes left over after the last field", len(r.b)))
	}
	return nil
}

// decodeSettings decodes a SETTINGS payload: 6-byte entries whose values must be in range.
func decodeSettings(f *Frame, p []byte) *Error {
	if len(p)%6 != 0 {
		return malformed(TypeSettings, fmt.Sprintf("SETTINGS length %d not a multiple of 6", len(p)))
	}
	r := reader{b: p}
	f.Entries = make([]SettingEntry, 0, len(p)/6)
	for len(r.b) > 0 {
		id := r.u16()
		f.Entries = append(f.Entries, SettingEntry{ID: id, Value: r.u32()})
	}
	if _, err := DefaultSettings().Apply(f.Entries); err != nil {
		return err
	}
	return nil
}

// call decodes a CALL payload: method id, codec, reserved byte, timeout, the method name
// when NAMED, metadata.
func (r *reader) call(f *Frame) *Error {
	t := f.Type
	f.MethodID = r.u16()
	f.Codec = r.u8()
	r.u8()
	f.TimeoutUs = r.u64()
	if r.bad {
		return malformed(t, "CALL shorter than its 12 fixed bytes")
	}
	if f.Named() {
		var err *Error
		if f.MethodName, err = r.text(t, "method name"); err != nil {
			return err
		}
		if len(f.MethodName) == 0 || len(f.MethodName) > MaxMethodName {
			return malformed(t, fmt.Sprintf("method name of %d bytes (1..=1024)", len(f.MethodName)))
		}
	}
	var err *Error
	f.Metadata, err = r.metadata(t)
	return err
}

// end decodes an END payload: code, status message, trailers.
func (r *reader) end(f *Frame) *Error {
	f.Code = r.u16()
	if r.bad {
		return malformed(f.Type, "END shorter than its code")
	}
	var err *Error
	if f.Message, err = r.text(f.Type, "status message"); err != nil {
		return err
	}
	f.Metadata, err = r.metadata(f.Type)
	return err
}

// connectionError decodes a GOAWAY (last call id, code, reason) or an ERROR (code, reason).
func (r *reader) connectionError(f *Frame) *Error {
	if f.Type == TypeGoAway {
		f.LastCallID = r.u32()
	}
	f.Code = r.u16()
	if r.bad && f.Type == TypeGoAway {
		return malformed(f.Type, "GOAWAY shorter than its fixed fields")
	}
	if r.bad {
		return malformed(f.Type, "ERROR shorter than its code")
	}
	var err *Error
	f.Message, err = r.text(f.Type, "reason")
	return err
}
