// Package reflection describes a topspin server's services to tools, from the descriptors
// its generated Register functions record (topspin.Server.RegisterService):
//
//   - on the native face, topspin.reflection.v1.Reflection (ListServices,
//     FileContainingSymbol, FileByName): what the `topspin` command's list, describe and
//     call use;
//   - on the gRPC face, gRPC server reflection, grpc.reflection.v1 and v1alpha (grpc-go's
//     implementation), for grpcurl, Postman and the like.
//
// One call enables both: reflection.Register(srv), before srv.Serve.
package reflection

import (
	"context"
	"strings"

	"github.com/topspin-rpc/topspin/go/reflection/reflectionpb"
	"github.com/topspin-rpc/topspin/go/topspin"
	"google.golang.org/grpc"
	grpcreflect "google.golang.org/grpc/reflection"
	v1grpc "google.golang.org/grpc/reflection/grpc_reflection_v1"
	v1alphagrpc "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Register serves reflection on s: topspin.reflection.v1 on the native face,
// grpc.reflection.v1 and v1alpha on the gRPC face. It describes the services registered on
// s with their descriptors (generated Register functions record them; Server.RegisterService
// for others), whenever they were registered.
func Register(s *topspin.Server) {
	r := &server{s: s}
	reflectionpb.RegisterReflectionServer(s, r)
	opts := grpcreflect.ServerOptions{Services: r, DescriptorResolver: r}
	s.RegisterGRPCService(&v1grpc.ServerReflection_ServiceDesc, grpcreflect.NewServerV1(opts))
	s.RegisterGRPCService(&v1alphagrpc.ServerReflection_ServiceDesc, grpcreflect.NewServer(opts))
}

// gRPC reflection's own files, described on the gRPC face.
var grpcReflectionFiles = []protoreflect.FileDescriptor{
	v1grpc.File_grpc_reflection_v1_reflection_proto,
	v1alphagrpc.File_grpc_reflection_v1alpha_reflection_proto,
}

type server struct{ s *topspin.Server }

// files are the registered services' files, their imports and gRPC reflection's files.
func (r *server) files() *protoregistry.Files {
	var reg protoregistry.Files
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		_ = reg.RegisterFile(fd) // a conflicting name: the first file keeps it
	}
	for _, sd := range r.s.Services() {
		add(sd.ParentFile())
	}
	for _, fd := range grpcReflectionFiles {
		add(fd)
	}
	return &reg
}

// FindFileByPath implements protodesc.Resolver for gRPC reflection.
func (r *server) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	return r.files().FindFileByPath(path)
}

// FindDescriptorByName implements protodesc.Resolver for gRPC reflection.
func (r *server) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	return r.files().FindDescriptorByName(name)
}

// GetServiceInfo lists the services for gRPC reflection: the registered ones and gRPC
// reflection itself.
func (r *server) GetServiceInfo() map[string]grpc.ServiceInfo {
	out := map[string]grpc.ServiceInfo{}
	add := func(sd protoreflect.ServiceDescriptor) {
		info := grpc.ServiceInfo{Metadata: sd.ParentFile().Path()}
		ms := sd.Methods()
		for i := 0; i < ms.Len(); i++ {
			m := ms.Get(i)
			info.Methods = append(info.Methods, grpc.MethodInfo{Name: string(m.Name()),
				IsClientStream: m.IsStreamingClient(), IsServerStream: m.IsStreamingServer()})
		}
		out[string(sd.FullName())] = info
	}
	for _, sd := range r.s.Services() {
		add(sd)
	}
	for _, fd := range grpcReflectionFiles {
		add(fd.Services().Get(0))
	}
	return out
}

// ListServices lists the registered services with their methods, sorted by name (gRPC
// reflection's services left out: they are for gRPC tools).
func (r *server) ListServices(context.Context, *reflectionpb.ListServicesRequest) (*reflectionpb.ListServicesResponse, error) {
	resp := &reflectionpb.ListServicesResponse{}
	for _, sd := range r.s.Services() {
		if strings.HasPrefix(string(sd.FullName()), "grpc.reflection.") {
			continue
		}
		info := &reflectionpb.ServiceInfo{Name: string(sd.FullName()), File: sd.ParentFile().Path()}
		ms := sd.Methods()
		for i := 0; i < ms.Len(); i++ {
			m := ms.Get(i)
			info.Methods = append(info.Methods, &reflectionpb.MethodInfo{
				Name:            string(m.Name()),
				Path:            "/" + string(sd.FullName()) + "/" + string(m.Name()),
				ClientStreaming: m.IsStreamingClient(),
				ServerStreaming: m.IsStreamingServer(),
				InputType:       string(m.Input().FullName()),
				OutputType:      string(m.Output().FullName()),
			})
		}
		resp.Services = append(resp.Services, info)
	}
	return resp, nil
}

// FileContainingSymbol answers the file defining a symbol, after the files it imports.
func (r *server) FileContainingSymbol(_ context.Context, req *reflectionpb.FileContainingSymbolRequest) (*reflectionpb.FileDescriptors, error) {
	name := strings.TrimPrefix(req.GetSymbol(), ".")
	d, err := r.files().FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return nil, topspin.Errorf(topspin.NotFound, "symbol %q not found", name)
	}
	return withImports(d.ParentFile())
}

// FileByName answers a file by its name, after the files it imports.
func (r *server) FileByName(_ context.Context, req *reflectionpb.FileByNameRequest) (*reflectionpb.FileDescriptors, error) {
	fd, err := r.files().FindFileByPath(req.GetName())
	if err != nil {
		return nil, topspin.Errorf(topspin.NotFound, "file %q not found", req.GetName())
	}
	return withImports(fd)
}

// withImports encodes fd and every file it imports, each after the files it imports.
func withImports(fd protoreflect.FileDescriptor) (*reflectionpb.FileDescriptors, error) {
	out := &reflectionpb.FileDescriptors{}
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor) error
	add = func(fd protoreflect.FileDescriptor) error {
		if seen[fd.Path()] {
			return nil
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := 0; i < imports.Len(); i++ {
			if err := add(imports.Get(i).FileDescriptor); err != nil {
				return err
			}
		}
		b, err := proto.Marshal(protodesc.ToFileDescriptorProto(fd))
		if err != nil {
			return topspin.Errorf(topspin.Internal, "encode %s: %v", fd.Path(), err)
		}
		out.Files = append(out.Files, b)
		return nil
	}
	if err := add(fd); err != nil {
		return nil, err
	}
	return out, nil
}
