// Package version holds the build's identity, stamped by the Makefile and Dockerfile with -ldflags.
package version

// Unstamped is the version of a build that no release stamped: one built from the source as it is.
const Unstamped = "v0.0.0-dev"

// Version is the release of the binary (operator, consumer and migrations are one release).
var Version = Unstamped

// Commit is the source commit the binary was built from.
var Commit = "unknown"
