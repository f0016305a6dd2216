// Package readme holds the test of go/README.md's "Your own service": it follows the
// section's steps literally in a temporary module (see readme_test.go).
package readme
