//go:build unix

package topspin

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// AddrInUseError says a Unix socket path is taken by a live server (or another server is
// binding it); errors.Is(err, syscall.EADDRINUSE) holds.
type AddrInUseError struct{ Path, Reason string }

func (e *AddrInUseError) Error() string { return "address in use: " + e.Reason }

// Unwrap is syscall.EADDRINUSE.
func (e *AddrInUseError) Unwrap() error { return syscall.EADDRINUSE }

// bindLockWait is how long a server waits for another one binding the same path.
const bindLockWait = 2 * time.Second

// listenUnix binds a Unix socket file at path with permission bits mode, under the path's
// lock (see Listen).
func listenUnix(path string, mode uint32) (net.Listener, error) {
	if strings.HasPrefix(path, "@") {
		return net.Listen("unix", path) // abstract: no file, no lock, no mode
	}
	unlock, err := lockPath(path)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := clearStaleSocket(path); err != nil {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false) // unixListener.Close removes the file only if it is still ours
	fi, err := os.Lstat(path)
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	ul := &unixListener{UnixListener: l, path: path, file: fi}
	if err := syscall.Chmod(path, mode&0o7777); err != nil {
		_ = ul.Close()
		return nil, &os.PathError{Op: "chmod", Path: path, Err: err}
	}
	return ul, nil
}

// unixListener removes its socket file when closed, unless another server has bound the
// path since.
type unixListener struct {
	*net.UnixListener
	path string
	file os.FileInfo
	once sync.Once
}

func (l *unixListener) Close() error {
	l.once.Do(func() {
		if fi, err := os.Lstat(l.path); err == nil && os.SameFile(fi, l.file) {
			_ = os.Remove(l.path)
		}
	})
	return l.UnixListener.Close()
}

// clearStaleSocket makes way for binding at path: a socket file nothing answers on (left by
// a server that died) is removed; one a live server answers on is an *AddrInUseError.
// Called with the path's lock held.
func clearStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&fs.ModeSocket == 0 {
		return nil // nothing there, or not a socket: bind says what is wrong
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	switch {
	case err == nil:
		_ = c.Close()
		return &AddrInUseError{Path: path, Reason: "another server answers on " + path}
	case errors.Is(err, syscall.ECONNREFUSED):
		_ = os.Remove(path)
	}
	return nil
}

// lockPath takes an exclusive flock on "<path>.lock", waiting up to bindLockWait for
// another server holding it; the returned function removes the lock file and releases it.
func lockPath(path string) (func(), error) {
	lock := path + ".lock"
	until := time.Now().Add(bindLockWait)
	for {
		f, err := tryLock(lock)
		if err != nil {
			return nil, err
		}
		if f != nil {
			return func() {
				// Removed while still locked, so a server that opened this file in between
				// sees that it is gone and tries again.
				_ = os.Remove(lock)
				_ = f.Close() // releases the lock
			}, nil
		}
		if time.Now().After(until) {
			return nil, &AddrInUseError{Path: path, Reason: fmt.Sprintf(
				"another server is binding %s (it holds %s for more than %v)", path, lock, bindLockWait)}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tryLock is one attempt: nil while another process holds the lock.
func tryLock(lock string) (*os.File, error) {
	f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE, 0o600)
	if errors.Is(err, fs.ErrPermission) {
		f, err = os.Open(lock) // another user's lock file: flock needs no write access
	}
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, &os.PathError{Op: "flock", Path: lock, Err: err}
	}
	// The holder before us removes the file as it releases the lock: if it did so between
	// our open and our lock, we hold a lock on a file nobody else will open. Try again.
	mine, err1 := f.Stat()
	there, err2 := os.Lstat(lock)
	if err1 != nil || err2 != nil || !os.SameFile(mine, there) {
		_ = f.Close()
		return nil, nil
	}
	return f, nil
}
