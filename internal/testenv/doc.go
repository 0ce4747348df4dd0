// Package testenv provides the real parts that tests run against: a fresh PostgreSQL database per
// test package, an in-process Kafka cluster (kfake) and a Kubernetes API server (envtest) built
// from source. A missing part fails the run with a message that says how to provide it; nothing
// is skipped.
package testenv
