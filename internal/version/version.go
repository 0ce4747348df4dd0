// Package version holds the build's identity, stamped by the Makefile and Dockerfile with -ldflags.
package version

// Version is the release of the binary (operator, consumer and migrations are one release).
var Version = "v0.0.0-dev"

// Commit is the source commit the binary was built from.
var Commit = "unknown"
