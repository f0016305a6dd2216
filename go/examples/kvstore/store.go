package kvstore

import (
	"context"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
	"github.com/topspin-rpc/topspin/go/topspin"
	"google.golang.org/protobuf/proto"
)

// Store is an in-memory kvpb.StoreServer, the Go twin of the Rust example's KvStore.
type Store struct {
	mu       sync.Mutex
	entries  map[string]*kvpb.Entry
	watchers map[*watcher]struct{}
}

type watcher struct {
	prefix string
	events chan *kvpb.Event
	lagged bool
}

// NewStore makes an empty store.
func NewStore() *Store {
	return &Store{entries: map[string]*kvpb.Entry{}, watchers: map[*watcher]struct{}{}}
}

var _ kvpb.StoreServer = (*Store)(nil)

// publish sends ev to the watchers of key (under mu).
func (s *Store) publish(key string, ev *kvpb.Event) {
	for w := range s.watchers {
		if !strings.HasPrefix(key, w.prefix) || w.lagged {
			continue
		}
		select {
		case w.events <- ev:
		default:
			w.lagged = true
			close(w.events)
		}
	}
}

// Get implements kvpb.StoreServer.
func (s *Store) Get(_ context.Context, req *kvpb.GetRequest) (*kvpb.Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[req.GetKey()]
	if !ok {
		return nil, topspin.Errorf(topspin.NotFound, "no key %q", req.GetKey())
	}
	return proto.Clone(e).(*kvpb.Entry), nil
}

func (s *Store) put(req *kvpb.PutRequest) (uint64, error) {
	if req.GetKey() == "" {
		return 0, topspin.Errorf(topspin.InvalidArgument, "the key is empty")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var current uint64
	if e, ok := s.entries[req.GetKey()]; ok {
		current = e.GetVersion()
	}
	if req.ExpectedVersion != nil && req.GetExpectedVersion() != current {
		return 0, topspin.Errorf(topspin.FailedPrecondition, "key %q is at version %d, not %d", req.GetKey(), current, req.GetExpectedVersion())
	}
	e := &kvpb.Entry{Key: req.GetKey(), Value: req.GetValue(), Version: current + 1}
	s.entries[e.Key] = e
	s.publish(e.Key, &kvpb.Event{Kind: &kvpb.Event_Put{Put: proto.Clone(e).(*kvpb.Entry)}})
	return e.Version, nil
}

func (s *Store) delete(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.entries[key]
	if ok {
		delete(s.entries, key)
		s.publish(key, &kvpb.Event{Kind: &kvpb.Event_Deleted{Deleted: key}})
	}
	return ok
}

// Put implements kvpb.StoreServer.
func (s *Store) Put(_ context.Context, req *kvpb.PutRequest) (*kvpb.PutResponse, error) {
	v, err := s.put(req)
	if err != nil {
		return nil, err
	}
	return &kvpb.PutResponse{Version: v}, nil
}

// Delete implements kvpb.StoreServer.
func (s *Store) Delete(_ context.Context, req *kvpb.DeleteRequest) (*kvpb.DeleteResponse, error) {
	return &kvpb.DeleteResponse{Existed: s.delete(req.GetKey())}, nil
}

// Watch implements kvpb.StoreServer.
func (s *Store) Watch(ctx context.Context, req *kvpb.WatchRequest, stream topspin.ServerStreamingServer[kvpb.Event]) error {
	w := &watcher{prefix: req.GetPrefix(), events: make(chan *kvpb.Event, 1024)}
	s.mu.Lock()
	var existing []*kvpb.Entry
	if req.GetIncludeExisting() {
		for k, e := range s.entries {
			if strings.HasPrefix(k, w.prefix) {
				existing = append(existing, proto.Clone(e).(*kvpb.Entry))
			}
		}
	}
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, w)
		s.mu.Unlock()
	}()
	sort.Slice(existing, func(i, j int) bool { return existing[i].Key < existing[j].Key })
	for _, e := range existing {
		if err := stream.Send(&kvpb.Event{Kind: &kvpb.Event_Put{Put: e}}); err != nil {
			return err
		}
	}
	for {
		select {
		case ev, ok := <-w.events:
			if !ok {
				return topspin.Errorf(topspin.ResourceExhausted, "the watcher fell behind; watch again")
			}
			if err := stream.Send(ev); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Apply implements kvpb.StoreServer.
func (s *Store) Apply(_ context.Context, stream topspin.ClientStreamingServer[kvpb.Mutation, kvpb.ApplySummary]) (*kvpb.ApplySummary, error) {
	sum := &kvpb.ApplySummary{}
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return sum, nil
		}
		if err != nil {
			return nil, err
		}
		switch op := m.Op.(type) {
		case *kvpb.Mutation_Put:
			if _, err := s.put(op.Put); err != nil {
				return nil, err
			}
			sum.Puts++
		case *kvpb.Mutation_Delete:
			if s.delete(op.Delete.GetKey()) {
				sum.Deletes++
			}
		default:
			return nil, topspin.Errorf(topspin.InvalidArgument, "a mutation has no op")
		}
	}
}

// GetMany implements kvpb.StoreServer.
func (s *Store) GetMany(ctx context.Context, stream topspin.BidiStreamingServer[kvpb.GetRequest, kvpb.Entry]) error {
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		e, err := s.Get(ctx, req)
		if err != nil {
			return err
		}
		if err := stream.Send(e); err != nil {
			return err
		}
	}
}
