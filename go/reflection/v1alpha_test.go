//lint:file-ignore SA1019 grpc.reflection.v1alpha is deprecated, and served on purpose: many tools still ask for it first.

package reflection_test

import (
	"testing"

	"google.golang.org/grpc"
	v1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
)

func v1alphaExchange(gc *grpc.ClientConn) exchange {
	return func(t *testing.T, list bool, symbol string) ([]string, [][]byte) {
		t.Helper()
		st, err := v1alpha.NewServerReflectionClient(gc).ServerReflectionInfo(ctx10(t))
		if err != nil {
			t.Fatal(err)
		}
		req := &v1alpha.ServerReflectionRequest{MessageRequest: &v1alpha.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}}
		if list {
			req.MessageRequest = &v1alpha.ServerReflectionRequest_ListServices{}
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
