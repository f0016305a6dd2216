package topspin_test

import (
	"context"
	"testing"

	"github.com/topspin-rpc/topspin/go/topspin"
)

func BenchmarkUnary20(b *testing.B) {
	s := topspin.NewServer()
	s.Handle("/b.E/E", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) { return req, nil }), topspin.CodecRaw)
	l, _ := topspin.Listen("tcp://127.0.0.1:0")
	go s.Serve(l)
	defer s.Stop()
	cc, err := topspin.Dial(context.Background(), "tcp://"+l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	req := make([]byte, 20)
	opt := topspin.WithCodec(topspin.CodecRaw)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := cc.InvokeRaw(context.Background(), "/b.E/E", req, opt); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUnary20Parallel64(b *testing.B) {
	s := topspin.NewServer()
	s.Handle("/b.E/E", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) { return req, nil }), topspin.CodecRaw)
	l, _ := topspin.Listen("tcp://127.0.0.1:0")
	go s.Serve(l)
	defer s.Stop()
	cc, err := topspin.Dial(context.Background(), "tcp://"+l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	opt := topspin.WithCodec(topspin.CodecRaw)
	b.ReportAllocs()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		req := make([]byte, 20)
		for pb.Next() {
			if _, err := cc.InvokeRaw(context.Background(), "/b.E/E", req, opt); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkUnary2MB(b *testing.B) {
	s := topspin.NewServer()
	s.Handle("/b.E/E", topspin.UnaryRaw(func(_ context.Context, _ topspin.Metadata, req []byte) ([]byte, error) { return req, nil }), topspin.CodecRaw)
	l, _ := topspin.Listen("tcp://127.0.0.1:0")
	go s.Serve(l)
	defer s.Stop()
	cc, err := topspin.Dial(context.Background(), "tcp://"+l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	req := make([]byte, 2<<20)
	opt := topspin.WithCodec(topspin.CodecRaw)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := cc.InvokeRaw(context.Background(), "/b.E/E", req, opt); err != nil {
			b.Fatal(err)
		}
	}
}
