package topspin_test

import (
	"io"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/topspin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// watchNext is the next status of a watch (either face), or fails the test.
type watchNext func() healthpb.HealthCheckResponse_ServingStatus

// grpc.health.v1 on both faces from one table: Check (NOT_FOUND for an unknown service),
// Watch (current status, then changes; SERVICE_UNKNOWN for an unknown service), and a
// graceful stop that turns everything NOT_SERVING and ends the watches.
func TestHealthOnBothFaces(t *testing.T) {
	s, addr := healthServer(t)
	h := s.EnableHealth()
	if s.EnableHealth() != h {
		t.Fatal("EnableHealth made a second table")
	}
	h.SetServingStatus("f.S", topspin.HealthServing)
	ctx := ctx10(t)

	gc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gc.Close() })
	g := healthpb.NewHealthClient(gc)
	nc := dial(t, "tcp://"+addr)
	nativeCheck := func(svc string) (healthpb.HealthCheckResponse_ServingStatus, error) {
		resp := new(healthpb.HealthCheckResponse)
		err := nc.Invoke(ctx, "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{Service: svc}, resp)
		return resp.GetStatus(), err
	}
	for _, svc := range []string{"", "f.S"} {
		if r, err := g.Check(ctx, &healthpb.HealthCheckRequest{Service: svc}); err != nil || r.Status != topspin.HealthServing {
			t.Fatalf("gRPC check %q: %v %v", svc, r, err)
		}
		if st, err := nativeCheck(svc); err != nil || st != topspin.HealthServing {
			t.Fatalf("native check %q: %v %v", svc, st, err)
		}
	}
	if _, err := g.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("gRPC check of an unknown service: %v", err)
	}
	if _, err := nativeCheck("nope"); topspin.CodeOf(err) != topspin.NotFound {
		t.Fatalf("native check of an unknown service: %v", err)
	}

	gw, err := g.Watch(ctx, &healthpb.HealthCheckRequest{Service: "f.S"})
	if err != nil {
		t.Fatal(err)
	}
	nw, err := topspin.NewStreamOf[healthpb.HealthCheckRequest, healthpb.HealthCheckResponse](ctx, nc,
		"/grpc.health.v1.Health/Watch", &healthpb.HealthCheckRequest{Service: "f.S"})
	if err != nil {
		t.Fatal(err)
	}
	uw, err := g.Watch(ctx, &healthpb.HealthCheckRequest{Service: "later"})
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]watchNext{
		"gRPC": func() healthpb.HealthCheckResponse_ServingStatus {
			r, err := gw.Recv()
			if err != nil {
				t.Fatalf("gRPC watch: %v", err)
			}
			return r.Status
		},
		"native": func() healthpb.HealthCheckResponse_ServingStatus {
			r, err := nw.Recv()
			if err != nil {
				t.Fatalf("native watch: %v", err)
			}
			return r.Status
		},
	}
	for face, n := range next {
		if st := n(); st != topspin.HealthServing {
			t.Fatalf("%s watch: first %v", face, st)
		}
	}
	if r, err := uw.Recv(); err != nil || r.Status != topspin.HealthServiceUnknown {
		t.Fatalf("watch of an unknown service: %v %v", r, err)
	}
	h.SetServingStatus("f.S", topspin.HealthNotServing)
	h.SetServingStatus("later", topspin.HealthServing)
	for face, n := range next {
		if st := n(); st != topspin.HealthNotServing {
			t.Fatalf("%s watch after the change: %v", face, st)
		}
	}
	if r, err := uw.Recv(); err != nil || r.Status != topspin.HealthServing {
		t.Fatalf("watch of a service that appeared: %v %v", r, err)
	}
	h.SetServingStatus("f.S", topspin.HealthServing)
	for _, n := range next {
		n()
	}

	// A graceful stop: NOT_SERVING, then each watch ends (and does not hold the stop).
	stopped := make(chan struct{}) // a signal: closed, never sent on
	go func() { s.GracefulStop(); close(stopped) }()
	for face, n := range next {
		if st := n(); st != topspin.HealthNotServing {
			t.Fatalf("%s watch on stop: %v", face, st)
		}
	}
	if _, err := gw.Recv(); err != io.EOF {
		t.Fatalf("gRPC watch end: %v", err)
	}
	if _, err := nw.Recv(); err != io.EOF {
		t.Fatalf("native watch end: %v", err)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop held by the watches")
	}
	if st, ok := h.Status(""); !ok || st != topspin.HealthNotServing {
		t.Fatalf("after the stop: %v", st)
	}
}

// healthServer is a server with health enabled before it serves.
func healthServer(t *testing.T) (*topspin.Server, string) {
	t.Helper()
	s := topspin.NewServer()
	s.EnableHealth()
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return s, l.Addr().String()
}
