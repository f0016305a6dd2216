//go:build !unix

package topspin

import "net"

// listenUnix binds a Unix socket at path (no lock file or mode on this system).
func listenUnix(path string, _ uint32) (net.Listener, error) { return net.Listen("unix", path) }
