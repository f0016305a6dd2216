package topspin_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/topspin-rpc/topspin/go/examples/kvstore/kvpb"
)

// methods are the method names of t (an interface type).
func methods(t reflect.Type) []string {
	var out []string
	for i := range t.NumMethod() {
		out = append(out, t.Method(i).Name)
	}
	return out
}

// The generated streams expose only their direction: a server-streaming handler cannot
// receive, a client-streaming one cannot send, a server-streaming client cannot send, a
// client-streaming client receives only through CloseAndRecv.
func TestGeneratedStreamsExposeOnlyTheirDirection(t *testing.T) {
	server := reflect.TypeFor[kvpb.StoreServer]()
	client := reflect.TypeFor[*kvpb.StoreClient]()
	serverStream := func(method string) reflect.Type {
		m, _ := server.MethodByName(method)
		return m.Type.In(m.Type.NumIn() - 1)
	}
	clientStream := func(method string) reflect.Type {
		m, _ := client.MethodByName(method)
		return m.Type.Out(0)
	}
	common := []string{"Context", "Metadata", "Method", "SetHeader", "SetTrailer"}
	ccommon := []string{"CancelCall", "Context", "Header", "Trailer"}
	for _, tc := range []struct {
		what string
		typ  reflect.Type
		want []string
	}{
		{"Watch (server streaming) handler", serverStream("Watch"), append([]string{"Send"}, common...)},
		{"Apply (client streaming) handler", serverStream("Apply"), append([]string{"Recv"}, common...)},
		{"GetMany (bidi) handler", serverStream("GetMany"), append([]string{"Recv", "Send"}, common...)},
		{"Watch (server streaming) client", clientStream("Watch"), append([]string{"Recv"}, ccommon...)},
		{"Apply (client streaming) client", clientStream("Apply"), append([]string{"CloseAndRecv", "Send"}, ccommon...)},
		{"GetMany (bidi) client", clientStream("GetMany"), append([]string{"CloseSend", "Recv", "Send"}, ccommon...)},
	} {
		if tc.typ.Kind() != reflect.Interface {
			t.Errorf("%s: stream of kind %s, want an interface", tc.what, tc.typ.Kind())
			continue
		}
		slices.Sort(tc.want)
		if got := methods(tc.typ); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %s has %v, want %v", tc.what, tc.typ, got, tc.want)
		}
	}
}
