package topspin

import (
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// WithDetails returns a copy of s carrying details (protobuf messages, as gRPC's status
// details) in its KeyStatusDetails trailer: an encoded google.rpc.Status, which the gRPC face
// sends as grpc-status-details-bin.
func (s *Status) WithDetails(details ...proto.Message) (*Status, error) {
	p := &spb.Status{Code: int32(s.Code), Message: s.Message}
	for _, d := range details {
		a, err := anypb.New(d)
		if err != nil {
			return nil, err
		}
		p.Details = append(p.Details, a)
	}
	b, err := proto.Marshal(p)
	if err != nil {
		return nil, err
	}
	out := *s
	out.Trailers = append(s.Trailers[:len(s.Trailers):len(s.Trailers)], MD(KeyStatusDetails, string(b))...)
	return &out, nil
}

// Details are the status details carried in s's KeyStatusDetails trailer (nil without).
func (s *Status) Details() []*anypb.Any {
	v, ok := s.Trailers.Get(KeyStatusDetails)
	if !ok {
		return nil
	}
	p := new(spb.Status)
	if proto.Unmarshal([]byte(v), p) != nil {
		return nil
	}
	return p.Details
}
