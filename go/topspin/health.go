package topspin

import (
	"context"
	"sync"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// HealthStatus is a service's serving status (grpc.health.v1).
type HealthStatus = healthpb.HealthCheckResponse_ServingStatus

// The serving statuses.
const (
	HealthUnknown        = healthpb.HealthCheckResponse_UNKNOWN
	HealthServing        = healthpb.HealthCheckResponse_SERVING
	HealthNotServing     = healthpb.HealthCheckResponse_NOT_SERVING
	HealthServiceUnknown = healthpb.HealthCheckResponse_SERVICE_UNKNOWN
)

// Health is a server's health status table, served as grpc.health.v1.Health on both faces
// (Server.EnableHealth), with grpc-go's semantics: Check answers a service's status or
// NOT_FOUND; Watch sends the current status (SERVICE_UNKNOWN for an unknown service, the
// stream staying open) and then every change, a slow reader skipping to the latest. Safe for
// concurrent use.
type Health struct {
	mu       sync.Mutex
	status   map[string]HealthStatus
	watchers map[string]map[chan HealthStatus]struct{}
	shutdown bool
	closing  chan struct{} // closed when the server stops: watches end; a signal, never sent on
	closed   bool
}

// EnableHealth serves grpc.health.v1.Health (Check, Watch, List) on the native face and the gRPC
// face, and returns its status table. The whole server ("") starts SERVING; other services
// are unknown until given a status. When the server stops (GracefulStop, Stop) every status
// turns NOT_SERVING, the open watches send it and end. Calling it again returns the same table.
func (s *Server) EnableHealth() *Health {
	s.mu.Lock()
	if h := s.health; h != nil {
		s.mu.Unlock()
		return h
	}
	h := &Health{status: map[string]HealthStatus{"": HealthServing},
		watchers: make(map[string]map[chan HealthStatus]struct{}), closing: make(chan struct{})}
	s.health = h
	s.mu.Unlock()
	s.Handle("/grpc.health.v1.Health/Check", Unary(h.check))
	s.Handle("/grpc.health.v1.Health/Watch", ServerStreaming(h.watch))
	s.Handle("/grpc.health.v1.Health/List", Unary(h.list))
	s.RegisterService(healthpb.File_grpc_health_v1_health_proto.Services().ByName("Health"))
	return h
}

func (s *Server) healthTable() *Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.health
}

// SetServingStatus sets service's status ("" for the whole server; a service by its full
// name, e.g. "kv.v1.Store") and tells its watchers. Ignored after Shutdown until Resume.
// HealthServiceUnknown forgets the service (ClearServingStatus).
func (h *Health) SetServingStatus(service string, st HealthStatus) {
	if st == HealthServiceUnknown {
		h.ClearServingStatus(service)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.shutdown {
		h.setLocked(service, st)
	}
}

// ClearServingStatus forgets service: Check answers NOT_FOUND, watchers see SERVICE_UNKNOWN.
func (h *Health) ClearServingStatus(service string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.status, service)
	h.notifyLocked(service, HealthServiceUnknown)
}

// Status is service's status, and whether it has one.
func (h *Health) Status(service string) (HealthStatus, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.status[service]
	return st, ok
}

// Shutdown turns every service NOT_SERVING and ignores later changes until Resume.
func (h *Health) Shutdown() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.shutdown = true
	for svc := range h.status {
		h.setLocked(svc, HealthNotServing)
	}
}

// Resume turns every service SERVING and takes changes again.
func (h *Health) Resume() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.shutdown = false
	for svc := range h.status {
		h.setLocked(svc, HealthServing)
	}
}

// serverStopping is Shutdown, then the end of every watch (once it sent NOT_SERVING).
func (h *Health) serverStopping() {
	h.Shutdown()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.closing)
	}
}

func (h *Health) setLocked(service string, st HealthStatus) {
	h.status[service] = st
	h.notifyLocked(service, st)
}

// notifyLocked gives each watcher of service the latest status (replacing one it has not
// taken yet).
func (h *Health) notifyLocked(service string, st HealthStatus) {
	for ch := range h.watchers[service] {
		select {
		case <-ch:
		default:
		}
		ch <- st
	}
}

func (h *Health) check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st, ok := h.Status(req.GetService())
	if !ok {
		return nil, Errorf(NotFound, "unknown service %q", req.GetService())
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// maxHealthList is the most services List answers (as grpc-go's: more is RESOURCE_EXHAUSTED).
const maxHealthList = 100

func (h *Health) list(context.Context, *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.status) > maxHealthList {
		return nil, Errorf(ResourceExhausted, "server health list exceeds maximum capacity: %d", maxHealthList)
	}
	resp := &healthpb.HealthListResponse{Statuses: make(map[string]*healthpb.HealthCheckResponse, len(h.status))}
	for svc, st := range h.status {
		resp.Statuses[svc] = &healthpb.HealthCheckResponse{Status: st}
	}
	return resp, nil
}

func (h *Health) watch(ctx context.Context, req *healthpb.HealthCheckRequest, stream ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	svc := req.GetService()
	ch := make(chan HealthStatus, 1)
	h.mu.Lock()
	st, ok := h.status[svc]
	if !ok {
		st = HealthServiceUnknown
	}
	ch <- st
	if h.watchers[svc] == nil {
		h.watchers[svc] = make(map[chan HealthStatus]struct{})
	}
	h.watchers[svc][ch] = struct{}{}
	closing := h.closing
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.watchers[svc], ch)
		if len(h.watchers[svc]) == 0 {
			delete(h.watchers, svc)
		}
		h.mu.Unlock()
	}()
	last := HealthStatus(-1)
	send := func(st HealthStatus) error {
		if st == last {
			return nil
		}
		last = st
		return stream.Send(&healthpb.HealthCheckResponse{Status: st})
	}
	for {
		select {
		case st := <-ch:
			if err := send(st); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-closing:
			select {
			case st := <-ch:
				return send(st)
			default:
				return nil
			}
		}
	}
}
