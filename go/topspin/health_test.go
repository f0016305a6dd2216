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

// healthServer is a server with health enabled before it serves, "f.S" SERVING; it returns
// the server, its table, a gRPC health client and a native client.
func healthServer(t *testing.T) (*topspin.Server, *topspin.Health, healthpb.HealthClient, *topspin.ClientConn) {
	t.Helper()
	s := topspin.NewServer()
	h := s.EnableHealth()
	if s.EnableHealth() != h {
		t.Fatal("EnableHealth made a second table")
	}
	h.SetServingStatus("f.S", topspin.HealthServing)
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	gc, err := grpc.NewClient("passthrough:///"+l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gc.Close() })
	return s, h, healthpb.NewHealthClient(gc), dial(t, "tcp://"+l.Addr().String())
}

// grpc.health.v1 Check and List on both faces from one table: the server (""), a service,
// NOT_FOUND for an unknown one, a change seen by both.
func TestHealthCheckOnBothFaces(t *testing.T) {
	_, h, g, nc := healthServer(t)
	ctx := ctx10(t)
	nativeCheck := func(svc string) (healthpb.HealthCheckResponse_ServingStatus, error) {
		resp := new(healthpb.HealthCheckResponse)
		err := nc.Invoke(ctx, "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{Service: svc}, resp)
		return resp.GetStatus(), err
	}
	want := func(svc string, st healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		if r, err := g.Check(ctx, &healthpb.HealthCheckRequest{Service: svc}); err != nil || r.Status != st {
			t.Fatalf("gRPC check %q: %v %v, want %v", svc, r, err, st)
		}
		if got, err := nativeCheck(svc); err != nil || got != st {
			t.Fatalf("native check %q: %v %v, want %v", svc, got, err, st)
		}
	}
	want("", topspin.HealthServing)
	want("f.S", topspin.HealthServing)
	list, err := g.List(ctx, &healthpb.HealthListRequest{})
	if err != nil || len(list.Statuses) != 2 || list.Statuses["f.S"].GetStatus() != topspin.HealthServing {
		t.Fatalf("gRPC list: %v %v", list, err)
	}
	nlist := new(healthpb.HealthListResponse)
	if err := nc.Invoke(ctx, "/grpc.health.v1.Health/List", &healthpb.HealthListRequest{}, nlist); err != nil || len(nlist.Statuses) != 2 {
		t.Fatalf("native list: %v %v", nlist, err)
	}
	h.SetServingStatus("f.S", topspin.HealthNotServing)
	want("f.S", topspin.HealthNotServing)
	if _, err := g.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("gRPC check of an unknown service: %v", err)
	}
	if _, err := nativeCheck("nope"); topspin.CodeOf(err) != topspin.NotFound {
		t.Fatalf("native check of an unknown service: %v", err)
	}
}

// healthWatch is a watch on either face.
type healthWatch interface {
	Recv() (*healthpb.HealthCheckResponse, error)
}

// Watch on both faces: the current status, then changes (SERVICE_UNKNOWN for an unknown
// service, which may appear later); a graceful stop turns everything NOT_SERVING and ends the
// watches, which do not hold the stop.
func TestHealthWatchOnBothFaces(t *testing.T) {
	s, h, g, nc := healthServer(t)
	ctx := ctx10(t)
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
	watches := map[string]healthWatch{"gRPC": gw, "native": nw}
	next := func(what string, w healthWatch, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		if r, err := w.Recv(); err != nil || r.Status != want {
			t.Fatalf("%s watch: %v %v, want %v", what, r, err, want)
		}
	}
	for face, w := range watches {
		next(face, w, topspin.HealthServing)
	}
	next("unknown service", uw, topspin.HealthServiceUnknown)
	h.SetServingStatus("f.S", topspin.HealthNotServing)
	h.SetServingStatus("later", topspin.HealthServing)
	for face, w := range watches {
		next(face, w, topspin.HealthNotServing)
	}
	next("service that appeared", uw, topspin.HealthServing)
	h.SetServingStatus("f.S", topspin.HealthServing)
	for face, w := range watches {
		next(face, w, topspin.HealthServing)
	}

	stopped := make(chan struct{}) // a signal: closed, never sent on
	go func() { s.GracefulStop(); close(stopped) }()
	for face, w := range watches {
		next(face+" on stop", w, topspin.HealthNotServing)
		if _, err := w.Recv(); err != io.EOF {
			t.Fatalf("%s watch end: %v", face, err)
		}
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
