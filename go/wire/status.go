package wire

import "fmt"

// Code is a call status code: gRPC's 17 codes with the same numbers (§11).
type Code uint16

// The status codes (§11).
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

var codeNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
	"ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
	"UNAUTHENTICATED"}

// String is the code's name as in protocol.md §11.
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("CODE(%d)", uint16(c))
}

// ParseCode is the inverse of String for the 17 known codes.
func ParseCode(s string) (Code, bool) {
	for i, n := range codeNames {
		if n == s {
			return Code(i), true
		}
	}
	return 0, false
}

// Known maps a code above 16 to UNKNOWN (§11).
func (c Code) Known() Code {
	if c > Unauthenticated {
		return Unknown
	}
	return c
}

// CallError is a call refused or failed locally by the engine, with its status code.
type CallError struct {
	Code    Code
	Message string
}

func (e *CallError) Error() string { return e.Code.String() + ": " + e.Message }
