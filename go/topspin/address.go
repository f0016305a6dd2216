package topspin

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"
)

// ALPN is the TLS application protocol name of topspin v1 (protocol.md §14.1).
const ALPN = "topspin/1"

// ALPNGRPC is the TLS application protocol of the gRPC face (HTTP/2), which a tls:// listener
// offers after ALPN unless given WithGRPC(false).
const ALPNGRPC = "h2"

// withALPN returns a copy of cfg (or of an empty config) offering only topspin/1.
func withALPN(cfg *tls.Config) *tls.Config {
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg = cfg.Clone()
	cfg.NextProtos = []string{ALPN}
	if cfg.MinVersion < tls.VersionTLS12 {
		cfg.MinVersion = tls.VersionTLS12
	}
	return cfg
}

// ParseTarget splits "tcp://host:port", "tls://host:port", "unix:///path" or "host:port" into
// network and address (the network of tls:// is "tls": TCP with TLS on it).
func ParseTarget(target string) (network, addr string, err error) {
	switch {
	case strings.HasPrefix(target, "tls://"):
		return "tls", strings.TrimPrefix(target, "tls://"), nil
	case strings.HasPrefix(target, "tcp://"):
		return "tcp", strings.TrimPrefix(target, "tcp://"), nil
	case strings.HasPrefix(target, "unix://"):
		return "unix", strings.TrimPrefix(target, "unix://"), nil
	case strings.HasPrefix(target, "unix:@"):
		// A Linux abstract socket, as the other implementations write it (Go's net
		// package names it with a leading '@').
		return "unix", strings.TrimPrefix(target, "unix:"), nil
	case strings.Contains(target, "://"):
		return "", "", fmt.Errorf("topspin: unsupported scheme in %q (tcp://, tls:// or unix://)", target)
	}
	return "tcp", target, nil
}

// Listen opens a listener for "tcp://host:port", "unix:///path" or "tls://host:port"; the
// last needs WithTLS with a server certificate. Its connections select ALPN topspin/1, or
// "h2" (the gRPC face) for a client that offers only that, and refuse a client that offers
// ALPN without either (TLS alert no_application_protocol; without "h2" under WithGRPC(false)).
//
// A Unix socket file is bound as the Rust server binds it: under a lock on "<path>.lock"
// (so that servers starting together cannot race), a stale socket file (nothing answers on
// it) is replaced, a live server's never (an *AddrInUseError); the file gets
// WithUnixSocketMode's bits (default 0o660) and is removed when the listener closes, if it
// is still this listener's. "unix:@name" is a Linux abstract socket: no file.
func Listen(target string, opts ...Option) (net.Listener, error) {
	network, addr, err := ParseTarget(target)
	if err != nil {
		return nil, err
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	switch network {
	case "unix":
		return listenUnix(addr, o.unixMode)
	case "tcp":
		return net.Listen(network, addr)
	}
	if o.tls == nil || (len(o.tls.Certificates) == 0 && o.tls.GetCertificate == nil && o.tls.GetConfigForClient == nil) {
		return nil, fmt.Errorf("topspin: %s needs WithTLS with a server certificate", target)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	cfg := withALPN(o.tls)
	if !o.grpcOff {
		cfg.NextProtos = append(cfg.NextProtos, ALPNGRPC) // topspin/1 first: it wins when offered
	}
	return tls.NewListener(l, cfg), nil
}
