package topspin

import (
	"sort"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// RegisterService records the descriptor of a service whose methods are registered on s, so
// that reflection (the reflection package) can describe it; generated Register functions
// call it. Registering a service twice keeps the last descriptor.
func (s *Server) RegisterService(sd protoreflect.ServiceDescriptor) {
	s.mu.Lock()
	s.services[string(sd.FullName())] = sd
	s.mu.Unlock()
}

// Services are the descriptors recorded with RegisterService, sorted by full name.
func (s *Server) Services() []protoreflect.ServiceDescriptor {
	s.mu.Lock()
	out := make([]protoreflect.ServiceDescriptor, 0, len(s.services))
	for _, sd := range s.services {
		out = append(out, sd)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].FullName() < out[j].FullName() })
	return out
}
