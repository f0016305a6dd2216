package wire

import (
	"encoding/binary"
	"unicode/utf8"
)

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
