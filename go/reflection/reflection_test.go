package reflection_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/topspin-rpc/topspin/go/examples/kvstore"
	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
	"github.com/topspin-rpc/topspin/go/reflection"
	"github.com/topspin-rpc/topspin/go/reflection/reflectionpb"
	"github.com/topspin-rpc/topspin/go/topspin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

func serve(t *testing.T) string {
	t.Helper()
	s := topspin.NewServer()
	kvpb.RegisterStoreServer(s, kvstore.NewStore())
	s.EnableHealth()
	reflection.Register(s)
	l, err := topspin.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

func ctx10(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// decode decodes FileDescriptorProtos and returns them by name.
func decode(t *testing.T, files [][]byte) map[string]*descriptorpb.FileDescriptorProto {
	t.Helper()
	out := map[string]*descriptorpb.FileDescriptorProto{}
	for _, b := range files {
		fd := new(descriptorpb.FileDescriptorProto)
		if err := proto.Unmarshal(b, fd); err != nil {
			t.Fatal(err)
		}
		out[fd.GetName()] = fd
	}
	return out
}

// The native face: topspin.reflection.v1 lists the registered services (kv.v1.Store with its
// methods, health, reflection itself) and serves their files.
func TestNativeReflection(t *testing.T) {
	addr := serve(t)
	ctx := ctx10(t)
	cc, err := topspin.Dial(ctx, "tcp://"+addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	r := reflectionpb.NewReflectionClient(cc)
	list, err := r.ListServices(ctx, &reflectionpb.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Services {
		names = append(names, s.Name)
		if s.Name == "kv.v1.Store" {
			if s.File != "kv/v1/kv.proto" || len(s.Methods) != 6 || s.Methods[0].Path != "/kv.v1.Store/Get" ||
				s.Methods[0].InputType != "kv.v1.GetRequest" || !s.Methods[3].ServerStreaming || s.Methods[3].ClientStreaming {
				t.Fatalf("kv.v1.Store: %v", s)
			}
		}
	}
	want := "grpc.health.v1.Health kv.v1.Store topspin.reflection.v1.Reflection"
	if strings.Join(names, " ") != want {
		t.Fatalf("services %v, want %s", names, want)
	}
	for _, sym := range []string{"kv.v1.Store", "kv.v1.Store.Get", "kv.v1.Entry", ".kv.v1.Entry"} {
		files, err := r.FileContainingSymbol(ctx, &reflectionpb.FileContainingSymbolRequest{Symbol: sym})
		if err != nil {
			t.Fatalf("%s: %v", sym, err)
		}
		fds := decode(t, files.Files)
		if fd := fds["kv/v1/kv.proto"]; fd == nil || fd.GetPackage() != "kv.v1" || len(fd.GetSourceCodeInfo().GetLocation()) == 0 {
			t.Fatalf("%s: files (with their comments) %v", sym, fds)
		}
	}
	if _, err := r.FileContainingSymbol(ctx, &reflectionpb.FileContainingSymbolRequest{Symbol: "no.Such"}); topspin.CodeOf(err) != topspin.NotFound {
		t.Fatalf("unknown symbol: %v", err)
	}
	files, err := r.FileByName(ctx, &reflectionpb.FileByNameRequest{Name: "grpc/health/v1/health.proto"})
	if err != nil || decode(t, files.Files)["grpc/health/v1/health.proto"] == nil {
		t.Fatalf("file by name: %v", err)
	}
	if _, err := r.FileByName(ctx, &reflectionpb.FileByNameRequest{Name: "nope.proto"}); topspin.CodeOf(err) != topspin.NotFound {
		t.Fatalf("unknown file: %v", err)
	}
}

// exchange sends one request on a v1 or v1alpha reflection stream: list services, or the
// file containing symbol.
type exchange func(t *testing.T, list bool, symbol string) (services []string, files [][]byte)

// The gRPC face: grpc.reflection.v1 and v1alpha (grpc-go's client stubs) list the services
// and serve file descriptors.
func TestGRPCReflection(t *testing.T) {
	addr := serve(t)
	gc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gc.Close() })
	for name, ex := range map[string]exchange{"v1": v1Exchange(gc), "v1alpha": v1alphaExchange(gc)} {
		t.Run(name, func(t *testing.T) {
			services, _ := ex(t, true, "")
			sort.Strings(services)
			want := "grpc.health.v1.Health grpc.reflection.v1.ServerReflection grpc.reflection.v1alpha.ServerReflection kv.v1.Store topspin.reflection.v1.Reflection"
			if strings.Join(services, " ") != want {
				t.Fatalf("services %v, want %s", services, want)
			}
			_, files := ex(t, false, "kv.v1.Store")
			fd := decode(t, files)["kv/v1/kv.proto"]
			if fd == nil || len(fd.GetService()) != 1 || fd.GetService()[0].GetName() != "Store" {
				t.Fatalf("file of kv.v1.Store: %v", fd)
			}
			_, files = ex(t, false, "grpc.reflection.v1.ServerReflection")
			if decode(t, files)["grpc/reflection/v1/reflection.proto"] == nil {
				t.Fatal("no file for grpc.reflection.v1.ServerReflection")
			}
		})
	}
}

func v1Exchange(gc *grpc.ClientConn) exchange {
	return func(t *testing.T, list bool, symbol string) ([]string, [][]byte) {
		t.Helper()
		st, err := v1.NewServerReflectionClient(gc).ServerReflectionInfo(ctx10(t))
		if err != nil {
			t.Fatal(err)
		}
		req := &v1.ServerReflectionRequest{MessageRequest: &v1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}}
		if list {
			req.MessageRequest = &v1.ServerReflectionRequest_ListServices{}
		}
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		_ = st.CloseSend()
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("reflection error: %v", e)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		return names, resp.GetFileDescriptorResponse().GetFileDescriptorProto()
	}
}
