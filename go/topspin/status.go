package topspin

import (
	"context"
	"errors"
	"fmt"

	"github.com/topspin-rpc/topspin/go/wire"
)

// Code is a call status code: gRPC's 17 codes, same numbers and meanings.
type Code = wire.Code

// The status codes.
const (
	OK                 = wire.OK
	Canceled           = wire.Canceled
	Unknown            = wire.Unknown
	InvalidArgument    = wire.InvalidArgument
	DeadlineExceeded   = wire.DeadlineExceeded
	NotFound           = wire.NotFound
	AlreadyExists      = wire.AlreadyExists
	PermissionDenied   = wire.PermissionDenied
	ResourceExhausted  = wire.ResourceExhausted
	FailedPrecondition = wire.FailedPrecondition
	Aborted            = wire.Aborted
	OutOfRange         = wire.OutOfRange
	Unimplemented      = wire.Unimplemented
	Internal           = wire.Internal
	Unavailable        = wire.Unavailable
	DataLoss           = wire.DataLoss
	Unauthenticated    = wire.Unauthenticated
)

// Metadata is an ordered list of key/value pairs (keys repeat; "-bin" keys hold bytes).
type Metadata = wire.Metadata

// MD builds metadata from key, value pairs.
func MD(kv ...string) Metadata {
	md := make(Metadata, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		md = append(md, wire.MetadataEntry{Key: kv[i], Value: kv[i+1]})
	}
	return md
}

// Status is the error of a call that did not end with OK: a code, a message, the trailers
// the server sent with it and the response headers that came before it.
//
// Headers (protocol.md §5.4): on the client, the response headers the server sent before the
// failing END (empty if it sent none, or for errors of the client's own); on the server, a
// handler that returns a *Status with Headers set fails the call with those response headers
// (after any SetHeader added): they go in a HEADERS frame before the END if the call has sent
// no headers yet and they fit the client's metadata limit; otherwise the END goes alone.
//
//	return nil, &topspin.Status{Code: topspin.Unavailable, Message: "draining",
//		Headers: topspin.MD("retry-after", "5")}
//
// and on the client:
//
//	if st := topspin.StatusOf(err); st != nil {
//		retry, _ := st.Headers.Get("retry-after")
//	}
type Status struct {
	Code     Code
	Message  string
	Trailers Metadata
	Headers  Metadata
}

func (s *Status) Error() string {
	return fmt.Sprintf("topspin: %s: %s", s.Code, s.Message)
}

// Errorf makes a *Status error for a handler to return.
func Errorf(code Code, format string, args ...any) error {
	return &Status{Code: code, Message: fmt.Sprintf(format, args...)}
}

// StatusOf returns err as a *Status: nil for nil, the status itself, context errors as
// CANCELLED / DEADLINE_EXCEEDED, and anything else as UNKNOWN.
func StatusOf(err error) *Status {
	if err == nil {
		return nil
	}
	var s *Status
	if errors.As(err, &s) {
		return s
	}
	var ce *wire.CallError
	if errors.As(err, &ce) {
		return &Status{Code: ce.Code, Message: ce.Message}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return &Status{Code: DeadlineExceeded, Message: err.Error()}
	case errors.Is(err, context.Canceled):
		return &Status{Code: Canceled, Message: err.Error()}
	}
	return &Status{Code: Unknown, Message: err.Error()}
}

// CodeOf is the status code of err (OK for nil).
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	return StatusOf(err).Code
}

type mdKey struct{}

// WithOutgoingMetadata returns a context whose calls send md (appended to any already set)
// as request metadata.
func WithOutgoingMetadata(ctx context.Context, md Metadata) context.Context {
	old, _ := ctx.Value(mdKey{}).(Metadata)
	return context.WithValue(ctx, mdKey{}, append(old[:len(old):len(old)], md...))
}

// ReplaceOutgoingMetadata returns a context whose calls send md as request metadata,
// replacing any set on ctx before (as grpc-go's metadata.NewOutgoingContext).
func ReplaceOutgoingMetadata(ctx context.Context, md Metadata) context.Context {
	return context.WithValue(ctx, mdKey{}, md[:len(md):len(md)])
}

// OutgoingMetadata is the request metadata set on ctx by WithOutgoingMetadata.
func OutgoingMetadata(ctx context.Context) Metadata {
	md, _ := ctx.Value(mdKey{}).(Metadata)
	return md
}
