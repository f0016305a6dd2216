package topspin

import (
	"sort"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
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

// DescribedService is sd taken from its file described again with the comments of its
// .proto (sourceInfo: an encoded google.protobuf.SourceCodeInfo, which protoc-gen-go's
// descriptors leave out), so that reflection shows them; sd itself when sourceInfo is empty
// or does not fit. Generated Register functions use it.
func DescribedService(sd protoreflect.ServiceDescriptor, sourceInfo string) protoreflect.ServiceDescriptor {
	if sourceInfo == "" {
		return sd
	}
	fdp := protodesc.ToFileDescriptorProto(sd.ParentFile())
	fdp.SourceCodeInfo = new(descriptorpb.SourceCodeInfo)
	if proto.Unmarshal([]byte(sourceInfo), fdp.SourceCodeInfo) != nil {
		return sd
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		return sd
	}
	if d := fd.Services().ByName(sd.Name()); d != nil {
		return d
	}
	return sd
}
