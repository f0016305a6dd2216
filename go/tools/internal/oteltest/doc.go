// Package oteltest holds the tests of topspinotel (go/topspinotel, a module of its own).
// They serve and call the matrix service of this module (internal/matrix), so they live
// here rather than in topspinotel's module, which depends on nothing but the runtime and
// the OpenTelemetry API.
package oteltest
